//! What can go wrong in a load worker, as a type: the binding turns it into
//! `RunError` (a failed run, exit 1) or `InputError` (exit 2) by
//! `is_input`, never by reading the message.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A setting no load can run with (a rate of zero).
    #[error("{0}")]
    Input(String),
    /// A file or directory the load works in could not be used.
    #[error("{}: {what}: {source}", path.display())]
    File { path: PathBuf, what: &'static str, source: io::Error },
    /// A socket of a network load: binding, connecting, sending.
    #[error("{what}: {source}")]
    Socket { what: String, source: io::Error },
    /// The process that started the worker was gone before it began.
    #[error("the parent process exited before the load started")]
    Orphaned,
}

impl LoadError {
    /// Whether the caller's input is at fault (exit 2) rather than the run (exit 1).
    pub fn is_input(&self) -> bool {
        matches!(self, LoadError::Input(_))
    }

    pub(crate) fn file(path: &std::path::Path, what: &'static str) -> impl FnOnce(io::Error) -> LoadError {
        let path = path.to_path_buf();
        move |source| LoadError::File { path, what, source }
    }

    pub(crate) fn socket(what: impl Into<String>) -> impl FnOnce(io::Error) -> LoadError {
        let what = what.into();
        move |source| LoadError::Socket { what, source }
    }
}

pub type Result<T> = std::result::Result<T, LoadError>;
