//! A capture's segment files written natively (crates/ktrace `segment`).
//!
//! `KtraceImport.take_batch` leaves a batch's columns in a `KtraceBatch`;
//! `KtraceSegments.cut` sorts it after what the last cut held back and holds
//! back what the next batch can precede; `write` writes a cut as one Parquet
//! segment file. Both release the interpreter lock, and writes of different
//! segments can run at once (the importer writes two while it decodes the
//! next batch). Python sees the batch's counts and the file's name, rows
//! and row groups: never the events.

use super::{detached, InputError, RunError};
use loopscope_ktrace::decode::Columns;
use loopscope_ktrace::segment::{properties, write, Cut, Cutter, Properties, WriteError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::Mutex;

/// One batch of decoded events, kept native until written: as decoded, or cut.
#[pyclass(module = "loopscope._native", name = "KtraceBatch")]
pub struct KtraceBatch {
    cols: Option<Columns>,
    cut: Option<Cut>,
}

/// `o` (a batch's losses, strings, counts) with the batch itself (`batch`),
/// its size (`n`), its earliest and latest stamps (`t_min`, `t_max`: None
/// when empty), the event codes present in it (`present`, sorted) and per
/// CPU its events' span and count (`by_cpu`: [cpu, first, last, events],
/// by CPU: what a segment that cannot be written loses).
pub(crate) fn batch_dict<'py>(py: Python<'py>, c: Columns, o: Bound<'py, PyDict>) -> PyResult<Bound<'py, PyDict>> {
    o.set_item("n", c.t_ns.len())?;
    o.set_item("t_min", c.t_ns.iter().min().copied())?;
    o.set_item("t_max", c.t_ns.iter().max().copied())?;
    // indexed by CPU, one pass: every reader refuses a CPU past tracedat::MAX_CPUS (a damaged
    // file's CPU of 2^30 sized this table to 24 GB and aborted the process)
    let mut by_cpu: Vec<[i64; 3]> = Vec::new();
    for (&cpu, &t) in c.cpu.iter().zip(&c.t_ns) {
        let i = cpu.max(0) as usize;
        if i >= by_cpu.len() {
            by_cpu.resize(i + 1, [i64::MAX, i64::MIN, 0]);
        }
        let e = &mut by_cpu[i];
        e[0] = e[0].min(t);
        e[1] = e[1].max(t);
        e[2] += 1;
    }
    let by_cpu: Vec<[i64; 4]> = by_cpu.iter().enumerate().filter(|(_, e)| e[2] > 0).map(|(cpu, &[a, b, n])| [cpu as i64, a, b, n]).collect();
    o.set_item("by_cpu", by_cpu)?;
    let mut seen: Vec<bool> = Vec::new();
    for &e in &c.event {
        if e >= 0 {
            let e = e as usize;
            if e >= seen.len() {
                seen.resize(e + 1, false);
            }
            seen[e] = true;
        }
    }
    let present: Vec<usize> = seen.iter().enumerate().filter(|(_, &s)| s).map(|(i, _)| i).collect();
    o.set_item("present", present)?;
    o.set_item("batch", Py::new(py, KtraceBatch { cols: Some(c), cut: None })?)?;
    Ok(o)
}

/// The segment writer of one capture directory: `cut` batches in order,
/// `write` the cuts (several at once, from as many threads).
#[pyclass(module = "loopscope._native", name = "KtraceSegments")]
pub struct KtraceSegments {
    dir: PathBuf,
    props: Properties,
    cutter: Mutex<Cutter>,
}

impl Drop for KtraceSegments {
    fn drop(&mut self) {
        if self.cutter.lock().is_ok_and(|c| c.recycle) {
            Columns::drop_spares();
        }
    }
}

#[pymethods]
impl KtraceSegments {
    /// `cap_dir`: the capture's directory (with `events/`); `level`: zstd's;
    /// `recycle`: each batch's columns handed back once written, for the
    /// decoder's next batch (an import's stream of batches; a drain's
    /// reader, idle between drains, keeps none), freed with the writer.
    #[new]
    #[pyo3(signature = (cap_dir, level, recycle=false))]
    fn new(cap_dir: &str, level: i32, recycle: bool) -> PyResult<Self> {
        let props = properties(level).map_err(|e| InputError::new_err(format!("zstd level {level}: {e}")))?;
        let mut cutter = Cutter::default();
        cutter.recycle = recycle;
        Ok(KtraceSegments { dir: PathBuf::from(cap_dir), props, cutter: Mutex::new(cutter) })
    }

    /// `batch` with what the last cut held back, time-sorted, up to
    /// `watermark_ns` (all when None): a new batch, to `write`. The one
    /// given is spent. Cuts are made in the order the batches were decoded.
    #[pyo3(signature = (batch, watermark_ns))]
    fn cut(&self, py: Python<'_>, batch: &Bound<'_, KtraceBatch>, watermark_ns: Option<i64>) -> PyResult<KtraceBatch> {
        let cols = batch.borrow_mut().cols.take().ok_or_else(|| RunError::new_err("a decoded batch is cut once"))?;
        let cutter = &self.cutter;
        let got = detached(py, move || cutter.lock().map(|mut c| c.cut(cols, watermark_ns)).map_err(|_| "a cut failed before"))?;
        Ok(KtraceBatch { cols: None, cut: Some(got.map_err(RunError::new_err)?) })
    }

    /// Write `batch` (a cut) as segment `seg`. Returns {file (None: no events),
    /// events, t_first_ns, t_last_ns, groups: [[first, last], …], bytes, and
    /// with `switch` (sched_switch's event code) names: [[tid, comm code], …]:
    /// each thread its switches name, its latest name there}.
    #[pyo3(signature = (batch, seg, switch=None))]
    fn write<'py>(&self, py: Python<'py>, batch: &Bound<'py, KtraceBatch>, seg: u32, switch: Option<i32>) -> PyResult<Bound<'py, PyDict>> {
        let cut = batch.borrow_mut().cut.take().ok_or_else(|| RunError::new_err("a cut batch is written once"))?;
        let (dir, props) = (&self.dir, &self.props);
        let got = detached(py, move || write(dir, props, seg, &cut, switch))?.map_err(|e: WriteError| RunError::new_err(e.to_string()))?;
        let o = PyDict::new(py);
        o.set_item("file", got.file)?;
        o.set_item("events", got.events)?;
        o.set_item("t_first_ns", got.t_first_ns)?;
        o.set_item("t_last_ns", got.t_last_ns)?;
        o.set_item("groups", got.groups.iter().map(|&(a, b)| vec![a, b]).collect::<Vec<_>>())?;
        o.set_item("bytes", got.bytes)?;
        if let Some(names) = got.names {
            o.set_item("names", names.iter().map(|&(t, c)| [t, c]).collect::<Vec<_>>())?;
        }
        Ok(o)
    }

    /// The events held back for the next cut.
    fn held(&self) -> usize {
        self.cutter.lock().map(|c| c.held()).unwrap_or(0)
    }
}
