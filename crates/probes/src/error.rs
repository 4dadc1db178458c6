//! What can go wrong in a probe, as a type: the binding turns it into
//! `InputError` (the caller's setting, address or file: exit 2) or
//! `RunError` (the run failed: exit 1) by `is_input`, never by reading the
//! message.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A setting or file of the caller's that cannot work (a size, a rate, a
    /// system call the probe does not know, a replay file).
    #[error("{0}")]
    Input(String),
    /// An address that cannot be used from this host: not resolved, not
    /// bindable, nothing answering there; `why` says what to do.
    #[error("{addr}: {why}")]
    Address { addr: String, why: String },
    /// A system call failed while setting up or running.
    #[error("{what}: {source}")]
    Os { what: String, source: io::Error },
}

impl ProbeError {
    /// Whether the caller's input is at fault (exit 2) rather than the run (exit 1).
    pub fn is_input(&self) -> bool {
        matches!(self, ProbeError::Input(_) | ProbeError::Address { .. })
    }

    /// The last OS error, for a call described by `what`.
    pub fn last_os(what: impl Into<String>) -> ProbeError {
        ProbeError::Os { what: what.into(), source: io::Error::last_os_error() }
    }

    /// `map_err` for an I/O error of a call described by `what`.
    pub fn os(what: impl Into<String>) -> impl FnOnce(io::Error) -> ProbeError {
        let what = what.into();
        move |source| ProbeError::Os { what, source }
    }

    pub fn address(addr: impl ToString, why: impl Into<String>) -> ProbeError {
        ProbeError::Address { addr: addr.to_string(), why: why.into() }
    }
}

pub type Result<T> = std::result::Result<T, ProbeError>;
