//! The logger from Python: entities, sessions, reading trace files into columns.

use super::*;

/// A registered entity.
#[pyclass(frozen, module = "loopscope._native", name = "Entity")]
pub(crate) struct PyEntity {
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
            Err(InputError::new_err(format!("{}/{} is a {}, not a {}", self.e.group(), self.e.name(), self.e.kind().as_str(), k.as_str())))
        }
    }
}

pub(crate) fn parse_kind(kind: &str) -> PyResult<Kind> {
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
pub(crate) fn register_entity(group: &str, name: &str, kind: &str, desc: &str, scale: Option<&str>) -> PyResult<PyEntity> {
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
pub(crate) fn open(path: &str, config: Option<&str>, groups: Option<Vec<String>>, ring_groups: Option<Vec<String>>, fsync: bool) -> PyResult<()> {
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
pub(crate) fn close(py: Python<'_>) -> PyResult<String> {
    let end = detached(py, session::close)?.map_err(err)?;
    Ok(serde_json::to_string(&end).unwrap_or_default())
}

#[pyfunction]
pub(crate) fn flush(py: Python<'_>) -> PyResult<()> {
    detached(py, session::flush)?.map_err(err)
}

/// Allocate the calling thread's trace buffers now (else its first record does).
#[pyfunction]
pub(crate) fn prepare_thread() -> bool {
    loopscope_trace::prepare_thread()
}

#[pyfunction]
pub(crate) fn is_open() -> bool {
    session::is_open()
}

#[pyfunction]
pub(crate) fn enable_group(stream: &str, group: &str, on: bool) -> PyResult<()> {
    session::enable_group(stream, group, on).map_err(err)
}

#[pyfunction]
#[pyo3(signature = (stream, tag=0))]
pub(crate) fn trigger(stream: &str, tag: u32) -> PyResult<()> {
    session::trigger(stream, tag).map_err(err)
}

/// Raw timestamp now (for `Entity.interval`).
#[pyfunction]
pub(crate) fn now() -> u64 {
    loopscope_trace::now()
}

#[pyfunction]
pub(crate) fn mono_ns() -> u64 {
    clock::mono_ns()
}

/// (clock kind, why it was chosen).
#[pyfunction]
pub(crate) fn clock_info() -> (String, String) {
    (clock::kind().as_str().to_string(), clock::reason())
}

/// Read a trace: (columns as a dict of numpy arrays, metadata as JSON).
#[pyfunction]
#[pyo3(signature = (path, sort=true, count_only=false))]
pub(crate) fn read_trace<'py>(py: Python<'py>, path: &str, sort: bool, count_only: bool) -> PyResult<(Bound<'py, PyDict>, String)> {
    let p = path.to_string();
    let t = detached(py, move || {
        std::panic::catch_unwind(|| reader::read_file(p.as_ref(), Options { sort, count_only }))
            .unwrap_or_else(|_| Err(loopscope_trace::Error::failed(format!("{p}: the reader failed unexpectedly (a bug: please report it with this file)"))))
    })?
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
pub(crate) fn hist_bounds<'py>(
    py: Python<'py>,
    scale: &str,
    idx: PyReadonlyArray1<'py, u32>,
) -> PyResult<(Bound<'py, numpy::PyArray1<i64>>, Bound<'py, numpy::PyArray1<i64>>)> {
    let s: Scale = serde_json::from_str(scale).map_err(|e| InputError::new_err(format!("histogram layout {scale}: {e}")))?;
    let idx = idx.as_slice()?;
    let (lo, hi): (Vec<i64>, Vec<i64>) = idx.iter().map(|&i| s.bounds(i as u64)).unzip();
    Ok((lo.into_pyarray(py), hi.into_pyarray(py)))
}

/// Run `f` on its own thread with the GIL released, checking for Ctrl-C.

pub(crate) fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
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
    Ok(())
}
