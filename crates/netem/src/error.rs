//! What can go wrong in the link emulator, as a type: the binding turns it
//! into `InputError` (exit 2) or `RunError` (exit 1) by `is_input`.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum NetemError {
    /// A configuration the emulator cannot take: an unknown distribution,
    /// link ends that are not two of its ports, ports that do not match.
    #[error("{0}")]
    Config(String),
    /// No interface of that name where the emulator runs.
    #[error("no interface {0} in this network namespace")]
    NoInterface(String),
    /// A system call on a router interface failed.
    #[error("{what} {iface}: {source}")]
    Os { what: &'static str, iface: String, source: io::Error },
    /// A part the emulator can do without (a socket filter, the PACKET_MMAP
    /// rings) was refused; said in its results, never fatal.
    #[error("{what}: {source}")]
    Refused { what: String, source: io::Error },
}

impl NetemError {
    /// Whether the caller's input is at fault (exit 2) rather than the run (exit 1).
    pub fn is_input(&self) -> bool {
        matches!(self, NetemError::Config(_) | NetemError::NoInterface(_))
    }

    pub(crate) fn os(what: &'static str, iface: &str) -> NetemError {
        NetemError::Os { what, iface: iface.to_string(), source: io::Error::last_os_error() }
    }

    pub(crate) fn refused(what: impl Into<String>) -> NetemError {
        NetemError::Refused { what: what.into(), source: io::Error::last_os_error() }
    }
}

pub type Result<T> = std::result::Result<T, NetemError>;
