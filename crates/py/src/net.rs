//! The network probes: paced sender, timestamping receiver, echo server and request/response client (UDP and TCP), bulk streams.

use super::*;
use loopscope_probes::net::{bulk, recv as nrecv, rr, rr_tcp, schedule::Pattern, send as nsend, sock};

// ---- network probes ------------------------------------------------------------

pub(crate) fn pattern(name: &str, seed: u64, on_ns: u64, off_ns: u64, replay: Option<String>) -> PyResult<Pattern> {
    Ok(match name {
        "cbr" => Pattern::Cbr,
        "poisson" => Pattern::Poisson { seed },
        "onoff" => Pattern::OnOff { on_ns, off_ns },
        "replay" => {
            let p = replay.ok_or_else(|| InputError::new_err("the replay pattern needs a file"))?;
            Pattern::Replay { offsets: loopscope_probes::net::schedule::read_replay(p.as_ref()).map_err(py_err)? }
        }
        other => return Err(InputError::new_err(format!("pattern {other:?} is not one of cbr, poisson, onoff, replay:FILE"))),
    })
}

pub(crate) fn addr(a: &str) -> PyResult<std::net::SocketAddr> {
    sock::resolve(a).map_err(py_err)
}

/// Departure offsets (ns) of a schedule, for tests and tools.
#[pyfunction]
#[pyo3(signature = (pattern_name, pps_num, pps_den=1, count=None, duration_ns=None, seed=1, on_ns=0, off_ns=0, replay=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn net_schedule<'py>(
    py: Python<'py>,
    pattern_name: &str,
    pps_num: u128,
    pps_den: u128,
    count: Option<u64>,
    duration_ns: Option<u64>,
    seed: u64,
    on_ns: u64,
    off_ns: u64,
    replay: Option<String>,
) -> PyResult<Bound<'py, numpy::PyArray1<u64>>> {
    let p = pattern(pattern_name, seed, on_ns, off_ns, replay)?;
    if count.is_none() && duration_ns.is_none() && !matches!(p, Pattern::Replay { .. }) {
        return Err(InputError::new_err("give a count or a duration"));
    }
    let v: Vec<u64> = loopscope_probes::net::schedule::Schedule::new(p, pps_num, pps_den.max(1), count, duration_ns).collect();
    Ok(v.into_pyarray(py))
}

pub(crate) fn hist_dict<'py>(py: Python<'py>, h: &loopscope_trace::hist::Snapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let (idx, cnt): (Vec<u32>, Vec<u64>) = h.buckets.iter().copied().unzip();
    d.set_item("idx", idx.into_pyarray(py))?;
    d.set_item("count", cnt.into_pyarray(py))?;
    d.set_item("under", h.under)?;
    d.set_item("over", h.over)?;
    d.set_item("sum", h.sum)?;
    d.set_item("min", h.min)?;
    d.set_item("max", h.max)?;
    Ok(d)
}

/// Paced UDP sender; returns a dict (see net/send.rs).
#[pyfunction]
#[pyo3(signature = (dest, size, pps_num, pps_den=1, pattern_name="cbr", count=None, duration_ns=None, workers=1, flow=1, tx_timestamps=true, records=true, seed=1, on_ns=0, off_ns=0, replay=None, cpus=vec![]))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn net_send<'py>(
    py: Python<'py>,
    dest: &str,
    size: usize,
    pps_num: u128,
    pps_den: u128,
    pattern_name: &str,
    count: Option<u64>,
    duration_ns: Option<u64>,
    workers: usize,
    flow: u32,
    tx_timestamps: bool,
    records: bool,
    seed: u64,
    on_ns: u64,
    off_ns: u64,
    replay: Option<String>,
    cpus: Vec<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = nsend::SendConfig {
        dest: addr(dest)?,
        size,
        pps_num,
        pps_den: pps_den.max(1),
        pattern: pattern(pattern_name, seed, on_ns, off_ns, replay)?,
        count,
        duration_ns,
        workers,
        flow,
        tx_timestamps,
        records,
        cpus,
    };
    nsend::open_sockets(&cfg).map_err(py_err)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-send", stop, move || nsend::run(&cfg, s2))?;
    let r = r.map_err(py_err)?;
    let d = PyDict::new(py);
    let ws = PyList::empty(py);
    for w in r.workers {
        let wd = PyDict::new(py);
        wd.set_item("sent", w.sent)?;
        wd.set_item("unsent", w.unsent)?;
        wd.set_item("errors", w.errors)?;
        wd.set_item("first_error", w.first_error)?;
        wd.set_item("batches", w.batches)?;
        wd.set_item("largest_batch", w.largest_batch)?;
        wd.set_item("tx_sched", w.tx_sched)?;
        wd.set_item("tx_sw", w.tx_sw)?;
        wd.set_item("dep_err_ns", w.dep_err_ns.into_pyarray(py))?;
        ws.append(wd)?;
    }
    d.set_item("workers", ws)?;
    d.set_item("scheduled_ns", r.scheduled_ns)?;
    d.set_item("elapsed_ns", r.elapsed_ns)?;
    d.set_item("realtime_offset_ns", r.realtime_offset_ns)?;
    d.set_item("interrupted", interrupted || r.interrupted)?;
    Ok(d)
}

/// Receiver; binds first (errors as InputError), then runs; returns a dict.
#[pyfunction]
#[pyo3(signature = (bind, duration_ns=None, idle_ns=None, count=None, records=true, rcvbuf=33554432, max_size=65536))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn net_recv<'py>(
    py: Python<'py>,
    bind: &str,
    duration_ns: Option<u64>,
    idle_ns: Option<u64>,
    count: Option<u64>,
    records: bool,
    rcvbuf: usize,
    max_size: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = nrecv::RecvConfig { bind: addr(bind)?, duration_ns, idle_ns, count, records, rcvbuf, max_size };
    let sock = nrecv::bind(&cfg).map_err(py_err)?;
    let bound = sock.local.to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-recv", stop, move || nrecv::run_on(sock, &cfg, s2))?;
    let d = PyDict::new(py);
    d.set_item("bound", bound)?;
    d.set_item("packets", r.packets)?;
    d.set_item("bytes", r.bytes)?;
    d.set_item("malformed", r.malformed)?;
    d.set_item("truncated", r.truncated)?;
    d.set_item("no_kernel_ts", r.no_kernel_ts)?;
    d.set_item("hw_ts", r.hw_ts)?;
    d.set_item("batches", r.batches)?;
    d.set_item("sockbuf_drops", r.sockbuf_drops)?;
    let fl = PyList::empty(py);
    for (id, f) in &r.flows {
        let fd = PyDict::new(py);
        fd.set_item("flow", id)?;
        fd.set_item("first_seq", f.first_seq)?;
        fd.set_item("max_seq", f.max_seq)?;
        fd.set_item("received", f.received)?;
        fd.set_item("unique", f.unique)?;
        fd.set_item("duplicates", f.duplicates)?;
        fd.set_item("reordered", f.reordered)?;
        fd.set_item("beyond_window", f.beyond_window)?;
        fd.set_item("lost", f.lost())?;
        fl.append(fd)?;
    }
    d.set_item("flows", fl)?;
    let (pk, by): (Vec<u64>, Vec<u64>) = r.per_second.iter().copied().unzip();
    d.set_item("per_second_packets", pk.into_pyarray(py))?;
    d.set_item("per_second_bytes", by.into_pyarray(py))?;
    d.set_item("first_krx", r.first_krx)?;
    d.set_item("last_krx", r.last_krx)?;
    d.set_item("first_urx", r.first_urx)?;
    d.set_item("last_urx", r.last_urx)?;
    d.set_item("owd", hist_dict(py, &r.owd)?)?;
    d.set_item("stack_net", hist_dict(py, &r.stack_net)?)?;
    d.set_item("end_host", hist_dict(py, &r.end_host)?)?;
    d.set_item("interarrival", hist_dict(py, &r.interarrival)?)?;
    d.set_item("hist_scale", serde_json::to_string(&r.hist_scale).unwrap_or_default())?;
    d.set_item("interarrival_n", r.interarrival_n)?;
    d.set_item("interarrival_sum", r.interarrival_sum)?;
    d.set_item("interarrival_sumsq", r.interarrival_sumsq)?;
    d.set_item("elapsed_ns", r.elapsed_ns)?;
    d.set_item("interrupted", interrupted || r.interrupted)?;
    Ok(d)
}

/// Echo server for stimulus-response; returns counts when stopped.
#[pyfunction]
#[pyo3(signature = (bind, duration_ns=None, tcp=false, ready_fd=None))]
pub(crate) fn net_echo<'py>(py: Python<'py>, bind: &str, duration_ns: Option<u64>, tcp: bool, ready_fd: Option<i32>) -> PyResult<Bound<'py, PyDict>> {
    let a = addr(bind)?;
    if tcp {
        let l = bulk::tcp_listen(&a).map_err(py_err)?;
        pipe::ready(ready_fd);
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let (r, interrupted) = run_interruptible(py, "ls-echo", stop, move || rr_tcp::echo(l, duration_ns, s2))?;
        return echo_dict(py, &r, interrupted);
    }
    let s = sock::Udp::bind(&a, 4 << 20).map_err(py_err)?;
    s.enable_rx_timestamps().map_err(py_err)?;
    s.set_read_timeout_ms(50);
    pipe::ready(ready_fd);
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-echo", stop, move || rr::echo(s, duration_ns, s2))?;
    echo_dict(py, &r, interrupted)
}

pub(crate) fn echo_dict<'py>(py: Python<'py>, r: &rr::EchoResult, interrupted: bool) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("requests", r.requests)?;
    d.set_item("malformed", r.malformed)?;
    d.set_item("send_errors", r.send_errors)?;
    d.set_item("elapsed_ns", r.elapsed_ns)?;
    d.set_item("tids", r.tids.clone())?;
    d.set_item("interrupted", interrupted)?;
    Ok(d)
}

/// Stimulus-response client; returns per-exchange arrays.
#[pyfunction]
#[pyo3(signature = (dest, pps_num, duration_ns, pps_den=1, pattern_name="cbr", size=64, flow=1, grace_ns=200_000_000, records=true, seed=1, on_ns=0, off_ns=0, tcp=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn net_rr<'py>(
    py: Python<'py>,
    dest: &str,
    pps_num: u128,
    duration_ns: u64,
    pps_den: u128,
    pattern_name: &str,
    size: usize,
    flow: u32,
    grace_ns: u64,
    records: bool,
    seed: u64,
    on_ns: u64,
    off_ns: u64,
    tcp: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = rr::RrConfig {
        dest: addr(dest)?,
        pps_num,
        pps_den: pps_den.max(1),
        pattern: pattern(pattern_name, seed, on_ns, off_ns, None)?,
        duration_ns,
        size,
        flow,
        grace_ns,
        records,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-rr", stop, move || if tcp { rr_tcp::client(&cfg, s2) } else { rr::client(&cfg, s2) })?;
    let r = r.map_err(py_err)?;
    let d = PyDict::new(py);
    d.set_item("sent", r.sent)?;
    d.set_item("send_errors", r.send_errors)?;
    d.set_item("malformed", r.malformed)?;
    d.set_item("duplicates", r.duplicates)?;
    d.set_item("elapsed_ns", r.elapsed_ns)?;
    d.set_item("interrupted", interrupted || r.interrupted)?;
    let col = |f: fn(&rr::Exchange) -> i64| r.exchanges.iter().map(f).collect::<Vec<i64>>();
    d.set_item("seq", col(|x| x.seq as i64).into_pyarray(py))?;
    d.set_item("sent_ns", col(|x| x.sent).into_pyarray(py))?;
    d.set_item("srv_krx_ns", col(|x| x.srv_krx).into_pyarray(py))?;
    d.set_item("srv_urx_ns", col(|x| x.srv_urx).into_pyarray(py))?;
    d.set_item("srv_utx_ns", col(|x| x.srv_utx).into_pyarray(py))?;
    d.set_item("krx_ns", col(|x| x.krx).into_pyarray(py))?;
    d.set_item("urx_ns", col(|x| x.urx).into_pyarray(py))?;
    Ok(d)
}

/// TCP bulk sender: (bytes, elapsed_ns, error).
#[pyfunction]
#[pyo3(signature = (dest, duration_ns, rate_bps=None, size=65536))]
pub(crate) fn net_bulk_tcp(py: Python<'_>, dest: &str, duration_ns: u64, rate_bps: Option<f64>, size: usize) -> PyResult<(u64, u64, Option<String>)> {
    let a = addr(dest)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, _) = run_interruptible(py, "ls-bulk-send", stop, move || bulk::tcp_send(&a, rate_bps, size, duration_ns, s2))?;
    let r = r.map_err(py_err)?;
    Ok((r.bytes, r.elapsed_ns, r.error))
}

/// TCP sink: (bytes, connections) when stopped or after `duration_ns`.
#[pyfunction]
#[pyo3(signature = (bind, duration_ns=None))]
pub(crate) fn net_sink_tcp(py: Python<'_>, bind: &str, duration_ns: Option<u64>) -> PyResult<(u64, u64)> {
    let a = addr(bind)?;
    let l = bulk::tcp_listen(&a).map_err(py_err)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, _) = run_interruptible(py, "ls-bulk-sink", stop, move || bulk::tcp_sink(l, duration_ns, s2))?;
    Ok(r)
}

pub(crate) fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(net_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(net_send, m)?)?;
    m.add_function(wrap_pyfunction!(net_recv, m)?)?;
    m.add_function(wrap_pyfunction!(net_echo, m)?)?;
    m.add_function(wrap_pyfunction!(net_rr, m)?)?;
    m.add_function(wrap_pyfunction!(net_bulk_tcp, m)?)?;
    m.add_function(wrap_pyfunction!(net_sink_tcp, m)?)?;
    Ok(())
}
