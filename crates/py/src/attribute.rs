//! Attribution's entry point (`ktrace_attribute`): a cluster's events fed
//! to the native split (crates/ktrace `attrib`) a chunk at a time, as the
//! caller's arrays (int32 chunks widened into buffers kept from one chunk to
//! the next, never the whole cluster joined), or batch by batch from an
//! iterable (a long window's row groups, read as they are split), or read
//! here from the capture's files by row ranges (crates/ktrace
//! `segment::read`: no array is made); and the splits handed back as columns.

use super::attrcols::{attribute_columns, joined, Chunk, Held, COLUMNS};
use super::{detached, strtable, InputError};
use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::borrow::Cow;

/// Split a cluster of windows into causes (crates/ktrace `attrib`).
///
/// `cols`: the events' columns, each an int64 or int32 array or a list of them
/// (chunks in time order; -1: no value), text columns
/// as indices into `comms` (target_comm, next_comm), `states` (prev_state),
/// `names` (name) and `event_names` (event); or an iterable of such dicts,
/// each later than the one before, taken one at a time (a long cluster's
/// events, read as they are split: only one of them is held); or `(a, b,
/// runs)`: the events with a <= t_ns <= b of the capture's files, each run a
/// list of (file, first row, row after the last) whose times may interleave,
/// the runs in time order, each read and fed here in turn. `lost_at`:
/// (cpu, start, end, events) arrays of the capture's placed losses, or None
/// when they cannot be placed. Windows: `w_id`, `w_tid`, `w_a`, `w_b`
/// (kernel CLOCK_MONOTONIC) and `w_span`. Returns one row per (window,
/// cause) — `id`, `cause` (index into `causes`), `ns` — and per window `cpu`
/// (-1: none), `migrations`, `page_faults`, `complete`, `missing` (None or
/// the reason).
#[pyfunction]
#[pyo3(signature = (cols, event_names, comms, states, names, role_tids, role_labels, perf_is_lab, lost, lost_at, t_first, t_last, w_id, w_tid, w_a, w_b, w_span, group_tids=None, group_paths=None))]
#[allow(clippy::too_many_arguments)]
pub fn ktrace_attribute<'py>(
    py: Python<'py>,
    cols: &Bound<'py, PyAny>,
    event_names: Vec<String>,
    comms: &Bound<'py, PyAny>,
    states: &Bound<'py, PyAny>,
    names: &Bound<'py, PyAny>,
    role_tids: Vec<i64>,
    role_labels: Vec<String>,
    perf_is_lab: bool,
    lost: i64,
    lost_at: Option<(Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>)>,
    t_first: i64,
    t_last: i64,
    w_id: PyReadonlyArray1<'py, i64>,
    w_tid: PyReadonlyArray1<'py, i64>,
    w_a: PyReadonlyArray1<'py, i64>,
    w_b: PyReadonlyArray1<'py, i64>,
    w_span: PyReadonlyArray1<'py, bool>,
    group_tids: Option<Vec<i64>>,
    group_paths: Option<Vec<String>>,
) -> PyResult<Bound<'py, PyDict>> {
    use loopscope_ktrace::attrib::{tids_of, Context, Kernel, Window};
    let (comms, states, names) = (strtable::table(comms)?, strtable::table(states)?, strtable::table(names)?);
    let wins: Vec<Window> = {
        let (i, t, a, b, s) = (w_id.as_slice()?, w_tid.as_slice()?, w_a.as_slice()?, w_b.as_slice()?, w_span.as_slice()?);
        (0..i.len()).map(|k| Window { id: i[k], tid: t[k], a: a[k], b: b[k], span: s[k] }).collect()
    };
    let ctx = Context {
        roles: role_tids.into_iter().zip(role_labels).collect(),
        perf_is_lab,
        lost,
        lost_at: lost_at.map(|(c, s, e, n)| c.into_iter().zip(s).zip(e).zip(n).map(|(((c, s), e), n)| (c, s, e, n)).collect()),
        t_first,
        t_last,
        groups: group_tids.unwrap_or_default().into_iter().zip(group_paths.unwrap_or_default()).collect(),
    };
    let mut k = Kernel::start(&ctx, &event_names, &comms, &tids_of(&wins));
    let tables = Tables { event_names: &event_names, comms: &comms, states: &states, names: &names };
    let mut buf = Widened::default();
    if let Ok((a, b, runs)) = cols.extract::<(i64, i64, Vec<Vec<(String, usize, usize)>>)>() {
        detached(py, || buf.read(&mut k, a, b, &runs, &tables))?.map_err(InputError::new_err)?;
        let splits = detached(py, move || k.split_all(&wins))?;
        return splits_dict(py, splits);
    }
    let mut feed = |d: &Bound<'py, PyDict>| -> PyResult<()> {
        let held = attribute_columns(d)?;
        let chunks: Vec<Option<Vec<Chunk<'_>>>> = held.iter().map(|h| h.as_ref().map(|v| v.iter().map(Held::chunk).collect())).collect();
        // the pass (and any widening) beside the caller's next read
        detached(py, || buf.feed(&mut k, &chunks, &tables))?.map_err(InputError::new_err)
    };
    match cols.cast::<PyDict>() {
        Ok(d) => feed(d)?,
        Err(_) => {
            for item in cols.try_iter()? {
                let item = item?;
                let d = item.cast::<PyDict>().map_err(|_| InputError::new_err("ktrace_attribute: an iterable of column dicts yielded something else"))?;
                feed(d)?;
            }
        }
    }
    let splits = detached(py, move || k.split_all(&wins))?;
    splits_dict(py, splits)
}

/// The string tables every chunk's events index.
struct Tables<'a> {
    event_names: &'a [String],
    comms: &'a [String],
    states: &'a [String],
    names: &'a [String],
}

/// Buffers an int32 chunk is widened into (kept from one chunk to the
/// next), and the latest time fed so far.
#[derive(Default)]
struct Widened {
    cols: Vec<Vec<i64>>,
    last: Option<i64>,
}

/// The earliest and latest time of a chunk of `t_ns` (None: empty).
fn bounds(c: Chunk<'_>) -> Option<(i64, i64)> {
    let f = |it: &mut dyn Iterator<Item = i64>| it.fold(None, |m: Option<(i64, i64)>, v| Some(m.map_or((v, v), |(a, b)| (a.min(v), b.max(v)))));
    match c {
        Chunk::I64(s) => f(&mut s.iter().copied()),
        Chunk::I32(s) => f(&mut s.iter().map(|&v| v as i64)),
    }
}

impl Widened {
    /// Feed `k` the events of `chunks` (per column, chunks in time order),
    /// a chunk at a time when every column is cut alike (the store's row
    /// groups) and each chunk lies after the one before, else joined into
    /// one (sorted by the pass). A batch that begins before an earlier one
    /// ended cannot be split right: said, not split.
    fn feed(&mut self, k: &mut loopscope_ktrace::attrib::Kernel<'_>, chunks: &[Option<Vec<Chunk<'_>>>], t: &Tables<'_>) -> Result<(), String> {
        let lens: Vec<usize> = chunks[0].as_deref().map_or_else(Vec::new, |c| c.iter().map(|x| x.len()).collect());
        let spans: Vec<(i64, i64)> = chunks[0].as_deref().unwrap_or_default().iter().filter_map(|&c| bounds(c)).collect();
        if let (Some(last), Some(&(first, _))) = (self.last, spans.iter().min()) {
            if first < last {
                return Err(format!(
                    "ktrace_attribute: a batch of events begins at {first} ns, before the {last} ns an earlier batch reached: batches must come in time order"
                ));
            }
        }
        self.last = spans.iter().map(|s| s.1).max().max(self.last);
        let ordered = spans.windows(2).all(|w| w[0].1 <= w[1].0);
        let alike = chunks.iter().flatten().all(|c| c.len() == lens.len() && c.iter().zip(&lens).all(|(x, &n)| x.len() == n));
        if !alike || !ordered {
            let n: usize = lens.iter().sum();
            let o: Vec<Cow<'_, [i64]>> = chunks.iter().map(|c| c.as_deref().map_or_else(|| vec![-1; n].into(), joined)).collect();
            k.feed(&events(&o, t));
            return Ok(());
        }
        self.cols.resize_with(chunks.len(), Vec::new);
        for (j, &n) in lens.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let mut o: Vec<Cow<'_, [i64]>> = Vec::with_capacity(chunks.len());
            for (c, b) in chunks.iter().zip(self.cols.iter_mut()) {
                o.push(match c.as_ref().map(|v| v[j]) {
                    Some(Chunk::I64(s)) => Cow::Borrowed(s),
                    Some(Chunk::I32(s)) => {
                        b.clear();
                        b.extend(s.iter().map(|&v| v as i64));
                        Cow::Borrowed(&b[..])
                    }
                    None => {
                        b.clear();
                        b.resize(n, -1);
                        Cow::Borrowed(&b[..])
                    }
                });
            }
            k.feed(&events(&o, t));
        }
        Ok(())
    }
}

impl Widened {
    /// Feed `k` the events with a <= t_ns <= b of `runs` (crates/ktrace
    /// `segment::read`), read into this one's buffers a run at a time: a run
    /// whose ranges interleave in time is sorted (stably) first.
    fn read(
        &mut self,
        k: &mut loopscope_ktrace::attrib::Kernel<'_>,
        a: i64,
        b: i64,
        runs: &[Vec<(String, usize, usize)>],
        t: &Tables<'_>,
    ) -> Result<(), String> {
        let mut files = loopscope_ktrace::segment::read::Files::new(&COLUMNS);
        self.cols.resize_with(COLUMNS.len(), Vec::new);
        for run in runs {
            files.read_run(run, Some((a, b)), &mut self.cols)?;
            let tt = &self.cols[0];
            let (x, y) = (tt.partition_point(|&v| v < a), tt.partition_point(|&v| v <= b));
            if y <= x {
                continue;
            }
            if let Some(last) = self.last.filter(|&l| tt[x] < l) {
                return Err(format!(
                    "ktrace_attribute: a run of rows begins at {} ns, before the {last} ns an earlier run reached: runs must come in time order",
                    tt[x]
                ));
            }
            self.last = Some(tt[y - 1]);
            let o: Vec<Cow<'_, [i64]>> = self.cols.iter().map(|c| Cow::Borrowed(&c[x..y])).collect();
            k.feed(&events(&o, t));
        }
        Ok(())
    }
}

/// The split's view of one chunk's columns (in `attrcols::COLUMNS`' order).
fn events<'a>(o: &'a [Cow<'a, [i64]>], t: &Tables<'a>) -> loopscope_ktrace::attrib::Events<'a> {
    loopscope_ktrace::attrib::Events {
        t_ns: &o[0],
        cpu: &o[1],
        event: &o[2],
        pid: &o[3],
        target: &o[4],
        target_comm: &o[5],
        next_pid: &o[6],
        next_comm: &o[7],
        prev_state: &o[8],
        name: &o[9],
        runtime: &o[10],
        expires: &o[11],
        softexpires: &o[12],
        prio: &o[13],
        next_prio: &o[14],
        event_names: t.event_names,
        comms: t.comms,
        states: t.states,
        names: t.names,
    }
}

/// The splits as the columns Python reads: a row per (window, cause), its
/// part before the wake-up (-1: none recorded), and per window its CPU,
/// counts, completeness and what rtla's rule blames.
fn splits_dict(py: Python<'_>, splits: Vec<loopscope_ktrace::attrib::Split>) -> PyResult<Bound<'_, PyDict>> {
    let (mut r_id, mut r_cause, mut r_ns, mut r_pre) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut table: Vec<String> = Vec::new();
    let mut index: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    let (mut w_ids, mut cpu, mut migr, mut pf, mut complete, mut missing) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut rule = Vec::new();
    for s in splits {
        for (c, ns) in s.causes {
            // the part of this cause before the wake-up (-1: no wake-up recorded)
            let pre = match &s.before {
                Some(b) => b.iter().find(|x| x.0 == c).map_or(0, |x| x.1),
                None => -1,
            };
            let k = *index.entry(c.clone()).or_insert_with(|| {
                table.push(c);
                table.len() as i64 - 1
            });
            r_id.push(s.id);
            r_cause.push(k);
            r_ns.push(ns);
            r_pre.push(pre);
        }
        w_ids.push(s.id);
        cpu.push(s.cpu.unwrap_or(-1));
        migr.push(s.migrations);
        pf.push(s.page_faults);
        complete.push(s.complete);
        missing.push(s.missing);
        rule.push(s.rule);
    }
    let o = PyDict::new(py);
    o.set_item("id", r_id.into_pyarray(py))?;
    o.set_item("cause", r_cause.into_pyarray(py))?;
    o.set_item("ns", r_ns.into_pyarray(py))?;
    o.set_item("before_ns", r_pre.into_pyarray(py))?;
    o.set_item("causes", table)?;
    o.set_item("w_id", w_ids.into_pyarray(py))?;
    o.set_item("cpu", cpu.into_pyarray(py))?;
    o.set_item("migrations", migr.into_pyarray(py))?;
    o.set_item("page_faults", pf.into_pyarray(py))?;
    o.set_item("complete", complete.into_pyarray(py))?;
    o.set_item("missing", missing)?;
    o.set_item("rule", rule)?;
    Ok(o)
}

/// Each CPU's picture as the split reads it (crates/ktrace `attrib`,
/// `Kernel::pictures`), for a timeline to draw: `cols` one dict of columns
/// as `ktrace_attribute` takes them. Returns {cpu: (run_s, run_e, run_pid,
/// run_label, irq_s, irq_e, irq_label)}, each CPU's runs and interrupt
/// segments in time order, labelled as causes are.
#[pyfunction]
#[pyo3(signature = (cols, event_names, comms, states, names, role_tids, role_labels, perf_is_lab, t_first, t_last))]
#[allow(clippy::too_many_arguments)]
pub fn ktrace_cpu_pictures<'py>(
    py: Python<'py>,
    cols: &Bound<'py, PyDict>,
    event_names: Vec<String>,
    comms: &Bound<'py, PyAny>,
    states: &Bound<'py, PyAny>,
    names: &Bound<'py, PyAny>,
    role_tids: Vec<i64>,
    role_labels: Vec<String>,
    perf_is_lab: bool,
    t_first: i64,
    t_last: i64,
) -> PyResult<Bound<'py, PyDict>> {
    use loopscope_ktrace::attrib::{Context, Kernel};
    let (comms, states, names) = (strtable::table(comms)?, strtable::table(states)?, strtable::table(names)?);
    let roles = role_tids.into_iter().zip(role_labels).collect();
    let ctx = Context { roles, perf_is_lab, lost: 0, lost_at: None, t_first, t_last, groups: Default::default() };
    let mut k = Kernel::start(&ctx, &event_names, &comms, &[]);
    let tables = Tables { event_names: &event_names, comms: &comms, states: &states, names: &names };
    let held = attribute_columns(cols)?;
    let chunks: Vec<Option<Vec<Chunk<'_>>>> = held.iter().map(|h| h.as_ref().map(|v| v.iter().map(Held::chunk).collect())).collect();
    let mut buf = Widened::default();
    detached(py, || buf.feed(&mut k, &chunks, &tables))?.map_err(InputError::new_err)?;
    let pictures = detached(py, move || k.pictures())?;
    let o = PyDict::new(py);
    for p in pictures {
        let (rs, re, rp, rl): (Vec<i64>, Vec<i64>, Vec<i64>, Vec<String>) = p.runs.into_iter().fold(Default::default(), |mut a, (s, e, t, l)| {
            a.0.push(s);
            a.1.push(e);
            a.2.push(t);
            a.3.push(l);
            a
        });
        let (is, ie, il): (Vec<i64>, Vec<i64>, Vec<String>) = p.irqs.into_iter().fold(Default::default(), |mut a, (s, e, l)| {
            a.0.push(s);
            a.1.push(e);
            a.2.push(l);
            a
        });
        o.set_item(p.cpu, (rs.into_pyarray(py), re.into_pyarray(py), rp.into_pyarray(py), rl, is.into_pyarray(py), ie.into_pyarray(py), il))?;
    }
    Ok(o)
}

/// How attribution names a task (the one rule, for Python's callers too).
#[pyfunction]
#[pyo3(signature = (comm, pid, perf_is_lab=false))]
pub fn ktrace_task_label(comm: &str, pid: i64, perf_is_lab: bool) -> String {
    loopscope_ktrace::attrib::task_label(comm, pid, &std::collections::HashMap::new(), perf_is_lab)
}
