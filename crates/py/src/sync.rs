//! The clock-sync probes (crates/probes/src/net/sync.rs) from Python.
//!
//! The responder binds, writes `ready` to `ready_fd` and answers until
//! Ctrl-C/SIGTERM; the initiator sends pairs for a duration or until
//! stopped. Both run with the interpreter lock released.

use super::{addr, py_err, run_interruptible, InputError};
use loopscope_probes::net::sync;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Clock-sync responder: answer every probe, record kernel stamps; until stopped.
#[pyfunction]
#[pyo3(signature = (bind, ready_fd=None))]
pub fn sync_serve<'py>(py: Python<'py>, bind: &str, ready_fd: Option<i32>) -> PyResult<Bound<'py, PyDict>> {
    let b = addr(bind)?;
    let sock = sync::bind(&b).map_err(py_err)?;
    if let Some(fd) = ready_fd {
        let msg = b"ready\n";
        unsafe { libc::write(fd, msg.as_ptr() as *const libc::c_void, msg.len()) };
    }
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-sync-serve", stop, move || sync::serve(sock, s2))?;
    let o = PyDict::new(py);
    o.set_item("received", r.received)?;
    o.set_item("answered", r.answered)?;
    o.set_item("malformed", r.malformed)?;
    o.set_item("send_errors", r.send_errors)?;
    o.set_item("no_tx_stamp", r.no_tx_stamp)?;
    o.set_item("no_rx_stamp", r.no_rx_stamp)?;
    o.set_item("elapsed_ns", r.elapsed_ns)?;
    o.set_item("interrupted", interrupted)?;
    Ok(o)
}

/// Clock-sync initiator: coded probe pairs to the reference's responder.
#[pyfunction]
#[pyo3(signature = (dest, flow, rate, gap_ns, duration_ns=None, grace_ns=200_000_000))]
pub fn sync_probe<'py>(
    py: Python<'py>,
    dest: &str,
    flow: u32,
    rate: f64,
    gap_ns: i64,
    duration_ns: Option<u64>,
    grace_ns: i64,
) -> PyResult<Bound<'py, PyDict>> {
    let d = addr(dest)?;
    if gap_ns < 0 || gap_ns > 100_000_000 {
        return Err(InputError::new_err(format!("gap {gap_ns} ns: must be between 0 and 100 ms")));
    }
    let cfg = sync::SyncConfig { dest: d, flow, rate, gap_ns, duration_ns, grace_ns };
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-sync", stop, move || sync::initiate(&cfg, s2))?;
    let r = r.map_err(py_err)?;
    let o = PyDict::new(py);
    o.set_item("pairs", r.pairs)?;
    o.set_item("sent", r.sent)?;
    o.set_item("answered", r.answered)?;
    o.set_item("lost", r.lost)?;
    o.set_item("send_errors", r.send_errors)?;
    o.set_item("no_tx_stamp", r.no_tx_stamp)?;
    o.set_item("malformed", r.malformed)?;
    o.set_item("min_rtt_ns", r.min_rtt_ns)?;
    o.set_item("elapsed_ns", r.elapsed_ns)?;
    o.set_item("interrupted", interrupted || r.interrupted)?;
    Ok(o)
}
