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

mod bench;
mod chan;
mod emu;
mod ktrace;
mod net;
mod pipe;
mod probes;
mod sync;
mod trace;

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
    if e.input {
        InputError::new_err(e.msg)
    } else {
        RunError::new_err(e.msg)
    }
}

pub(crate) use net::{addr, hist_dict};

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

/// On Ctrl-C `stop` is set and the function's (partial) result still returned,
/// with the second element true.
/// Run ``f`` on a thread named ``name`` (kernel attribution names threads by
/// it: "ls-pipe-node" says more than a generic name) with the interpreter
/// lock released, turning Ctrl-C into ``stop``.
pub(crate) fn run_interruptible<T: Send + 'static>(
    py: Python<'_>,
    name: &str,
    stop: Arc<AtomicBool>,
    f: impl FnOnce() -> T + Send + 'static,
) -> PyResult<(T, bool)> {
    let slot: Arc<(std::sync::Mutex<Option<T>>, std::sync::Condvar)> = Arc::new(Default::default());
    let s2 = slot.clone();
    let h = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let v = f();
            *s2.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
            s2.1.notify_all();
        })
        .map_err(|e| RunError::new_err(format!("cannot start the probe thread: {e}")))?;
    let mut interrupted = false;
    loop {
        let got = py.detach(|| {
            let g = slot.0.lock().unwrap_or_else(|e| e.into_inner());
            let (mut g, _) = slot
                .1
                .wait_timeout_while(g, Duration::from_millis(100), |v| v.is_none())
                .unwrap_or_else(|e| e.into_inner());
            g.take()
        });
        if let Some(v) = got {
            let _ = h.join();
            return Ok((v, interrupted));
        }
        if h.is_finished() {
            if let Some(v) = slot.0.lock().unwrap_or_else(|e| e.into_inner()).take() {
                return Ok((v, interrupted));
            }
            return Err(RunError::new_err("the probe thread died without a result"));
        }
        if !interrupted && py.check_signals().is_err() {
            interrupted = true;
            stop.store(true, Ordering::Relaxed);
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
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
    m.add_function(wrap_pyfunction!(ktrace::ktrace_read, m)?)?;
    m.add_class::<ktrace::KtraceDecoder>()?;
    m.add_function(wrap_pyfunction!(ktrace::ktrace_attribute, m)?)?;
    m.add_function(wrap_pyfunction!(ktrace::ktrace_task_label, m)?)?;
    m.add_function(wrap_pyfunction!(pipe::pipe_source, m)?)?;
    m.add_function(wrap_pyfunction!(pipe::pipe_node, m)?)?;
    m.add_function(wrap_pyfunction!(pipe::pipe_sink, m)?)?;
    m.add_function(wrap_pyfunction!(sync::sync_serve, m)?)?;
    m.add_function(wrap_pyfunction!(sync::sync_probe, m)?)?;
    Ok(())
}
