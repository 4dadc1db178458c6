//! What can go wrong setting up or using the channels' network side, as a
//! type: the binding turns it into `InputError` (exit 2) or `RunError`
//! (exit 1) by `is_input`, never by reading the message.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The caller's input: an unknown transport, a channel that cannot be
    /// made as asked, an address to listen on that cannot be had.
    #[error("{0}")]
    Input(String),
    /// The other end (a hub, a peer) refused, did not answer in time, or
    /// answered with something that is not a channel frame.
    #[error("{0}")]
    Peer(String),
    /// A system call failed.
    #[error("{what}: {source}")]
    Os { what: String, source: io::Error },
    /// A channel's own refusal (closed, full, timed out).
    #[error(transparent)]
    Chan(#[from] crate::ChanError),
}

impl NetError {
    /// Whether the caller's input is at fault (exit 2) rather than the run (exit 1).
    pub fn is_input(&self) -> bool {
        matches!(self, NetError::Input(_))
    }

    /// `map_err` for an I/O error of a call described by `what`.
    pub fn os(what: impl Into<String>) -> impl FnOnce(io::Error) -> NetError {
        let what = what.into();
        move |source| NetError::Os { what, source }
    }
}

pub type Result<T> = std::result::Result<T, NetError>;
