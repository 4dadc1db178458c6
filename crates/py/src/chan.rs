//! Channels (crates/channels) from Python: hubs, channels, remote producers
//! and consumers, and the ping-pong roles of `loopscope bench channels`.
//! Every call that can wait releases the interpreter lock and takes a
//! timeout. A signal that came meanwhile (Ctrl-C) is raised from the call
//! itself, before its own result: raised later, from the handler of a
//! timeout, a KeyboardInterrupt escaped every `except` and `finally` of
//! the program (seen with CPython 3.11).

use super::{addr, detached, py_err, run_interruptible, InputError, RunError};
use loopscope_channels::{raw, ChanError, Channel, Full, Hub, RemoteConsumer, RemoteProducer, Transport, Which};
use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pyo3::create_exception!(_native, ChannelTimeout, pyo3::exceptions::PyTimeoutError);

fn err(e: ChanError) -> PyErr {
    match e {
        ChanError::Timeout => ChannelTimeout::new_err("timed out"),
        ChanError::Duplicate(_) | ChanError::TooLarge { .. } | ChanError::NoConsumer(_) | ChanError::Gone(_) => InputError::new_err(e.to_string()),
        _ => RunError::new_err(e.to_string()),
    }
}

fn transport(s: &str) -> PyResult<Transport> {
    Transport::parse(s).map_err(py_err)
}

fn which(w: &str, ts: Option<u64>) -> PyResult<Which> {
    Ok(match (w, ts) {
        ("next", None) => Which::Next,
        ("latest", None) => Which::Latest,
        ("at", Some(t)) => Which::At(t),
        _ => return Err(InputError::new_err(format!("which={w:?}: expected 'next', 'latest' or 'at' with a timestamp"))),
    })
}

fn dur(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

fn stats_dict<'py>(py: Python<'py>, c: &Channel) -> PyResult<Bound<'py, PyDict>> {
    let s = c.stats();
    let d = PyDict::new(py);
    for (k, v) in [
        ("put", s.put),
        ("got", s.got),
        ("consumed", s.consumed),
        ("reclaimed", s.reclaimed),
        ("dropped_full", s.dropped_full),
        ("dropped_no_consumer", s.dropped_no_consumer),
        ("skipped", s.skipped),
        ("put_timeouts", s.put_timeouts),
        ("get_timeouts", s.get_timeouts),
        ("consumers_lost", s.consumers_lost),
        ("bytes_put", s.bytes_put),
    ] {
        d.set_item(k, v)?;
    }
    d.set_item("held", c.len())?;
    d.set_item("consumers", c.consumers())?;
    Ok(d)
}

#[pyclass(name = "ChannelCore", module = "loopscope._native")]
pub struct PyChannel {
    c: Arc<Channel>,
}

#[pymethods]
impl PyChannel {
    #[getter]
    fn name(&self) -> String {
        self.c.name.clone()
    }
    #[getter]
    fn capacity(&self) -> usize {
        self.c.capacity
    }
    #[pyo3(signature = (oldest=false))]
    fn attach(&self, oldest: bool) -> u32 {
        self.c.attach(oldest)
    }
    fn detach(&self, consumer: u32) {
        self.c.detach(consumer, false)
    }
    #[pyo3(signature = (ts, data, timeout=5.0))]
    fn put(&self, py: Python<'_>, ts: u64, data: Vec<u8>, timeout: f64) -> PyResult<()> {
        let c = self.c.clone();
        let r = detached(py, move || c.put(ts, data, dur(timeout)))?;
        r.map_err(err)
    }
    #[pyo3(signature = (consumer, which="next", ts=None, consume=false, timeout=5.0))]
    fn get<'py>(&self, py: Python<'py>, consumer: u32, which: &str, ts: Option<u64>, consume: bool, timeout: f64) -> PyResult<(u64, Bound<'py, PyBytes>)> {
        let w = self::which(which, ts)?;
        let c = self.c.clone();
        let r = detached(py, move || c.get(consumer, w, consume, dur(timeout)))?;
        let item = r.map_err(err)?;
        Ok((item.ts, PyBytes::new(py, &item.data)))
    }
    fn consume(&self, consumer: u32, ts: u64) -> bool {
        self.c.consume(consumer, ts)
    }
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.c)
    }
}

#[pyclass(name = "HubCore", module = "loopscope._native")]
pub struct PyHub {
    h: Hub,
}

#[pymethods]
impl PyHub {
    #[new]
    #[pyo3(signature = (frag=1400))]
    fn new(frag: usize) -> Self {
        PyHub { h: Hub::new(frag) }
    }
    fn listen(&self, bind: &str) -> PyResult<String> {
        self.h.listen(addr(bind)?).map(|a| a.to_string()).map_err(py_err)
    }
    #[pyo3(signature = (name, capacity=64, full="block", max_item=16 << 20))]
    fn create(&self, name: &str, capacity: usize, full: &str, max_item: usize) -> PyResult<PyChannel> {
        let f = match full {
            "block" => Full::Block,
            "drop-oldest" => Full::DropOldest,
            _ => return Err(InputError::new_err(format!("full={full:?}: expected 'block' or 'drop-oldest'"))),
        };
        Ok(PyChannel { c: self.h.create(name, capacity, f, max_item).map_err(py_err)? })
    }
    /// Move network input for at most `timeout` seconds (a hub nobody waits on).
    fn pump(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let h = self.h.clone();
        detached(py, move || h.pump(dur(timeout)).unwrap_or(false))
    }
    fn net_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.h.net_stats();
        let d = PyDict::new(py);
        for (k, v) in [
            ("items_in", s.items_in),
            ("bytes_in", s.bytes_in),
            ("datagrams_in", s.datagrams_in),
            ("incomplete", s.incomplete),
            ("missing", s.missing),
            ("refused", s.refused),
            ("malformed", s.malformed),
            ("conns_accepted", s.conns_accepted),
            ("conns_lost", s.conns_lost),
            ("send_errors", s.send_errors),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
    fn close(&self) {
        self.h.close()
    }
}

#[pyclass(name = "RemoteProducerCore", module = "loopscope._native")]
pub struct PyRemoteProducer {
    p: Mutex<RemoteProducer>,
}

#[pymethods]
impl PyRemoteProducer {
    #[new]
    #[pyo3(signature = (hub, name, transport="tcp", frag=1400, timeout=5.0))]
    fn new(py: Python<'_>, hub: &str, name: &str, transport: &str, frag: usize, timeout: f64) -> PyResult<Self> {
        let a = addr(hub)?;
        let t = self::transport(transport)?;
        let name = name.to_string();
        let p = detached(py, move || RemoteProducer::connect(a, &name, t, frag, dur(timeout)))?.map_err(py_err)?;
        Ok(PyRemoteProducer { p: Mutex::new(p) })
    }
    #[pyo3(signature = (ts, data, timeout=5.0))]
    fn put(&self, py: Python<'_>, ts: u64, data: Vec<u8>, timeout: f64) -> PyResult<()> {
        let r = detached(py, || self.p.lock().unwrap_or_else(|e| e.into_inner()).put(ts, &data, dur(timeout)))?;
        r.map_err(py_err)
    }
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let p = self.p.lock().unwrap_or_else(|e| e.into_inner());
        let d = PyDict::new(py);
        d.set_item("sent", p.sent)?;
        d.set_item("bytes", p.bytes)?;
        Ok(d)
    }
}

#[pyclass(name = "RemoteConsumerCore", module = "loopscope._native")]
pub struct PyRemoteConsumer {
    r: RemoteConsumer,
}

#[pymethods]
impl PyRemoteConsumer {
    #[new]
    #[pyo3(signature = (hub, name, transport="tcp", capacity=64, max_item=16 << 20, frag=1400, timeout=5.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, hub: &str, name: &str, transport: &str, capacity: usize, max_item: usize, frag: usize, timeout: f64) -> PyResult<Self> {
        let a = addr(hub)?;
        let t = self::transport(transport)?;
        let name = name.to_string();
        let r = detached(py, move || RemoteConsumer::attach(a, &name, t, capacity, max_item, frag, dur(timeout)))?.map_err(py_err)?;
        Ok(PyRemoteConsumer { r })
    }
    #[pyo3(signature = (which="next", ts=None, consume=false, timeout=5.0))]
    fn get<'py>(&self, py: Python<'py>, which: &str, ts: Option<u64>, consume: bool, timeout: f64) -> PyResult<(u64, Bound<'py, PyBytes>)> {
        let w = self::which(which, ts)?;
        let (m, cid) = (self.r.mirror.clone(), self.r.cid);
        let r = detached(py, move || m.get(cid, w, consume, dur(timeout)))?;
        let item = r.map_err(err)?;
        Ok((item.ts, PyBytes::new(py, &item.data)))
    }
    fn consume(&self, ts: u64) -> bool {
        self.r.mirror.consume(self.r.cid, ts)
    }
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = stats_dict(py, &self.r.mirror)?;
        let n = self.r.hub.net_stats();
        d.set_item("incomplete", n.incomplete)?;
        d.set_item("missing", n.missing)?;
        d.set_item("items_in", n.items_in)?;
        Ok(d)
    }
}

/// The echo side of the channel bench: a raw echo server at `raw_bind` and a
/// channel echo hub at `chan_bind` (putting back into `reply_to`), both
/// until stopped.
#[pyfunction]
#[pyo3(signature = (raw_bind, chan_bind, reply_to, transport, frag=1400))]
pub fn chan_bench_serve(py: Python<'_>, raw_bind: &str, chan_bind: &str, reply_to: &str, transport: &str, frag: usize) -> PyResult<(u64, u64)> {
    let (rb, cb, rt) = (addr(raw_bind)?, addr(chan_bind)?, addr(reply_to)?);
    let t = self::transport(transport)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (res, _) = run_interruptible(py, "ls-chan-serve", stop, move || {
        let s3 = s2.clone();
        let raw = std::thread::Builder::new()
            .name("ls-raw-serve".into())
            .spawn(move || raw::raw_serve(rb, t, frag, &s3))
            .map_err(loopscope_channels::NetError::os("cannot start the raw echo thread"))?;
        let c = raw::chan_serve(cb, rt, t, frag, &s2);
        s2.store(true, std::sync::atomic::Ordering::Relaxed);
        let r = raw.join().map_err(|_| loopscope_channels::NetError::Peer("the raw echo thread panicked".into()))?;
        Ok::<_, loopscope_channels::NetError>((r?, c?))
    })?;
    res.map_err(py_err)
}

/// The timing side of the channel bench: per size, `blocks` blocks of
/// `rounds` round trips, raw and channel alternating block by block.
#[pyfunction]
#[pyo3(signature = (raw_dest, chan_dest, bind, transport, sizes, rounds, blocks, warmup=20, frag=1400))]
#[allow(clippy::too_many_arguments)]
pub fn chan_bench_client<'py>(
    py: Python<'py>,
    raw_dest: &str,
    chan_dest: &str,
    bind: &str,
    transport: &str,
    sizes: Vec<usize>,
    rounds: Vec<usize>,
    blocks: usize,
    warmup: usize,
    frag: usize,
) -> PyResult<Bound<'py, PyList>> {
    let (rd, cd, b) = (addr(raw_dest)?, addr(chan_dest)?, addr(bind)?);
    let t = self::transport(transport)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (res, _) = run_interruptible(py, "ls-chan-client", stop, move || {
        let mut raw = raw::Client::raw(rd, t, frag)?;
        let mut chan = raw::Client::chan(b, cd, t, frag)?;
        let mut out = Vec::new();
        for (k, &size) in sizes.iter().enumerate() {
            let n = rounds.get(k).or(rounds.last()).copied().unwrap_or(100);
            for blk in 0..blocks {
                let order: [(&str, &mut raw::Client); 2] =
                    if blk % 2 == 0 { [("raw", &mut raw), ("channel", &mut chan)] } else { [("channel", &mut chan), ("raw", &mut raw)] };
                for (mode, c) in order {
                    out.push((mode, blk, c.rounds(size, n, warmup)?));
                }
            }
        }
        Ok::<_, loopscope_channels::NetError>(out)
    })?;
    let rows = res.map_err(py_err)?;
    let out = PyList::empty(py);
    for (mode, blk, r) in rows {
        let o = PyDict::new(py);
        o.set_item("mode", mode)?;
        o.set_item("block", blk)?;
        o.set_item("size", r.size)?;
        o.set_item("elapsed_ns", r.elapsed_ns)?;
        o.set_item("timeouts", r.timeouts)?;
        o.set_item("rtt_ns", r.rtt_ns.into_pyarray(py))?;
        out.append(o)?;
    }
    Ok(out)
}
