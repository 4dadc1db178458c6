//! What the logging threads, the session and its writer share: the session
//! slot (one open session per process), its shared state, each logging
//! thread's rings as the writer sees them, and the epoch that makes buffers
//! of a closed session stale. The hot path (`local`), the session's life
//! cycle (`session`) and the writer (`writer`) each depend on this module
//! and on nothing of each other but the session starting its writer.

use crate::buffer::Ring;
use crate::config::Config;
use crate::format::{self, End};
use crate::Error;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};

/// Bumped at every open and close; buffers of another epoch are stale.
pub(crate) static EPOCH: AtomicU64 = AtomicU64::new(1);

/// What the writer sees of a logging thread.
pub(crate) struct ThreadShared {
    pub index: u32,
    pub tid: u32,
    pub name: String,
    /// One ring per stream of the session, in stream order.
    pub rings: Vec<Ring>,
    pub exited: AtomicBool,
}

pub(crate) struct PendingTrigger {
    pub stream: u16,
    pub tag: u32,
    pub raw: u64,
}

/// State shared between the logging threads, the API and the writer.
pub(crate) struct Shared {
    pub epoch: u64,
    pub path: PathBuf,
    pub config: Config,
    /// Threads attached since the writer last looked (it takes them over).
    pub threads: Mutex<Vec<Arc<ThreadShared>>>,
    pub next_thread: std::sync::atomic::AtomicU32,
    pub stop: AtomicBool,
    pub writer: OnceLock<Thread>,
    pub triggers: Mutex<Vec<PendingTrigger>>,
    pub changes: Mutex<Vec<format::ConfigChange>>,
    /// Records that could not be buffered at all (thread exiting, wrong kind).
    pub lost_unattached: AtomicU64,
    pub flush_req: AtomicU64,
    pub flush_done: Mutex<u64>,
    pub flush_cv: Condvar,
    pub bytes_written: AtomicU64,
    /// The writer thread's kernel id once it runs (0 before): `close` lifts
    /// it out of SCHED_IDLE and its CPU confinement so that it can finish.
    pub writer_tid: std::sync::atomic::AtomicI32,
}

impl Shared {
    pub fn add_thread(&self, make: impl FnOnce(u32) -> ThreadShared) -> Arc<ThreadShared> {
        let index = self.next_thread.fetch_add(1, Ordering::Relaxed);
        let t = Arc::new(make(index));
        self.threads.lock().unwrap_or_else(|e| e.into_inner()).push(t.clone());
        t
    }

    pub fn wake_writer(&self) {
        if let Some(t) = self.writer.get() {
            t.unpark();
        }
    }

    pub fn stream_id(&self, name: &str) -> Result<u16, Error> {
        self.config.streams.iter().position(|s| s.name == name).map(|i| i as u16).ok_or_else(|| {
            let names: Vec<_> = self.config.streams.iter().map(|s| s.name.as_str()).collect();
            Error::input(format!("no stream named {name:?}; this session has {}", names.join(", ")))
        })
    }
}

pub(crate) struct Session {
    pub shared: Arc<Shared>,
    pub writer: JoinHandle<End>,
}

static SESSION: Mutex<Option<Session>> = Mutex::new(None);

pub(crate) fn session() -> std::sync::MutexGuard<'static, Option<Session>> {
    SESSION.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn current() -> Option<Arc<Shared>> {
    session().as_ref().map(|s| s.shared.clone())
}
