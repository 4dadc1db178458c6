//! `loopscope._native`: the Rust core as seen from Python.
//!
//! Thin by design: entities and sessions map one to one onto the trace
//! crate; `read_trace` returns the reader's column vectors as numpy arrays
//! that own the Rust memory (no copy, no per-record Python object); probes
//! and benchmarks run with the interpreter lock released and poll for Ctrl-C
//! every 100 ms so a long run can be stopped. Errors are raised as
//! `loopscope.errors.InputError` (the caller's input is wrong: exit code 2)
//! or `RunError` (exit code 1). `python/loopscope/_native.pyi` declares all of it and a
//! test checks the declaration against the module.
//!
//! One file per domain: `trace.rs` (entities, sessions, reading traces),
//! `probes.rs` (timer, sched, syscall, load workers), `net.rs` (network
//! probes), `pipe.rs` (pipeline stages), `sync.rs` (clock-sync probes),
//! `emu.rs` (the link emulator), `chan.rs` (channels), `ktrace.rs` (kernel
//! trace pages), `bench.rs` (the benchmarks' loops). This file holds what they
//! share: the exceptions, `run_interruptible`, and the module's table.

mod attrcols;
mod attribute;
mod bench;
mod boot;
mod chan;
mod emu;
mod ktrace;
mod net;
mod pipe;
mod probes;
mod segment;
mod strtable;
mod sync;
mod threadsum;
mod trace;
mod tracepipe;

use loopscope_probes::timer;
use loopscope_trace::config::{Config, StreamConfig, StreamKind};
use loopscope_trace::hist::Scale;
use loopscope_trace::reader::{self, Options};
use loopscope_trace::{clock, format, register, session, Entity, Kind};
use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// The exception classes are defined in Python (loopscope/errors.py) so that
// the whole package shares one hierarchy with its exit codes.
pyo3::import_exception!(loopscope.errors, InputError);
pyo3::import_exception!(loopscope.errors, RunError);

fn err(e: loopscope_trace::Error) -> PyErr {
    py_err(e)
}

pub(crate) use net::{addr, hist_dict};

/// A crate's typed error as the exception its class calls for: the
/// caller's input (`InputError`, exit 2) or the run (`RunError`, exit 1).
pub(crate) trait Classified: std::fmt::Display {
    fn is_input(&self) -> bool;
}

impl Classified for loopscope_probes::error::ProbeError {
    fn is_input(&self) -> bool {
        loopscope_probes::error::ProbeError::is_input(self)
    }
}

impl Classified for loopscope_trace::Error {
    fn is_input(&self) -> bool {
        loopscope_trace::Error::is_input(self)
    }
}

impl Classified for loopscope_netem::NetemError {
    fn is_input(&self) -> bool {
        loopscope_netem::NetemError::is_input(self)
    }
}

impl Classified for loopscope_channels::NetError {
    fn is_input(&self) -> bool {
        loopscope_channels::NetError::is_input(self)
    }
}

impl Classified for loopscope_loads::LoadError {
    fn is_input(&self) -> bool {
        loopscope_loads::LoadError::is_input(self)
    }
}

pub(crate) fn py_err<E: Classified>(e: E) -> PyErr {
    if e.is_input() {
        InputError::new_err(e.to_string())
    } else {
        RunError::new_err(e.to_string())
    }
}

/// Run `f` with the interpreter lock released, then raise from this very
/// call what a signal that came meanwhile asks for (Ctrl-C: KeyboardInterrupt),
/// so the caller's `try`/`finally` sees it at the call and not at some later
/// bytecode. Every native function that releases the lock goes through here
/// (or through `run_interruptible`, which also stops the work).
pub(crate) fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> PyResult<T> {
    let v = py.detach(f);
    py.check_signals()?;
    Ok(v)
}

/// Run ``f`` on a thread named ``name`` (kernel attribution names threads by
/// it: "ls-pipe-node" says more than a generic name) with the interpreter
/// lock released, turning Ctrl-C (any signal Python's handlers raise for)
/// into ``stop``; the function's (partial) result is still returned, with
/// the second element true.
///
/// The calling thread sleeps until the work ends or a signal comes, never
/// on a timer: it is a probe's main thread, and every wake-up of it would be
/// loopscope inside some other probe's window (it woke every 100 ms once, a
/// few tenths of a percent of a busy pipeline's outlier time). It waits in
/// `ppoll` on an eventfd the worker writes when done, with every signal
/// blocked except inside `ppoll` (the `pselect` pattern), so a signal that
/// comes between Python's check and the wait still ends the wait. Process
/// signals reach this thread: the kernel gives them to the main thread first
/// when it does not block them.
pub(crate) fn run_interruptible<T: Send + 'static>(
    py: Python<'_>,
    name: &str,
    stop: Arc<AtomicBool>,
    f: impl FnOnce() -> T + Send + 'static,
) -> PyResult<(T, bool)> {
    let done = Arc::new(Done::new().map_err(|e| RunError::new_err(format!("cannot make the probe's wake-up file: {e}")))?);
    let slot: Arc<std::sync::Mutex<Option<T>>> = Arc::new(Default::default());
    let (s2, d2) = (slot.clone(), done.clone());
    let h = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let v = f();
            *s2.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
            d2.set();
        })
        .map_err(|e| RunError::new_err(format!("cannot start the probe thread: {e}")))?;
    let mut interrupted = false;
    loop {
        let mask = SignalsBlocked::new();
        if !interrupted && py.check_signals().is_err() {
            interrupted = true;
            stop.store(true, Ordering::Relaxed);
        }
        let finished = py.detach(|| done.wait(&mask));
        drop(mask);
        if finished || h.is_finished() {
            let _ = h.join();
            return match slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                Some(v) => Ok((v, interrupted)),
                None => Err(RunError::new_err("the probe thread died without a result")),
            };
        }
    }
}

/// An eventfd the worker writes when it is done.
struct Done(std::os::fd::OwnedFd);

impl Done {
    fn new() -> std::io::Result<Done> {
        use std::os::fd::FromRawFd;
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is ours and open.
        Ok(Done(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    fn set(&self) {
        use std::os::fd::AsRawFd;
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }

    /// Wait until the worker is done (true) or a signal came (false), the
    /// signals unblocked only while waiting.
    fn wait(&self, mask: &SignalsBlocked) -> bool {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; `old` is the mask to wait with.
        let n = unsafe { libc::ppoll(&mut p, 1, std::ptr::null(), &mask.old) };
        n > 0
    }
}

/// Every signal blocked on this thread until dropped (the old mask kept for `ppoll`).
struct SignalsBlocked {
    old: libc::sigset_t,
}

impl SignalsBlocked {
    fn new() -> SignalsBlocked {
        // SAFETY: sigset_t is plain data; the calls fill and apply it.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            SignalsBlocked { old }
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved at construction.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// A Ctrl-C that lands in Python the numpy crate runs (the first array a
/// call makes finds numpy's array API: numpy's own imports and version
/// check) fails that lookup, and the crate panics with the interrupt in its
/// message. The panic reaches Python as `PanicException`, which the CLI
/// takes for the interrupt it is (exit 130, one line); the default hook
/// would first print the panic and a backtrace. Every other panic is
/// printed as before.
fn quiet_interrupts() {
    let shown = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info.payload().downcast_ref::<String>().map(String::as_str).or_else(|| info.payload().downcast_ref::<&str>().copied());
        if !text.is_some_and(|t| t.contains("KeyboardInterrupt")) {
            shown(info);
        }
    }));
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    quiet_interrupts();
    trace::add_to(m)?;
    probes::add_to(m)?;
    net::add_to(m)?;
    bench::add_to(m)?;
    m.add_function(wrap_pyfunction!(emu::netem_run, m)?)?;
    m.add_class::<chan::PyHub>()?;
    m.add_class::<chan::PyChannel>()?;
    m.add_class::<chan::PyRemoteProducer>()?;
    m.add_class::<chan::PyRemoteConsumer>()?;
    m.add("ChannelTimeout", m.py().get_type::<chan::ChannelTimeout>())?;
    m.add_function(wrap_pyfunction!(chan::chan_bench_serve, m)?)?;
    m.add_function(wrap_pyfunction!(chan::chan_bench_client, m)?)?;
    m.add_function(wrap_pyfunction!(tracepipe::ktrace_read, m)?)?;
    m.add_function(wrap_pyfunction!(boot::boot_select, m)?)?;
    m.add_class::<ktrace::KtraceDecoder>()?;
    m.add_class::<ktrace::KtraceImport>()?;
    m.add_class::<segment::KtraceBatch>()?;
    m.add_class::<segment::KtraceSegments>()?;
    m.add("SEGMENT_GROUP", loopscope_ktrace::segment::GROUP)?;
    m.add("LATE_IRQ", loopscope_ktrace::attrib::LATE_IRQ)?;
    m.add_function(wrap_pyfunction!(attribute::ktrace_attribute, m)?)?;
    m.add_class::<strtable::StringTable>()?;
    m.add_class::<attrcols::FreedKept>()?;
    m.add_class::<ktrace::KtraceActivations>()?;
    m.add_function(wrap_pyfunction!(attribute::ktrace_task_label, m)?)?;
    m.add_function(wrap_pyfunction!(attribute::ktrace_cpu_pictures, m)?)?;
    m.add_function(wrap_pyfunction!(pipe::pipe_source, m)?)?;
    m.add_function(wrap_pyfunction!(pipe::pipe_node, m)?)?;
    m.add_function(wrap_pyfunction!(pipe::pipe_sink, m)?)?;
    m.add_function(wrap_pyfunction!(sync::sync_serve, m)?)?;
    m.add_function(wrap_pyfunction!(sync::sync_probe, m)?)?;
    Ok(())
}
