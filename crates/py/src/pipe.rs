//! The pipeline roles (crates/probes/src/net/pipe.rs) from Python.
//!
//! Node and sink bind first and then write `ready` to `ready_fd`, so the lab
//! starts the source only once every stage is listening; all three run with
//! the interpreter lock released and stop on Ctrl-C/SIGTERM.

use super::{addr, hist_dict, py_err, run_interruptible, InputError};
use loopscope_probes::net::pipe;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub(crate) fn ready(fd: Option<i32>) {
    if let Some(fd) = fd {
        let msg = b"ready\n";
        unsafe { libc::write(fd, msg.as_ptr() as *const libc::c_void, msg.len()) };
    }
}

/// Pipeline source: paced messages to the first stage; then, unless
/// stopped, `linger_ns` asleep in the sending thread while the last
/// messages travel (nothing of the source's process runs meanwhile: its
/// results and exit would compete with the stages carrying them).
#[pyfunction]
#[pyo3(signature = (dest, flow, pps_num, pps_den, size, count=None, duration_ns=None, linger_ns=0))]
#[allow(clippy::too_many_arguments)]
pub fn pipe_source<'py>(
    py: Python<'py>,
    dest: &str,
    flow: u32,
    pps_num: u128,
    pps_den: u128,
    size: usize,
    count: Option<u64>,
    duration_ns: Option<u64>,
    linger_ns: u64,
) -> PyResult<Bound<'py, PyDict>> {
    if count.is_none() && duration_ns.is_none() {
        return Err(InputError::new_err("give a count or a duration"));
    }
    let d = addr(dest)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-pipe-source", stop, move || {
        let r = pipe::source(&d, flow, pps_num, pps_den, size, count, duration_ns, s2);
        if matches!(&r, Ok(x) if !x.interrupted) && linger_ns > 0 {
            std::thread::sleep(std::time::Duration::from_nanos(linger_ns));
        }
        r
    })?;
    let r = r.map_err(py_err)?;
    let o = PyDict::new(py);
    o.set_item("sent", r.sent)?;
    o.set_item("send_errors", r.send_errors)?;
    o.set_item("late", hist_dict(py, &r.late)?)?;
    o.set_item("hist_scale", serde_json::to_string(&r.hist_scale).unwrap_or_default())?;
    o.set_item("elapsed_ns", r.elapsed_ns)?;
    o.set_item("interrupted", interrupted || r.interrupted)?;
    Ok(o)
}

/// Pipeline node: receive, work, append stamps, forward; until stopped.
#[pyfunction]
#[pyo3(signature = (bind, next, work_ns=0, ready_fd=None))]
pub fn pipe_node<'py>(py: Python<'py>, bind: &str, next: &str, work_ns: i64, ready_fd: Option<i32>) -> PyResult<Bound<'py, PyDict>> {
    let b = addr(bind)?;
    let n = addr(next)?;
    let sock = pipe::bind(&b).map_err(py_err)?;
    ready(ready_fd);
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-pipe-node", stop, move || pipe::node(sock, &n, work_ns, s2))?;
    let r = r.map_err(py_err)?;
    let o = PyDict::new(py);
    o.set_item("received", r.received)?;
    o.set_item("forwarded", r.forwarded)?;
    o.set_item("malformed", r.malformed)?;
    o.set_item("full", r.full)?;
    o.set_item("send_errors", r.send_errors)?;
    o.set_item("no_kernel_ts", r.no_kernel_ts)?;
    o.set_item("residence", hist_dict(py, &r.residence)?)?;
    o.set_item("hist_scale", serde_json::to_string(&r.hist_scale).unwrap_or_default())?;
    o.set_item("elapsed_ns", r.elapsed_ns)?;
    o.set_item("interrupted", interrupted)?;
    Ok(o)
}

/// Pipeline sink: one trace record per message; until stopped.
#[pyfunction]
#[pyo3(signature = (bind, flow, ready_fd=None))]
pub fn pipe_sink<'py>(py: Python<'py>, bind: &str, flow: u32, ready_fd: Option<i32>) -> PyResult<Bound<'py, PyDict>> {
    let b = addr(bind)?;
    let sock = pipe::bind(&b).map_err(py_err)?;
    ready(ready_fd);
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-pipe-sink", stop, move || pipe::sink(sock, flow, s2))?;
    let o = PyDict::new(py);
    o.set_item("received", r.received)?;
    o.set_item("unique", r.unique)?;
    o.set_item("lost", r.lost)?;
    o.set_item("duplicates", r.duplicates)?;
    o.set_item("reordered", r.reordered)?;
    o.set_item("malformed", r.malformed)?;
    o.set_item("truncated", r.truncated)?;
    o.set_item("no_kernel_ts", r.no_kernel_ts)?;
    o.set_item("first_seq", r.first_seq)?;
    o.set_item("max_seq", r.max_seq)?;
    o.set_item("hops_seen", r.hops_seen)?;
    o.set_item("end_to_end", hist_dict(py, &r.end_to_end)?)?;
    o.set_item("hist_scale", serde_json::to_string(&r.hist_scale).unwrap_or_default())?;
    o.set_item("elapsed_ns", r.elapsed_ns)?;
    o.set_item("interrupted", interrupted)?;
    Ok(o)
}
