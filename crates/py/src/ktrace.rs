//! The kernel trace decoder (crates/ktrace), from Python.
//!
//! `KtraceDecoder` turns tracefs pages (read by `tracepipe`, or as it reads
//! them: `read_pages`) into numpy columns and a string table, or a native
//! batch for the segment writer, keeping each CPU's last event time across
//! batches so that a loss at a batch's first page is placed.

use super::tracepipe::{read_error, read_pages_into};
use super::{detached, InputError};
use loopscope_ktrace::decode::{Columns, Decoder};
use loopscope_ktrace::format::{parse, parse_header_page};
use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;

#[pyclass(module = "loopscope._native", name = "KtraceDecoder")]
pub struct KtraceDecoder {
    d: Decoder,
    page_size: usize,
}

#[pymethods]
impl KtraceDecoder {
    /// `header_page`: the text of events/header_page; `formats`: (system, format file text) per event.
    #[new]
    fn new(header_page: &str, formats: Vec<(String, String)>, page_size: usize) -> PyResult<Self> {
        let layout = parse_header_page(header_page).map_err(|e| InputError::new_err(e.to_string()))?;
        let mut fs = Vec::new();
        for (sys, text) in formats {
            fs.push(parse(&sys, &text).map_err(|e| InputError::new_err(e.to_string()))?);
        }
        Ok(KtraceDecoder { d: Decoder::new(layout, fs), page_size })
    }

    /// Decode whole pages read from `cpu`'s buffer, in the order read.
    fn pages(&mut self, py: Python<'_>, cpu: i32, data: &[u8]) -> PyResult<()> {
        let ps = self.page_size;
        let d = &mut self.d;
        detached(py, || d.pages(cpu, data, ps))
    }

    /// Read whole pages from `fd` (`cpu`'s `trace_pipe_raw`, non-blocking)
    /// until the buffer is empty or `max_bytes` are read, as `ktrace_read`
    /// does, decoding them 64 pages at a time as they come: the buffer's
    /// bytes are never all held at once (a drain of 44 MB faulted in a Vec,
    /// its regrowths and a Python copy of it). Returns (bytes read, short
    /// pages padded as the decoder takes them; ns spent decoding). Not
    /// interrupted by a signal: what is read is decoded, and Python's handler
    /// runs after.
    fn read_pages(&mut self, py: Python<'_>, fd: i32, cpu: i32, max_bytes: usize) -> PyResult<(usize, u64)> {
        const BATCH: usize = 64;
        let ps = self.page_size;
        let d = &mut self.d;
        let (total, dec_ns, err) = py.detach(move || {
            let mut buf = vec![0u8; ps * BATCH];
            let mut dec_ns = 0u64;
            let (total, err) = read_pages_into(fd, ps, max_bytes, &mut buf, |b| {
                let t = std::time::Instant::now();
                d.pages(cpu, b, ps);
                dec_ns += t.elapsed().as_nanos() as u64;
            });
            (total, dec_ns, err)
        });
        match err {
            // the pages read before it are decoded and stay taken
            Some(e) => Err(read_error(e)),
            None => Ok((total, dec_ns)),
        }
    }

    /// Set where the previous batch left `cpu` (its last event's time).
    fn set_last_time(&mut self, cpu: i32, t_ns: i64) {
        self.d.set_last_time(cpu, t_ns);
    }

    fn last_times(&self) -> Vec<(i32, i64)> {
        self.d.last_times()
    }

    /// Close loss windows left open by a damaged last page at `end_ns`.
    fn finish(&mut self, end_ns: i64) {
        self.d.finish(end_ns);
    }

    /// Everything decoded since the last call: {column: numpy array},
    /// {lost column: numpy array or list}, the string table, the event names, counts.
    fn take<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        take_dict(py, &mut self.d, |_| {})
    }

    /// Everything decoded since the last call, as `KtraceImport.take_batch`
    /// gives it: the columns stay native, for `KtraceSegments` to cut and write.
    fn take_batch<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (c, o) = take_parts(py, &mut self.d, |_| {}, true)?;
        crate::segment::batch_dict(py, c, o)
    }
}

/// Everything `d` decoded since the last call, as Python columns; `to_ns`
/// turns the recording's stamps into nanoseconds where they are not.
fn take_dict<'py>(py: Python<'py>, d: &mut Decoder, to_ns: impl Fn(&mut [i64])) -> PyResult<Bound<'py, PyDict>> {
    let (c, o) = take_parts(py, d, to_ns, false)?;
    let cols = PyDict::new(py);
    cols.set_item("t_ns", c.t_ns.into_pyarray(py))?;
    cols.set_item("cpu", c.cpu.into_pyarray(py))?;
    cols.set_item("event", c.event.into_pyarray(py))?;
    cols.set_item("pid", c.pid.into_pyarray(py))?;
    cols.set_item("target", c.target.into_pyarray(py))?;
    cols.set_item("target_comm", c.target_comm.into_pyarray(py))?;
    cols.set_item("next_pid", c.next_pid.into_pyarray(py))?;
    cols.set_item("next_comm", c.next_comm.into_pyarray(py))?;
    cols.set_item("prev_state", c.prev_state.into_pyarray(py))?;
    cols.set_item("irq", c.irq.into_pyarray(py))?;
    cols.set_item("name", c.name.into_pyarray(py))?;
    cols.set_item("dest_cpu", c.dest_cpu.into_pyarray(py))?;
    cols.set_item("runtime", c.runtime.into_pyarray(py))?;
    cols.set_item("expires", c.expires.into_pyarray(py))?;
    cols.set_item("softexpires", c.softexpires.into_pyarray(py))?;
    cols.set_item("prio", c.prio.into_pyarray(py))?;
    cols.set_item("next_prio", c.next_prio.into_pyarray(py))?;
    o.set_item("columns", cols)?;
    Ok(o)
}

/// Everything `d` decoded since the last call: its columns, and the rest
/// (losses, strings, event names, counts) as `take_dict` gives it; with
/// `lists` the losses are lists (an import loads no numpy: 45 ms of its start).
pub(crate) fn take_parts<'py>(py: Python<'py>, d: &mut Decoder, to_ns: impl Fn(&mut [i64]), lists: bool) -> PyResult<(Columns, Bound<'py, PyDict>)> {
    let (mut c, mut l) = d.take();
    to_ns(&mut c.t_ns);
    to_ns(&mut l.start_ns);
    to_ns(&mut l.end_ns);
    let o = PyDict::new(py);
    let lost = PyDict::new(py);
    if lists {
        lost.set_item("cpu", l.cpu)?;
        lost.set_item("start_ns", l.start_ns)?;
        lost.set_item("end_ns", l.end_ns)?;
        lost.set_item("events", l.events)?;
    } else {
        lost.set_item("cpu", l.cpu.into_pyarray(py))?;
        lost.set_item("start_ns", l.start_ns.into_pyarray(py))?;
        lost.set_item("end_ns", l.end_ns.into_pyarray(py))?;
        lost.set_item("events", l.events.into_pyarray(py))?;
    }
    lost.set_item("why", l.why)?;
    o.set_item("lost", lost)?;
    o.set_item("strings", d.strings().to_vec())?;
    o.set_item("events", d.events.clone())?;
    let n = d.counts;
    let counts = PyDict::new(py);
    counts.set_item("pages", n.pages)?;
    counts.set_item("records", n.records)?;
    counts.set_item("kept", n.kept)?;
    counts.set_item("unknown_type", n.unknown_type)?;
    counts.set_item("damaged_pages", n.damaged_pages)?;
    o.set_item("counts", counts)?;
    Ok((c, o))
}

enum Source {
    TraceDat(Box<loopscope_ktrace::import::TraceDat>),
    Perf(Box<loopscope_ktrace::import::Perf>),
}

/// A recording of another tool (trace-cmd's trace.dat, perf's perf.data)
/// decoded a batch at a time into the columns `KtraceDecoder` gives.
#[pyclass(module = "loopscope._native", name = "KtraceImport", unsendable)]
pub struct KtraceImport {
    src: Source,
    path: String,
}

fn file_err(path: &str, e: loopscope_ktrace::tracedat::FileError) -> PyErr {
    InputError::new_err(format!("{path}: {e}"))
}

#[pymethods]
impl KtraceImport {
    /// `kind`: "trace.dat" or "perf.data". `sorted_reader`: a perf.data's
    /// records through the linux-perf-data crate's sorted reader even where
    /// the file-order walker reads them (the reference it is tested against).
    #[new]
    #[pyo3(signature = (path, kind, sorted_reader = false))]
    fn new(path: &str, kind: &str, sorted_reader: bool) -> PyResult<Self> {
        use loopscope_ktrace::import::{Perf, TraceDat};
        let src = match kind {
            "trace.dat" => Source::TraceDat(Box::new(TraceDat::open(path).map_err(|e| file_err(path, e))?)),
            "perf.data" => Source::Perf(Box::new(Perf::open(path, !sorted_reader).map_err(|e| file_err(path, e))?)),
            k => return Err(InputError::new_err(format!("{path}: unknown kind of recording {k:?}"))),
        };
        Ok(KtraceImport { src, path: path.to_string() })
    }

    /// What the file says about itself: its format, version, clock, machine,
    /// recorder, CPUs, the formats it describes, and what could not be read.
    fn meta<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = PyDict::new(py);
        let m = match &self.src {
            Source::TraceDat(t) => {
                o.set_item("format", "trace.dat")?;
                o.set_item("clock", &t.clock)?;
                o.set_item("compression", t.meta.compression.map(|c| format!("{c:?}").to_lowercase()))?;
                o.set_item("buffers", t.meta.buffers.iter().map(|b| b.name.clone()).collect::<Vec<_>>())?;
                o.set_item("cpus_with_data", t.meta.buffers.first().map(|b| b.cpus.len()).unwrap_or(0))?;
                o.set_item("bad_formats", &t.bad_formats)?;
                &t.meta
            }
            Source::Perf(p) => {
                o.set_item("format", "perf.data")?;
                o.set_item("clock", "perf")?;
                o.set_item("hostname", &p.hostname)?;
                o.set_item("os_release", &p.os_release)?;
                o.set_item("perf_version", &p.perf_version)?;
                o.set_item("command", &p.command)?;
                o.set_item("nr_cpus", p.nr_cpus)?;
                o.set_item("bad_formats", &p.bad_formats)?;
                &p.meta
            }
        };
        o.set_item("version", m.version)?;
        o.set_item("page_size", m.page_size)?;
        o.set_item("uname", &m.uname)?;
        o.set_item("tool_version", &m.tool_version)?;
        o.set_item("cpu_count", m.cpu_count)?;
        o.set_item("cpustats", &m.cpustats)?;
        o.set_item("header_page", &m.header_page)?;
        o.set_item("formats", m.formats.clone())?;
        o.set_item("cmdlines", m.cmdlines.clone())?;
        Ok(o)
    }

    /// Decode about `records` more records (in time order); False at the end.
    fn next(&mut self, py: Python<'_>, records: u64) -> PyResult<bool> {
        let r = match &mut self.src {
            Source::TraceDat(t) => {
                let t = &mut **t;
                py.detach(move || t.next(records))
            }
            Source::Perf(p) => {
                let p = &mut **p;
                py.detach(move || p.next(records))
            }
        };
        py.check_signals()?;
        r.map_err(|e| file_err(&self.path, e))
    }

    /// Everything decoded since the last call, as `KtraceDecoder.take` gives it.
    fn take<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match &mut self.src {
            Source::TraceDat(t) => {
                let conv = t.conv();
                take_dict(py, &mut t.dec, |x| conv.to_ns(x))
            }
            Source::Perf(p) => take_dict(py, &mut p.dec, |_| {}),
        }
    }

    /// Everything decoded since the last call, as `take` gives it but for the
    /// columns: they stay native, in a `KtraceBatch` for `KtraceSegments.write`
    /// (`batch`), with the batch's size, span and the event codes it holds.
    fn take_batch<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (c, o) = match &mut self.src {
            Source::TraceDat(t) => {
                let conv = t.conv();
                take_parts(py, &mut t.dec, |x| conv.to_ns(x), true)?
            }
            Source::Perf(p) => take_parts(py, &mut p.dec, |_| {}, true)?,
        };
        crate::segment::batch_dict(py, c, o)
    }

    /// The earliest time (ns) an event still to be decoded can have (None:
    /// any, or none left): events taken before it are in their final order.
    /// perf.data's records come in file order, sorted per CPU: what its
    /// rounds' ends say is final (or in time order, through the crate).
    fn watermark_ns(&mut self) -> PyResult<Option<i64>> {
        match &mut self.src {
            Source::TraceDat(t) => t.watermark_ns().map_err(|e| file_err(&self.path, e)),
            Source::Perf(p) => Ok(p.watermark()),
        }
    }

    /// What was damaged past reading: compressed chunks skipped, a CPU's
    /// data ended early, records that stopped reading (each a loss window
    /// of unknown size in the capture).
    fn damage(&self) -> Vec<String> {
        match &self.src {
            Source::TraceDat(t) => t.damage.clone(),
            Source::Perf(p) => p.damage.clone(),
        }
    }

    /// What a perf.data held besides tracepoint samples (None for trace.dat).
    fn perf_counts(&self) -> Option<(u64, u64, u64, u64, u64)> {
        match &self.src {
            Source::Perf(p) => {
                let c = p.counts;
                Some((c.samples, c.not_tracepoints, c.lost_records, c.lost_events, c.other_records))
            }
            Source::TraceDat(_) => None,
        }
    }
}

/// Every activation of chosen threads (crates/ktrace `activations`), fed
/// the capture in time order a batch at a time, then `finish`: memory is the
/// threads' open activations and the rows, not the events.
#[pyclass(module = "loopscope._native", name = "KtraceActivations")]
pub struct KtraceActivations {
    stream: Option<loopscope_ktrace::activations::Stream>,
}

#[pymethods]
impl KtraceActivations {
    /// `tids`: the threads; `lost_start`/`lost_end`: windows of lost events
    /// (an activation overlapping one is incomplete); `top_k`: fold the
    /// activations as they close instead of keeping rows, each thread's
    /// `top_k` outliers kept (`finish_summary`), only those woken inside
    /// `window` (ns, both ends included) when given.
    #[new]
    #[pyo3(signature = (tids, lost_start, lost_end, top_k=None, window=None))]
    fn new(tids: Vec<i64>, lost_start: Vec<i64>, lost_end: Vec<i64>, top_k: Option<usize>, window: Option<(i64, i64)>) -> Self {
        use loopscope_ktrace::activations::{Losses, Out, Sink, Stream, Summary};
        let sink = match top_k {
            Some(k) => Sink::Summary(Summary::new(window, k)),
            None => Sink::Rows(Out::default()),
        };
        KtraceActivations { stream: Some(Stream::into(&tids, Losses::new(lost_start.into_iter().zip(lost_end).collect()), sink)) }
    }

    /// The summary of a folding pass (`crate::threadsum::to_dict`).
    fn finish_summary<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.stream.take().ok_or_else(|| InputError::new_err("KtraceActivations: already finished"))?;
        let sum = py.detach(|| s.finish_summary());
        crate::threadsum::to_dict(py, &sum)
    }

    /// Every event of a stretch of the capture, in time order, as int64
    /// arrays: kind (1 switch, 2 wake-up, 3 sleep timer armed, 4 run time,
    /// else 0), pid, target, next_pid, asleep (1: the switch's previous task
    /// slept), value (an arm's expiry on the capture's clock, a run's ns; -1: none).
    #[allow(clippy::too_many_arguments)]
    fn feed(
        &mut self,
        py: Python<'_>,
        t: PyReadonlyArray1<'_, i64>,
        cpu: PyReadonlyArray1<'_, i64>,
        kind: PyReadonlyArray1<'_, i64>,
        pid: PyReadonlyArray1<'_, i64>,
        target: PyReadonlyArray1<'_, i64>,
        next_pid: PyReadonlyArray1<'_, i64>,
        asleep: PyReadonlyArray1<'_, i64>,
        value: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<()> {
        let (t, cpu, kind, pid, target, next_pid, asleep, value) = (
            t.as_slice()?,
            cpu.as_slice()?,
            kind.as_slice()?,
            pid.as_slice()?,
            target.as_slice()?,
            next_pid.as_slice()?,
            asleep.as_slice()?,
            value.as_slice()?,
        );
        let n = t.len();
        if [cpu.len(), kind.len(), pid.len(), target.len(), next_pid.len(), asleep.len(), value.len()].iter().any(|&l| l != n) {
            return Err(InputError::new_err("KtraceActivations.feed: the columns differ in length"));
        }
        let s = self.stream.as_mut().ok_or_else(|| InputError::new_err("KtraceActivations: already finished"))?;
        let null = loopscope_ktrace::activations::NULL;
        py.detach(|| {
            for i in 0..n {
                let v = if value[i] == -1 { null } else { value[i] };
                s.event(t[i], cpu[i], kind[i], pid[i], target[i], next_pid[i], asleep[i] == 1, v);
            }
        });
        Ok(())
    }

    /// Every event of the capture's files, read here (crates/ktrace
    /// `segment::read`) a run of row ranges at a time on a thread of its own
    /// while this one folds the run before: `runs` as `Store.reads` gives
    /// them, in time order; `kinds`: each event code's kind (as `feed`'s);
    /// `sleep_code`: the string code of a sleep timer's function (-2: none).
    /// An arm of another timer, or without an expiry, is no arm; an arm's
    /// value is its soft expiry, else its hard one. `offsets`: for a
    /// capture on another clock, the capture's clock minus CLOCK_MONOTONIC
    /// along it (`mono_offsets`' t_ns and off_ns, time-sorted): each arm's
    /// expiry is carried by the offset nearest its time (a tie: the later,
    /// as polars' `join_asof(strategy="nearest")` takes it).
    #[pyo3(signature = (runs, kinds, sleep_code, offsets=None))]
    fn feed_files(
        &mut self,
        py: Python<'_>,
        runs: Vec<Vec<(String, usize, usize)>>,
        kinds: Vec<i64>,
        sleep_code: i64,
        offsets: Option<(Vec<i64>, Vec<i64>)>,
    ) -> PyResult<()> {
        let s = self.stream.as_mut().ok_or_else(|| InputError::new_err("KtraceActivations: already finished"))?;
        let near = offsets.map(|(t, off)| loopscope_ktrace::activations::Nearest::new(t, off));
        detached(py, || fold_files(s, &runs, &kinds, sleep_code, near))?.map_err(InputError::new_err)
    }

    /// The rows, by thread id then activation: {column: int64 array (NULL as
    /// int64's minimum), complete: bool array}.
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.stream.take().ok_or_else(|| InputError::new_err("KtraceActivations: already finished"))?;
        let out = py.detach(|| s.finish());
        let o = PyDict::new(py);
        o.set_item("tid", out.tid.into_pyarray(py))?;
        o.set_item("act", out.act.into_pyarray(py))?;
        o.set_item("woken_ns", out.woken.into_pyarray(py))?;
        o.set_item("on_ns", out.on.into_pyarray(py))?;
        o.set_item("off_ns", out.off.into_pyarray(py))?;
        o.set_item("wakeup_latency_ns", out.wakeup_latency.into_pyarray(py))?;
        o.set_item("timer_expires_ns", out.timer_expires.into_pyarray(py))?;
        o.set_item("timer_lateness_ns", out.timer_lateness.into_pyarray(py))?;
        o.set_item("runtime_ns", out.runtime.into_pyarray(py))?;
        o.set_item("preemptions", out.preemptions.into_pyarray(py))?;
        o.set_item("migrations", out.migrations.into_pyarray(py))?;
        o.set_item("period_ns", out.period.into_pyarray(py))?;
        o.set_item("on_bound_ns", out.on_bound.into_pyarray(py))?;
        o.set_item("complete", out.complete.into_pyarray(py))?;
        Ok(o)
    }
}

/// The columns `feed_files` reads, in this order.
const FOLD_COLUMNS: [&str; 11] = ["t_ns", "cpu", "pid", "event", "target", "next_pid", "prev_state", "name", "runtime", "expires", "softexpires"];

/// `feed_files`' work: a reading thread fills buffers a run at a time (two
/// sets of them go round) while this one folds.
fn fold_files(
    s: &mut loopscope_ktrace::activations::Stream,
    runs: &[Vec<(String, usize, usize)>],
    kinds: &[i64],
    sleep_code: i64,
    mut near: Option<loopscope_ktrace::activations::Nearest>,
) -> Result<(), String> {
    use std::sync::mpsc::sync_channel;
    let (full_tx, full_rx) = sync_channel::<Result<Vec<Vec<i64>>, String>>(1);
    let (empty_tx, empty_rx) = sync_channel::<Vec<Vec<i64>>>(2);
    for _ in 0..2 {
        empty_tx.send(vec![Vec::new(); FOLD_COLUMNS.len()]).map_err(|e| e.to_string())?;
    }
    std::thread::scope(|scope| {
        let reader = std::thread::Builder::new().name("ls-threads-read".into()).spawn_scoped(scope, move || {
            let mut files = loopscope_ktrace::segment::read::Files::new(&FOLD_COLUMNS);
            for run in runs {
                let Ok(mut cols) = empty_rx.recv() else { return };
                let got = files.read_run(run, None, &mut cols).map(|()| cols);
                let failed = got.is_err();
                if full_tx.send(got).is_err() || failed {
                    return;
                }
            }
        });
        if let Err(e) = reader {
            return Err(format!("cannot start the reading thread: {e}"));
        }
        let null = loopscope_ktrace::activations::NULL;
        // dropped on any return, so a reader still sending stops
        let full_rx = full_rx;
        for got in full_rx.iter() {
            let c = got?;
            let [t, cpu, pid, event, target, next_pid, prev_state, name, runtime, expires, soft] = &c[..] else { unreachable!() };
            for i in 0..t.len() {
                let mut kind = kinds.get(event[i].clamp(0, kinds.len().max(1) as i64 - 1) as usize).copied().unwrap_or(0);
                let mut value = -1;
                if kind == 3 {
                    if (name[i] == -1 || name[i] == sleep_code) && expires[i] != -1 {
                        value = if soft[i] != -1 { soft[i] } else { expires[i] };
                        if let Some(n) = near.as_mut() {
                            value += n.at(t[i]);
                        }
                    } else {
                        kind = 0;
                    }
                } else if kind == 4 {
                    value = runtime[i];
                }
                s.event(t[i], cpu[i], kind, pid[i], target[i], next_pid[i], prev_state[i] > 0, if value == -1 { null } else { value });
            }
            // the buffers go back to be filled again (the reader may have stopped: then they are dropped)
            let _ = empty_tx.send(c);
        }
        Ok(())
    })
}
