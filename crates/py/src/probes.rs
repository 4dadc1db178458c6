//! The timer, sched and syscall probes and the load workers, run with the interpreter lock released.

use super::*;

/// The timer probe's parameters as its model declares them (probes/params.py
/// `TimerParams`), read from the model by attribute; `timer_params` echoes
/// them back so that a test ties the two declarations.
#[derive(FromPyObject, IntoPyObject, Clone, Debug)]
pub(crate) struct TimerParams {
    interval_us: u64,
    threads: usize,
    cpu: Option<Vec<usize>>,
    priority: Option<i32>,
    dma_latency_us: Option<i32>,
    mlock: bool,
}

/// What the binding read of a `TimerParams` model (for the test that ties them).
#[pyfunction]
pub(crate) fn timer_params(p: TimerParams) -> TimerParams {
    p
}

/// Run the timer-latency probe with its parameters (a `TimerParams` model); returns a dict (see timer.rs).
#[pyfunction]
#[pyo3(signature = (params, duration_ns, max_samples=16_000_000))]
pub(crate) fn timer_probe<'py>(py: Python<'py>, params: TimerParams, duration_ns: u64, max_samples: usize) -> PyResult<Bound<'py, PyDict>> {
    let cfg = timer::TimerConfig {
        interval_ns: params.interval_us * 1000,
        duration_ns,
        threads: params.threads,
        cpus: params.cpu.unwrap_or_default(),
        priority: params.priority,
        mlock: params.mlock,
        max_samples,
        dma_latency_us: params.dma_latency_us,
    };
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

/// The sched probe's parameters as its model declares them (probes/params.py
/// `SchedParams`), read by attribute; `sched_params` echoes them back.
#[derive(FromPyObject, IntoPyObject, Clone, Debug)]
pub(crate) struct SchedParams {
    busy_threads: usize,
    sleep_us: u64,
    work_us: u64,
    cpu: Option<Vec<usize>>,
}

/// What the binding read of a `SchedParams` model (for the test that ties them).
#[pyfunction]
pub(crate) fn sched_params(p: SchedParams) -> SchedParams {
    p
}

/// Run the scheduler-responsiveness probe with its parameters (a
/// `SchedParams` model) and, when given, the burst an earlier calibration
/// found; returns a dict (see sched.rs).
#[pyfunction]
#[pyo3(signature = (params, duration_ns, work_iters=None, alone_ns=None, calibrate_only=false))]
pub(crate) fn sched_probe<'py>(
    py: Python<'py>,
    params: SchedParams,
    duration_ns: u64,
    work_iters: Option<u64>,
    alone_ns: Option<i64>,
    calibrate_only: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let fixed = match (work_iters, alone_ns) {
        (Some(i), Some(a)) => Some((i, a)),
        (None, None) => None,
        _ => return Err(InputError::new_err("work_iters and alone_ns go together (both from one calibration)")),
    };
    let cfg = loopscope_probes::sched::SchedConfig {
        busy_threads: params.busy_threads,
        sleep_ns: params.sleep_us * 1000,
        work_ns: params.work_us * 1000,
        duration_ns,
        cpus: params.cpu.unwrap_or_default(),
        fixed,
        calibrate_only,
    };
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
/// The syscall probe's parameters as its model declares them (probes/params.py
/// `SyscallParams`), read by attribute; `syscall_params` echoes them back.
#[derive(FromPyObject, IntoPyObject, Clone, Debug)]
pub(crate) struct SyscallParams {
    calls: Vec<String>,
    batch: usize,
    target_pct: f64,
    max_batches: usize,
    max_seconds_per_call: f64,
    dir: Option<String>,
}

/// What the binding read of a `SyscallParams` model (for the test that ties them).
#[pyfunction]
pub(crate) fn syscall_params(p: SyscallParams) -> SyscallParams {
    p
}

/// Run the system-call cost probe with its parameters (a `SyscallParams`
/// model; its files go to `dir` unless it names one); returns a dict (see
/// syscall.rs). A call that fails raises RunError naming it.
#[pyfunction]
#[pyo3(signature = (params, dir, min_batches=10))]
pub(crate) fn syscall_probe<'py>(py: Python<'py>, params: SyscallParams, dir: String, min_batches: usize) -> PyResult<Bound<'py, PyDict>> {
    let cfg = loopscope_probes::syscall::SyscallConfig {
        calls: params.calls,
        batch: params.batch,
        min_batches,
        max_batches: params.max_batches,
        target_rel: params.target_pct / 100.0,
        max_seconds: params.max_seconds_per_call,
        dir: params.dir.unwrap_or(dir).into(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (r, interrupted) = run_interruptible(py, "ls-syscall", stop, move || loopscope_probes::syscall::run(&cfg, s2))?;
    let r = r.map_err(py_err)?;
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
pub(crate) fn syscall_names() -> Vec<&'static str> {
    loopscope_probes::syscall::CALLS.to_vec()
}

/// A call spec (`read`, `read:4096`) as (name, size or None); ValueError says why not.
#[pyfunction]
pub(crate) fn syscall_parse(spec: &str) -> PyResult<(String, Option<usize>)> {
    loopscope_probes::syscall::parse_call(spec).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

/// The calls that take a size, with the largest size each allows.
#[pyfunction]
pub(crate) fn syscall_sized() -> Vec<(&'static str, usize)> {
    loopscope_probes::syscall::SIZED.to_vec()
}

/// Be a load worker: run `kind` until SIGTERM/SIGINT (or `seconds`), dying
/// with the parent; returns the report. `params`: kind-specific numbers
/// (memory: count; net: protocol, rate_bps (None: unlimited), size, dest), `dir`
/// for io/mix, `fsync` for io.
#[pyfunction]
#[pyo3(signature = (kind, duty=None, seconds=None, dir=None, fsync=false, count=10_000_000, rate_bps=None, size=1400, protocol="udp", dest=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_worker<'py>(
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
    loopscope_loads::install_worker_signals().map_err(py_err)?;
    let cfg = LoadConfig { kind: k, duty, seconds };
    let never = AtomicBool::new(false);
    let r = detached(py, || loopscope_loads::run(&cfg, &never))?;
    let out = PyDict::new(py);
    out.set_item("kind", r.kind)?;
    out.set_item("unit", r.unit)?;
    out.set_item("ops", r.ops)?;
    out.set_item("busy_ns", r.busy_ns)?;
    out.set_item("elapsed_ns", r.elapsed_ns)?;
    out.set_item("error", r.error)?;
    Ok(out)
}

pub(crate) fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(timer_probe, m)?)?;
    m.add_function(wrap_pyfunction!(timer_params, m)?)?;
    m.add_function(wrap_pyfunction!(sched_params, m)?)?;
    m.add_function(wrap_pyfunction!(syscall_params, m)?)?;
    m.add_function(wrap_pyfunction!(sched_probe, m)?)?;
    m.add_function(wrap_pyfunction!(syscall_probe, m)?)?;
    m.add_function(wrap_pyfunction!(syscall_names, m)?)?;
    m.add_function(wrap_pyfunction!(syscall_parse, m)?)?;
    m.add_function(wrap_pyfunction!(syscall_sized, m)?)?;
    m.add_function(wrap_pyfunction!(load_worker, m)?)?;
    Ok(())
}
