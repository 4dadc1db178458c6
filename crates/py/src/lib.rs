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

mod chan;
mod emu;
mod ktrace;
mod pipe;
mod sync;

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

/// A registered entity.
#[pyclass(frozen, module = "loopscope._native", name = "Entity")]
struct PyEntity {
    e: &'static Entity,
}

#[pymethods]
impl PyEntity {
    #[getter]
    fn id(&self) -> u32 {
        self.e.id()
    }
    #[getter]
    fn group(&self) -> &str {
        self.e.group()
    }
    #[getter]
    fn name(&self) -> &str {
        self.e.name()
    }
    #[getter]
    fn kind(&self) -> &'static str {
        self.e.kind().as_str()
    }
    #[getter]
    fn desc(&self) -> &str {
        self.e.desc()
    }
    /// Whether an open stream logs this entity now.
    #[getter]
    fn enabled(&self) -> bool {
        self.e.enabled()
    }

    /// Log an event (optionally with a number or bytes).
    #[pyo3(signature = (tag=0, value=None, payload=None))]
    fn event(&self, tag: u32, value: Option<i64>, payload: Option<&Bound<'_, PyBytes>>) -> PyResult<()> {
        self.check(Kind::Event)?;
        match (value, payload) {
            (None, None) => self.e.event(tag),
            (Some(v), None) => self.e.event_value(tag, v),
            (None, Some(p)) => self.e.event_payload(tag, p.as_bytes()),
            (Some(_), Some(_)) => return Err(InputError::new_err("an event carries a value or a payload, not both")),
        }
        Ok(())
    }

    /// Log an event with a tag: the fastest call from Python.
    #[pyo3(signature = (tag=0))]
    fn __call__(&self, tag: u32) {
        self.e.event(tag)
    }

    /// Log an interval from raw timestamp `start` (from `now()`) to now.
    #[pyo3(signature = (start, tag=0))]
    fn interval(&self, start: u64, tag: u32) -> PyResult<()> {
        self.check(Kind::Interval)?;
        self.e.interval(tag, start);
        Ok(())
    }

    /// Log an interval given in CLOCK_MONOTONIC nanoseconds.
    #[pyo3(signature = (start_ns, dur_ns, tag=0))]
    fn interval_ns(&self, start_ns: u64, dur_ns: u64, tag: u32) -> PyResult<()> {
        self.check(Kind::Interval)?;
        self.e.interval_mono(tag, start_ns, dur_ns);
        Ok(())
    }

    /// Add to a counter or a histogram.
    fn add(&self, v: i64) -> PyResult<()> {
        match self.stateful("add")? {
            Kind::Counter => self.e.counter_add(v),
            _ => self.e.histogram_add(v),
        }
        Ok(())
    }

    /// Log a counter's value or a histogram's buckets.
    fn log(&self) -> PyResult<()> {
        match self.stateful("log")? {
            Kind::Counter => self.e.counter_log(),
            _ => self.e.histogram_log(),
        }
        Ok(())
    }

    /// Reset a counter or histogram, logging what it held.
    fn reset(&self) -> PyResult<()> {
        match self.stateful("reset")? {
            Kind::Counter => self.e.counter_reset(),
            _ => self.e.histogram_reset(),
        }
        Ok(())
    }

    /// A counter's current value.
    #[getter]
    fn value(&self) -> i64 {
        self.e.counter_value()
    }

    fn __repr__(&self) -> String {
        format!("<loopscope entity {}/{} ({}, id {})>", self.e.group(), self.e.name(), self.e.kind().as_str(), self.e.id())
    }
}

impl PyEntity {
    /// The kind, when it is a counter or a histogram (the kinds with state).
    fn stateful(&self, what: &str) -> PyResult<Kind> {
        match self.e.kind() {
            k @ (Kind::Counter | Kind::Histogram) => Ok(k),
            k => Err(InputError::new_err(format!("{}/{} is a {}; {what}() applies to counters and histograms", self.e.group(), self.e.name(), k.as_str()))),
        }
    }

    fn check(&self, k: Kind) -> PyResult<()> {
        if self.e.kind() == k {
            Ok(())
        } else {
            Err(InputError::new_err(format!(
                "{}/{} is a {}, not a {}",
                self.e.group(),
                self.e.name(),
                self.e.kind().as_str(),
                k.as_str()
            )))
        }
    }
}

fn parse_kind(kind: &str) -> PyResult<Kind> {
    Ok(match kind {
        "event" => Kind::Event,
        "interval" => Kind::Interval,
        "counter" => Kind::Counter,
        "histogram" => Kind::Histogram,
        _ => return Err(InputError::new_err(format!("kind {kind:?} is not one of event, interval, counter, histogram"))),
    })
}

/// Register (or look up) an entity. `scale` (histograms): a JSON layout,
/// `{"scale": "log", "sub_bits": 7, "max": N}` or
/// `{"scale": "linear", "lo": A, "hi": B, "n": K}`.
#[pyfunction]
#[pyo3(signature = (group, name, kind, desc="", scale=None))]
fn register_entity(group: &str, name: &str, kind: &str, desc: &str, scale: Option<&str>) -> PyResult<PyEntity> {
    let k = parse_kind(kind)?;
    let s: Option<Scale> = match scale {
        Some(j) => Some(serde_json::from_str(j).map_err(|e| InputError::new_err(format!("histogram layout {j}: {e}")))?),
        None => None,
    };
    Ok(PyEntity { e: register(group, name, k, desc, s).map_err(err)? })
}

/// Open a trace. `config`: TOML text (see docs/trace-format.md); else the
/// environment. `groups` / `ring_groups` replace the groups of the first
/// normal / ring stream (a ring stream `ring` is added if needed).
#[pyfunction]
#[pyo3(signature = (path, config=None, groups=None, ring_groups=None, fsync=false))]
fn open(path: &str, config: Option<&str>, groups: Option<Vec<String>>, ring_groups: Option<Vec<String>>, fsync: bool) -> PyResult<()> {
    let mut cfg = match config {
        Some(t) => Config::from_toml(t, "config").map_err(err)?,
        None => Config::from_env().map_err(err)?,
    };
    if let Some(g) = groups {
        if let Some(s) = cfg.streams.iter_mut().find(|s| s.kind == StreamKind::Normal) {
            s.groups = g;
        }
    }
    if let Some(g) = ring_groups {
        match cfg.streams.iter_mut().find(|s| s.kind == StreamKind::Ring) {
            Some(s) => s.groups = g,
            None => cfg.streams.push(StreamConfig { name: "ring".into(), kind: StreamKind::Ring, groups: g, buffer_kib: None }),
        }
    }
    cfg.fsync |= fsync;
    session::open(path.as_ref(), cfg).map_err(err)
}

/// Close the trace; returns the end summary as JSON.
#[pyfunction]
fn close(py: Python<'_>) -> PyResult<String> {
    let end = py.detach(session::close).map_err(err)?;
    Ok(serde_json::to_string(&end).unwrap_or_default())
}

#[pyfunction]
fn flush(py: Python<'_>) -> PyResult<()> {
    py.detach(session::flush).map_err(err)
}

/// Allocate the calling thread's trace buffers now (else its first record does).
#[pyfunction]
fn prepare_thread() -> bool {
    loopscope_trace::prepare_thread()
}

#[pyfunction]
fn is_open() -> bool {
    session::is_open()
}

#[pyfunction]
fn enable_group(stream: &str, group: &str, on: bool) -> PyResult<()> {
    session::enable_group(stream, group, on).map_err(err)
}

#[pyfunction]
#[pyo3(signature = (stream, tag=0))]
fn trigger(stream: &str, tag: u32) -> PyResult<()> {
    session::trigger(stream, tag).map_err(err)
}

/// Raw timestamp now (for `Entity.interval`).
#[pyfunction]
fn now() -> u64 {
    loopscope_trace::now()
}

#[pyfunction]
fn mono_ns() -> u64 {
    clock::mono_ns()
}

/// (clock kind, why it was chosen).
#[pyfunction]
fn clock_info() -> (String, String) {
    (clock::kind().as_str().to_string(), clock::reason())
}

/// Read a trace: (columns as a dict of numpy arrays, metadata as JSON).
#[pyfunction]
#[pyo3(signature = (path, sort=true, count_only=false))]
fn read_trace<'py>(py: Python<'py>, path: &str, sort: bool, count_only: bool) -> PyResult<(Bound<'py, PyDict>, String)> {
    let p = path.to_string();
    let t = py
        .detach(move || {
            std::panic::catch_unwind(|| reader::read_file(p.as_ref(), Options { sort, count_only }))
                .unwrap_or_else(|_| Err(loopscope_trace::Error::failed(format!("{p}: the reader failed unexpectedly (a bug: please report it with this file)"))))
        })
        .map_err(err)?;
    let meta = serde_json::json!({
        "info": t.info,
        "entities": t.entities,
        "threads": t.threads,
        "calibration": t.calibration,
        "dumps": t.dumps,
        "changes": t.changes,
        "end": t.end,
        "stats": t.stats,
    });
    let c = t.cols;
    let d = PyDict::new(py);
    d.set_item("t_ns", c.t_ns.into_pyarray(py))?;
    d.set_item("entity", c.entity.into_pyarray(py))?;
    d.set_item("thread", c.thread.into_pyarray(py))?;
    d.set_item("stream", c.stream.into_pyarray(py))?;
    d.set_item("dump", c.dump.into_pyarray(py))?;
    d.set_item("rtype", c.rtype.into_pyarray(py))?;
    d.set_item("tag", c.tag.into_pyarray(py))?;
    d.set_item("dur_ns", c.dur_ns.into_pyarray(py))?;
    d.set_item("value", c.value.into_pyarray(py))?;
    d.set_item("payload_off", c.payload_off.into_pyarray(py))?;
    d.set_item("payload", c.payload.into_pyarray(py))?;
    d.set_item("hist_row", c.hist_row.into_pyarray(py))?;
    d.set_item("hist_under", c.hist_under.into_pyarray(py))?;
    d.set_item("hist_over", c.hist_over.into_pyarray(py))?;
    d.set_item("hist_sum", c.hist_sum.into_pyarray(py))?;
    d.set_item("hist_min", c.hist_min.into_pyarray(py))?;
    d.set_item("hist_max", c.hist_max.into_pyarray(py))?;
    d.set_item("bucket_rec", c.bucket_rec.into_pyarray(py))?;
    d.set_item("bucket_idx", c.bucket_idx.into_pyarray(py))?;
    d.set_item("bucket_count", c.bucket_count.into_pyarray(py))?;
    Ok((d, meta.to_string()))
}

/// Lower and upper bounds of histogram buckets `idx` under layout `scale` (JSON).
#[pyfunction]
fn hist_bounds<'py>(py: Python<'py>, scale: &str, idx: PyReadonlyArray1<'py, u32>) -> PyResult<(Bound<'py, numpy::PyArray1<i64>>, Bound<'py, numpy::PyArray1<i64>>)> {
    let s: Scale = serde_json::from_str(scale).map_err(|e| InputError::new_err(format!("histogram layout {scale}: {e}")))?;
    let idx = idx.as_slice()?;
    let (lo, hi): (Vec<i64>, Vec<i64>) = idx.iter().map(|&i| s.bounds(i as u64)).unzip();
    Ok((lo.into_pyarray(py), hi.into_pyarray(py)))
}

/// Run `f` on its own thread with the GIL released, checking for Ctrl-C.
/// On Ctrl-C `stop` is set and the function's (partial) result still returned,
/// with the second element true.
/// Run ``f`` on a thread named ``name`` (kernel attribution names threads by
/// it: "ls-pipe-node" says more than a generic name) with the interpreter
/// lock released, turning Ctrl-C into ``stop``.
fn run_interruptible<T: Send + 'static>(py: Python<'_>, name: &str, stop: Arc<AtomicBool>, f: impl FnOnce() -> T + Send + 'static) -> PyResult<(T, bool)> {
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
            let (mut g, _) = slot.1.wait_timeout_while(g, Duration::from_millis(100), |v| v.is_none()).unwrap_or_else(|e| e.into_inner());
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

/// Run the timer-latency probe; returns a dict (see timer.rs).
#[pyfunction]
#[pyo3(signature = (interval_ns, duration_ns, threads=1, cpus=vec![], priority=None, mlock=true, max_samples=16_000_000, dma_latency_us=None))]
#[allow(clippy::too_many_arguments)]
fn timer_probe<'py>(
    py: Python<'py>,
    interval_ns: u64,
    duration_ns: u64,
    threads: usize,
    cpus: Vec<usize>,
    priority: Option<i32>,
    mlock: bool,
    max_samples: usize,
    dma_latency_us: Option<i32>,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = timer::TimerConfig { interval_ns, duration_ns, threads, cpus, priority, mlock, max_samples, dma_latency_us };
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-timer-main", stop, move || timer::run(&cfg, s2))?;
    let d = PyDict::new(py);
    let ths = PyList::empty(py);
    for t in r.threads {
        let td = PyDict::new(py);
        td.set_item("index", t.index)?;
        td.set_item("tid", t.tid)?;
        td.set_item("cpu", t.cpu)?;
        td.set_item("wakeups", t.wakeups)?;
        td.set_item("missed", t.missed)?;
        td.set_item("min_ns", t.min_ns)?;
        td.set_item("max_ns", t.max_ns)?;
        td.set_item("sum_ns", t.sum_ns as i64)?;
        td.set_item("sched", t.sched)?;
        td.set_item("sched_ok", t.sched_ok)?;
        td.set_item("affinity_ok", t.affinity_ok)?;
        td.set_item("error", t.error)?;
        td.set_item("latencies", t.latencies.into_pyarray(py))?;
        ths.append(td)?;
    }
    d.set_item("threads", ths)?;
    d.set_item("mlock", r.mlock)?;
    d.set_item("mlock_ok", r.mlock_ok)?;
    d.set_item("dma_latency", r.dma_latency)?;
    d.set_item("dma_latency_ok", r.dma_latency_ok)?;
    d.set_item("overhead_ns", r.overhead_ns)?;
    d.set_item("interrupted", interrupted || r.interrupted)?;
    d.set_item("elapsed_ns", r.elapsed_ns)?;
    Ok(d)
}

/// Run the scheduler-responsiveness probe; returns a dict (see sched.rs).
#[pyfunction]
#[pyo3(signature = (duration_ns, busy_threads=2, sleep_ns=1_000_000, work_ns=1_000_000, cpus=vec![], work_iters=None, alone_ns=None, calibrate_only=false))]
#[allow(clippy::too_many_arguments)]
fn sched_probe<'py>(
    py: Python<'py>,
    duration_ns: u64,
    busy_threads: usize,
    sleep_ns: u64,
    work_ns: u64,
    cpus: Vec<usize>,
    work_iters: Option<u64>,
    alone_ns: Option<i64>,
    calibrate_only: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let fixed = match (work_iters, alone_ns) {
        (Some(i), Some(a)) => Some((i, a)),
        (None, None) => None,
        _ => return Err(InputError::new_err("work_iters and alone_ns go together (both from one calibration)")),
    };
    let cfg = loopscope_probes::sched::SchedConfig { busy_threads, sleep_ns, work_ns, duration_ns, cpus, fixed, calibrate_only };
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-sched-main", stop, move || loopscope_probes::sched::run(&cfg, s2))?;
    let d = PyDict::new(py);
    d.set_item("work_iters", r.work_iters)?;
    d.set_item("alone_ns", r.alone_ns)?;
    d.set_item("alone_samples", r.alone_samples.into_pyarray(py))?;
    d.set_item("wake_delay_ns", r.wake_delay_ns.into_pyarray(py))?;
    d.set_item("extra_ns", r.extra_ns.into_pyarray(py))?;
    d.set_item("busy_ops", r.busy_ops)?;
    d.set_item("elapsed_ns", r.elapsed_ns)?;
    d.set_item("interrupted", interrupted || r.interrupted)?;
    Ok(d)
}

/// Run the system-call cost probe; returns a dict (see syscall.rs). A call
/// that fails raises RunError naming it.
#[pyfunction]
#[pyo3(signature = (calls, dir, batch=200, min_batches=10, max_batches=2000, target_rel=0.05, max_seconds=5.0))]
#[allow(clippy::too_many_arguments)]
fn syscall_probe<'py>(
    py: Python<'py>,
    calls: Vec<String>,
    dir: String,
    batch: usize,
    min_batches: usize,
    max_batches: usize,
    target_rel: f64,
    max_seconds: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = loopscope_probes::syscall::SyscallConfig { calls, batch, min_batches, max_batches, target_rel, max_seconds, dir: dir.into() };
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-syscall", stop, move || loopscope_probes::syscall::run(&cfg, s2))?;
    let r = r.map_err(RunError::new_err)?;
    let d = PyDict::new(py);
    let calls = PyList::empty(py);
    for c in r.calls {
        let cd = PyDict::new(py);
        cd.set_item("name", &c.name)?;
        cd.set_item("mean_ns", c.mean_ns)?;
        cd.set_item("ci_half_ns", c.ci_half_ns)?;
        cd.set_item("converged", c.converged)?;
        cd.set_item("error", c.error)?;
        cd.set_item("batch_ns", c.batch_ns.into_pyarray(py))?;
        calls.append(cd)?;
    }
    d.set_item("calls", calls)?;
    d.set_item("clock_read_ns", r.clock_read_ns)?;
    d.set_item("interrupted", interrupted || r.interrupted)?;
    Ok(d)
}

/// Names of the system calls the syscall probe knows.
#[pyfunction]
fn syscall_names() -> Vec<&'static str> {
    loopscope_probes::syscall::CALLS.to_vec()
}

/// A call spec (`read`, `read:4096`) as (name, size or None); ValueError says why not.
#[pyfunction]
fn syscall_parse(spec: &str) -> PyResult<(String, Option<usize>)> {
    loopscope_probes::syscall::parse_call(spec).map_err(pyo3::exceptions::PyValueError::new_err)
}

/// The calls that take a size, with the largest size each allows.
#[pyfunction]
fn syscall_sized() -> Vec<(&'static str, usize)> {
    loopscope_probes::syscall::SIZED.to_vec()
}

/// Be a load worker: run `kind` until SIGTERM/SIGINT (or `seconds`), dying
/// with the parent; returns the report. `params`: kind-specific numbers
/// (memory: count; net: protocol, rate_bps (None: unlimited), size, dest), `dir`
/// for io/mix, `fsync` for io.
#[pyfunction]
#[pyo3(signature = (kind, duty=None, seconds=None, dir=None, fsync=false, count=10_000_000, rate_bps=None, size=1400, protocol="udp", dest=None))]
#[allow(clippy::too_many_arguments)]
fn load_worker<'py>(
    py: Python<'py>,
    kind: &str,
    duty: Option<f64>,
    seconds: Option<f64>,
    dir: Option<String>,
    fsync: bool,
    count: usize,
    rate_bps: Option<f64>,
    size: usize,
    protocol: &str,
    dest: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    use loopscope_loads::{net::Protocol, Config as LoadConfig, Kind as LoadKind};
    let d = || dir.clone().map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let k = match kind {
        "cpu" => LoadKind::Cpu,
        "memory" => LoadKind::Memory { count },
        "io" => LoadKind::Io { dir: d(), fsync },
        "net" => LoadKind::Net {
            protocol: match protocol {
                "udp" => Protocol::Udp,
                "tcp" => Protocol::Tcp,
                p => return Err(InputError::new_err(format!("protocol {p:?} is not udp or tcp"))),
            },
            rate_bps,
            size,
            dest: match dest {
                Some(d) => Some(addr(&d)?),
                None => None,
            },
        },
        "mix" => LoadKind::Mix { dir: d() },
        other => return Err(InputError::new_err(format!("load kind {other:?} is not one of cpu, memory, io, net, mix"))),
    };
    if let Some(x) = duty {
        if !(x > 0.0 && x <= 1.0) {
            return Err(InputError::new_err(format!("duty cycle must be in (0, 1] [got {x}]")));
        }
    }
    loopscope_loads::install_worker_signals().map_err(RunError::new_err)?;
    let cfg = LoadConfig { kind: k, duty, seconds };
    let never = AtomicBool::new(false);
    let r = py.detach(|| loopscope_loads::run(&cfg, &never));
    let out = PyDict::new(py);
    out.set_item("kind", r.kind)?;
    out.set_item("unit", r.unit)?;
    out.set_item("ops", r.ops)?;
    out.set_item("busy_ns", r.busy_ns)?;
    out.set_item("elapsed_ns", r.elapsed_ns)?;
    out.set_item("error", r.error)?;
    Ok(out)
}

// ---- network probes ------------------------------------------------------------

use loopscope_probes::net::{bulk, recv as nrecv, rr, rr_tcp, schedule::Pattern, send as nsend, sock};

fn pattern(name: &str, seed: u64, on_ns: u64, off_ns: u64, replay: Option<String>) -> PyResult<Pattern> {
    Ok(match name {
        "cbr" => Pattern::Cbr,
        "poisson" => Pattern::Poisson { seed },
        "onoff" => Pattern::OnOff { on_ns, off_ns },
        "replay" => {
            let p = replay.ok_or_else(|| InputError::new_err("the replay pattern needs a file"))?;
            Pattern::Replay { offsets: loopscope_probes::net::schedule::read_replay(p.as_ref()).map_err(InputError::new_err)? }
        }
        other => return Err(InputError::new_err(format!("pattern {other:?} is not one of cbr, poisson, onoff, replay:FILE"))),
    })
}

fn addr(a: &str) -> PyResult<std::net::SocketAddr> {
    sock::resolve(a).map_err(InputError::new_err)
}

/// Departure offsets (ns) of a schedule, for tests and tools.
#[pyfunction]
#[pyo3(signature = (pattern_name, pps_num, pps_den=1, count=None, duration_ns=None, seed=1, on_ns=0, off_ns=0, replay=None))]
#[allow(clippy::too_many_arguments)]
fn net_schedule<'py>(
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

fn hist_dict<'py>(py: Python<'py>, h: &loopscope_trace::hist::Snapshot) -> PyResult<Bound<'py, PyDict>> {
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
fn net_send<'py>(
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
    nsend::open_sockets(&cfg).map_err(InputError::new_err)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-send", stop, move || nsend::run(&cfg, s2))?;
    let r = r.map_err(RunError::new_err)?;
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
fn net_recv<'py>(
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
    let sock = nrecv::bind(&cfg).map_err(InputError::new_err)?;
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
fn net_echo<'py>(py: Python<'py>, bind: &str, duration_ns: Option<u64>, tcp: bool, ready_fd: Option<i32>) -> PyResult<Bound<'py, PyDict>> {
    let a = addr(bind)?;
    if tcp {
        let l = bulk::tcp_listen(&a).map_err(InputError::new_err)?;
        pipe::ready(ready_fd);
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let (r, interrupted) = run_interruptible(py, "ls-echo", stop, move || rr_tcp::echo(l, duration_ns, s2))?;
        return echo_dict(py, &r, interrupted);
    }
    let s = sock::Udp::bind(&a, 4 << 20).map_err(InputError::new_err)?;
    s.enable_rx_timestamps().map_err(RunError::new_err)?;
    s.set_read_timeout_ms(50);
    pipe::ready(ready_fd);
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-echo", stop, move || rr::echo(s, duration_ns, s2))?;
    echo_dict(py, &r, interrupted)
}

fn echo_dict<'py>(py: Python<'py>, r: &rr::EchoResult, interrupted: bool) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("requests", r.requests)?;
    d.set_item("malformed", r.malformed)?;
    d.set_item("send_errors", r.send_errors)?;
    d.set_item("elapsed_ns", r.elapsed_ns)?;
    d.set_item("interrupted", interrupted)?;
    Ok(d)
}

/// Stimulus-response client; returns per-exchange arrays.
#[pyfunction]
#[pyo3(signature = (dest, pps_num, duration_ns, pps_den=1, pattern_name="cbr", size=64, flow=1, grace_ns=200_000_000, records=true, seed=1, on_ns=0, off_ns=0, tcp=false))]
#[allow(clippy::too_many_arguments)]
fn net_rr<'py>(
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
    let cfg = rr::RrConfig { dest: addr(dest)?, pps_num, pps_den: pps_den.max(1), pattern: pattern(pattern_name, seed, on_ns, off_ns, None)?, duration_ns, size, flow, grace_ns, records };
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-rr", stop, move || if tcp { rr_tcp::client(&cfg, s2) } else { rr::client(&cfg, s2) })?;
    let r = r.map_err(InputError::new_err)?;
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
fn net_bulk_tcp(py: Python<'_>, dest: &str, duration_ns: u64, rate_bps: Option<f64>, size: usize) -> PyResult<(u64, u64, Option<String>)> {
    let a = addr(dest)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, _) = run_interruptible(py, "ls-bulk-send", stop, move || bulk::tcp_send(&a, rate_bps, size, duration_ns, s2))?;
    let r = r.map_err(InputError::new_err)?;
    Ok((r.bytes, r.elapsed_ns, r.error))
}

/// TCP sink: (bytes, connections) when stopped or after `duration_ns`.
#[pyfunction]
#[pyo3(signature = (bind, duration_ns=None))]
fn net_sink_tcp(py: Python<'_>, bind: &str, duration_ns: Option<u64>) -> PyResult<(u64, u64)> {
    let a = addr(bind)?;
    let l = bulk::tcp_listen(&a).map_err(InputError::new_err)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, _) = run_interruptible(py, "ls-bulk-sink", stop, move || bulk::tcp_sink(l, duration_ns, s2))?;
    Ok(r)
}

// ---- benchmarks: the Rust side of `loopscope bench trace` --------------------

const FLOOR_WORDS: usize = 8 * 1024 * 1024 / 8;

/// ns per iteration of a TSC read + 16-byte store into an 8 MiB buffer, per repetition.
#[pyfunction]
fn bench_floor(py: Python<'_>, n: u64, reps: usize) -> Vec<f64> {
    py.detach(|| {
        let mut buf = vec![0u64; FLOOR_WORDS];
        (0..reps)
            .map(|_| {
                let t0 = Instant::now();
                for i in 0..n {
                    let t = clock::rdtsc();
                    let k = (i as usize * 2) & (FLOOR_WORDS - 1);
                    unsafe {
                        let p = buf.as_mut_ptr().add(k);
                        p.write_volatile(i);
                        p.add(1).write_volatile(t);
                    }
                }
                t0.elapsed().as_nanos() as f64 / n as f64
            })
            .collect()
    })
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

const ENV_WORDS: usize = 256 * 1024; // 2 MiB: in the last-level cache when the machine is quiet

/// The compiled execution environment of a node model: per batch, thread
/// CPU ns per operation (an xorshift step, a dependent load and a store in
/// a 2 MiB table: arithmetic and cache traffic like compiled application
/// code), `batches` batches of `ops` operations.
#[pyfunction]
fn env_compiled(py: Python<'_>, ops: u64, batches: usize) -> Vec<f64> {
    py.detach(|| {
        let mut t: Vec<u64> = (0..ENV_WORDS as u64).collect();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..batches)
            .map(|_| {
                let c0 = thread_cpu_ns();
                for _ in 0..ops {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = (x as usize) & (ENV_WORDS - 1);
                    let v = unsafe { std::ptr::read_volatile(t.as_ptr().add(k)) };
                    unsafe { std::ptr::write_volatile(t.as_mut_ptr().add((v as usize ^ k) & (ENV_WORDS - 1)), x) };
                }
                (thread_cpu_ns() - c0) as f64 / ops as f64
            })
            .collect()
    })
}

fn bench_entity() -> PyResult<&'static Entity> {
    register("bench", "rust", Kind::Event, "benchmark event (Rust loop)", None).map_err(err)
}

/// ns per event of `threads` threads each logging `n` events, per repetition
/// (mean over threads). A trace must be open with group `bench` enabled.
#[pyfunction]
#[pyo3(signature = (n, reps, threads=1))]
fn bench_events(py: Python<'_>, n: u64, reps: usize, threads: usize) -> PyResult<Vec<f64>> {
    let e = bench_entity()?;
    if !e.enabled() {
        return Err(InputError::new_err("open a trace with group 'bench' enabled first"));
    }
    Ok(py.detach(|| {
        (0..reps)
            .map(|_| {
                let bar = Arc::new(std::sync::Barrier::new(threads));
                let hs: Vec<_> = (0..threads)
                    .map(|_| {
                        let bar = bar.clone();
                        std::thread::spawn(move || {
                            e.event(0);
                            let _ = session::flush();
                            bar.wait();
                            let t0 = Instant::now();
                            for i in 0..n {
                                e.event(i as u32);
                            }
                            t0.elapsed().as_nanos() as f64 / n as f64
                        })
                    })
                    .collect();
                let v: Vec<f64> = hs.into_iter().map(|h| h.join().unwrap_or(f64::NAN)).collect();
                let _ = session::flush();
                v.iter().sum::<f64>() / v.len() as f64
            })
            .collect()
    }))
}

/// Log events from one thread for `seconds`: paced at `rate` events/s
/// (absolute deadlines checked every 64 events), or as fast as possible when
/// `rate` is 0. Returns (events logged, seconds taken).
#[pyfunction]
fn bench_sustained(py: Python<'_>, rate: f64, seconds: f64) -> PyResult<(u64, f64)> {
    let e = bench_entity()?;
    if !e.enabled() {
        return Err(InputError::new_err("open a trace with group 'bench' enabled first"));
    }
    Ok(py.detach(|| {
        let t0 = Instant::now();
        let end = Duration::from_secs_f64(seconds);
        let mut n = 0u64;
        loop {
            let el = t0.elapsed();
            if el >= end {
                break;
            }
            if rate > 0.0 {
                let due = (el.as_secs_f64() * rate) as u64;
                if n >= due {
                    std::hint::spin_loop();
                    continue;
                }
            }
            for _ in 0..64 {
                e.event(n as u32);
                n += 1;
            }
        }
        (n, t0.elapsed().as_secs_f64())
    }))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEntity>()?;
    m.add("FORMAT_VERSION", (format::VERSION_MAJOR, format::VERSION_MINOR))?;
    m.add("MAX_PAYLOAD", format::rec::MAX_PAYLOAD)?;
    m.add_function(wrap_pyfunction!(register_entity, m)?)?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(close, m)?)?;
    m.add_function(wrap_pyfunction!(flush, m)?)?;
    m.add_function(wrap_pyfunction!(is_open, m)?)?;
    m.add_function(wrap_pyfunction!(prepare_thread, m)?)?;
    m.add_function(wrap_pyfunction!(enable_group, m)?)?;
    m.add_function(wrap_pyfunction!(trigger, m)?)?;
    m.add_function(wrap_pyfunction!(now, m)?)?;
    m.add_function(wrap_pyfunction!(mono_ns, m)?)?;
    m.add_function(wrap_pyfunction!(clock_info, m)?)?;
    m.add_function(wrap_pyfunction!(read_trace, m)?)?;
    m.add_function(wrap_pyfunction!(hist_bounds, m)?)?;
    m.add_function(wrap_pyfunction!(timer_probe, m)?)?;
    m.add_function(wrap_pyfunction!(sched_probe, m)?)?;
    m.add_function(wrap_pyfunction!(syscall_probe, m)?)?;
    m.add_function(wrap_pyfunction!(syscall_names, m)?)?;
    m.add_function(wrap_pyfunction!(syscall_parse, m)?)?;
    m.add_function(wrap_pyfunction!(syscall_sized, m)?)?;
    m.add_function(wrap_pyfunction!(load_worker, m)?)?;
    m.add_function(wrap_pyfunction!(net_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(net_send, m)?)?;
    m.add_function(wrap_pyfunction!(net_recv, m)?)?;
    m.add_function(wrap_pyfunction!(net_echo, m)?)?;
    m.add_function(wrap_pyfunction!(net_rr, m)?)?;
    m.add_function(wrap_pyfunction!(net_bulk_tcp, m)?)?;
    m.add_function(wrap_pyfunction!(net_sink_tcp, m)?)?;
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
    m.add_function(wrap_pyfunction!(pipe::pipe_source, m)?)?;
    m.add_function(wrap_pyfunction!(pipe::pipe_node, m)?)?;
    m.add_function(wrap_pyfunction!(pipe::pipe_sink, m)?)?;
    m.add_function(wrap_pyfunction!(sync::sync_serve, m)?)?;
    m.add_function(wrap_pyfunction!(sync::sync_probe, m)?)?;
    m.add_function(wrap_pyfunction!(bench_floor, m)?)?;
    m.add_function(wrap_pyfunction!(env_compiled, m)?)?;
    m.add_function(wrap_pyfunction!(bench_events, m)?)?;
    m.add_function(wrap_pyfunction!(bench_sustained, m)?)?;
    Ok(())
}
