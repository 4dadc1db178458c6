//! A capture's segment files written straight from the decoder's columns.
//!
//! The store (python `kernel.store`) keeps a capture as Parquet files under
//! `events/NNNNN.parquet`: time-sorted events in row groups of `GROUP`,
//! the columns `STORED` names, text as indices into the string table, null
//! where an event has no such field (the decoder's -1). This module writes
//! exactly that, so the interpreter sees only file names and counts: no
//! table is built and nothing is copied through Python.
//!
//! A batch of a trace.dat's pages is in time order per page, not across the
//! CPUs' pages: its events are sorted (stably: equal stamps keep the order
//! they were decoded in), merged after what the last batch held back, and
//! what lies at or after the reader's watermark (an event still to be
//! decoded can be that early) is held back for the next batch. So segments
//! never overlap in time, and a read across their boundary needs no sort.
//!
//! Parquet comes from the Apache Arrow project's Rust implementation
//! (`parquet`, its low-level column writers: no Arrow arrays are built),
//! zstd-compressed. A file is written under a temporary name and renamed
//! when whole: a kill leaves whole files only.

use crate::decode::Columns;
use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::Int64Type;
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::{ColumnPath, SchemaDescriptor};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Events per row group (the store's `GROUP`; its index is per group).
pub const GROUP: usize = 65_536;

/// The stored columns in file order, each an INT64 or an INT32, the first
/// four never null (the store's `STORED`).
const SCHEMA: &str = "message events {
  REQUIRED INT64 t_ns;
  REQUIRED INT32 cpu;
  REQUIRED INT32 pid;
  REQUIRED INT32 event;
  OPTIONAL INT32 target;
  OPTIONAL INT32 target_comm;
  OPTIONAL INT32 next_pid;
  OPTIONAL INT32 next_comm;
  OPTIONAL INT32 prev_state;
  OPTIONAL INT32 irq;
  OPTIONAL INT32 name;
  OPTIONAL INT32 dest_cpu;
  OPTIONAL INT64 runtime;
  OPTIONAL INT64 expires;
  OPTIONAL INT64 softexpires;
  OPTIONAL INT32 prio;
  OPTIONAL INT32 next_prio;
}";

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Parquet { path: PathBuf, source: ParquetError },
}

/// What a written segment holds, for its line in `segments.jsonl`.
#[derive(Debug, Default, PartialEq)]
pub struct Written {
    /// relative to the capture's directory: `events/NNNNN.parquet` (None: no events to write)
    pub file: Option<String>,
    pub events: usize,
    pub t_first_ns: Option<i64>,
    pub t_last_ns: Option<i64>,
    /// each row group's first and last `t_ns`
    pub groups: Vec<(i64, i64)>,
    pub bytes: u64,
    /// when the switches were asked for: each thread they name, with its latest name (a code into the
    /// capture's strings), by thread id
    pub names: Option<Vec<(i32, i32)>>,
}

/// Cuts a capture's batches into segments in time order, holding back what
/// a later batch can still precede.
#[derive(Default)]
pub struct Cutter {
    carry: Columns,
    /// hand each cut's batch back once written (`Columns::recycle`), for a later batch to fill, and keep the
    /// keys' and lanes' room from one cut to the next (else freed: a drain's reader holds nothing between drains)
    pub recycle: bool,
    keys: Vec<(i64, u32)>,
    lanes: Vec<Vec<(i64, u32)>>,
}

/// A segment's events: what the last cut held back and a batch, in the
/// order `ranks` gives (into the held events, then the batch's), or the
/// batch alone when it was in order already. The events are moved into
/// place only as each row group is written, on the writing thread.
pub struct Cut {
    held: Columns,
    batch: Columns,
    ranks: Option<Vec<u32>>,
    recycle: bool,
}

impl Drop for Cut {
    fn drop(&mut self) {
        if self.recycle {
            std::mem::take(&mut self.batch).recycle();
        }
    }
}

impl Cut {
    /// A batch in time order, as it is.
    pub fn sorted(batch: Columns) -> Self {
        Cut { held: Columns::default(), batch, ranks: None, recycle: false }
    }

    pub fn len(&self) -> usize {
        self.ranks.as_ref().map_or(self.batch.t_ns.len(), |r| r.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows `a..b`'s values of one column (`of` picks it from a batch) into `out`.
    fn rows<'a, T: Copy>(&'a self, of: impl Fn(&'a Columns) -> &'a [T], a: usize, b: usize, out: &'a mut Vec<T>) -> &'a [T] {
        match &self.ranks {
            None => &of(&self.batch)[a..b],
            Some(ranks) => {
                let (h, x) = (of(&self.held), of(&self.batch));
                out.clear();
                out.extend(ranks[a..b].iter().map(|&r| {
                    let r = r as usize;
                    if r < h.len() {
                        h[r]
                    } else {
                        x[r - h.len()]
                    }
                }));
                out
            }
        }
    }

    /// Rows `a..b` of a nullable column (`of` picks it) as `present` gives
    /// them, gathered and sifted in one pass.
    fn present_rows<'a, T: Default + Copy + PartialOrd + 'a>(
        &'a self,
        of: impl Fn(&'a Columns) -> &'a [T],
        a: usize,
        b: usize,
        vals: &mut Vec<T>,
        def: &mut Vec<i16>,
    ) {
        match &self.ranks {
            None => present(vals, def, of(&self.batch)[a..b].iter().copied()),
            Some(ranks) => {
                let (h, x) = (of(&self.held), of(&self.batch));
                present(vals, def, ranks[a..b].iter().map(|&r| h.get(r as usize).copied().unwrap_or_else(|| x[r as usize - h.len()])));
            }
        }
    }

    /// Row `i`'s value of one column (`of` picks it from a batch).
    fn at<T: Copy>(&self, of: impl Fn(&Columns) -> &[T], i: usize) -> T {
        match &self.ranks {
            None => of(&self.batch)[i],
            Some(ranks) => {
                let (r, h) = (ranks[i] as usize, of(&self.held));
                if r < h.len() {
                    h[r]
                } else {
                    of(&self.batch)[r - h.len()]
                }
            }
        }
    }

    fn t(&self, i: usize) -> i64 {
        let mut one = Vec::with_capacity(1);
        self.rows(|c| &c.t_ns, i, i + 1, &mut one)[0]
    }
}

impl Cutter {
    /// `batch` with what was held back, time-sorted, up to `watermark`
    /// (all of it when None); what lies at or after it is held back.
    pub fn cut(&mut self, batch: Columns, watermark: Option<i64>) -> Cut {
        let held = std::mem::take(&mut self.carry);
        let in_order = |t: &[i64]| t.windows(2).all(|w| w[0] <= w[1]);
        if held.t_ns.is_empty() && in_order(&batch.t_ns) && watermark.is_none_or(|w| batch.t_ns.last().is_none_or(|&t| t < w)) {
            // a batch already final (the last of a file's, often): nothing to move
            return Cut { held: Columns::default(), batch, ranks: None, recycle: self.recycle };
        }
        let mut keys = std::mem::take(&mut self.keys);
        in_time_order(&held, &batch, &mut keys, &mut self.lanes);
        let cut = match watermark {
            Some(w) => keys.partition_point(|k| k.0 < w),
            None => keys.len(),
        };
        self.carry = gather(&held, &batch, &keys[cut..]);
        let ranks = Some(keys[..cut].iter().map(|k| k.1).collect());
        if self.recycle {
            self.keys = keys;
        } else {
            self.lanes = Vec::new();
        }
        Cut { held, batch, ranks, recycle: self.recycle }
    }

    /// The events held back (written with the next batch, or by a cut with no watermark).
    pub fn held(&self) -> usize {
        self.carry.t_ns.len()
    }
}

/// The (stamp, rank) keys of `held` then `batch` in time order. What was
/// held back ranks first, so equal stamps keep the order they were decoded
/// in (the ranks make every key distinct: any sort gives this one order).
///
/// A CPU's events come in time order (its ring buffer is written in order),
/// and a batch interleaves the CPUs by page or by round. So the keys are
/// dealt into one lane per CPU and the lanes merged, in O(n log k) for k
/// CPUs, where a sort of the whole batch took 10 % of an import's CPU time.
/// A lane out of order (a clock that stepped back) sends the batch to a sort.
///
/// `merged` receives the keys; `lanes` is room kept from one call to the next.
fn in_time_order(held: &Columns, batch: &Columns, merged: &mut Vec<(i64, u32)>, lanes: &mut Vec<Vec<(i64, u32)>>) {
    let nh = held.t_ns.len();
    let n = nh + batch.t_ns.len();
    let stamps = held.t_ns.iter().chain(&batch.t_ns);
    let cpus = held.cpu.iter().chain(&batch.cpu);
    let mut lane_of: Vec<u32> = Vec::new(); // CPU + 1 → lane + 1 (0: none yet)
    let mut used = 0;
    merged.clear();
    merged.reserve(n);
    let mut dealt = true;
    for (r, (&t, &c)) in stamps.zip(cpus).enumerate() {
        merged.push((t, r as u32));
        if !dealt {
            continue;
        }
        let slot = (c as i64 + 1) as usize;
        if c < -1 || slot >= 1 << 16 {
            dealt = false;
            continue;
        }
        if slot >= lane_of.len() {
            lane_of.resize(slot + 1, 0);
        }
        if lane_of[slot] == 0 {
            if used == lanes.len() {
                lanes.push(Vec::new());
            }
            lanes[used].clear();
            lanes[used].reserve(n / 2);
            used += 1;
            lane_of[slot] = used as u32;
        }
        let lane = &mut lanes[lane_of[slot] as usize - 1];
        if lane.last().is_some_and(|&(last, _)| last > t) {
            dealt = false;
            continue;
        }
        lane.push((t, r as u32));
    }
    if merged.windows(2).all(|w| w[0] <= w[1]) {
        return;
    }
    if !dealt {
        merged.sort_unstable();
        return;
    }
    merged.clear();
    let lanes = &lanes[..used];
    if let [a, b] = lanes {
        merge_two(a, b, merged);
        return;
    }
    let mut at = vec![0usize; lanes.len()];
    let mut heads: std::collections::BinaryHeap<std::cmp::Reverse<((i64, u32), usize)>> =
        lanes.iter().enumerate().filter_map(|(l, v)| v.first().map(|&k| std::cmp::Reverse((k, l)))).collect();
    while let Some(std::cmp::Reverse((k, l))) = heads.pop() {
        merged.push(k);
        at[l] += 1;
        if let Some(&next) = lanes[l].get(at[l]) {
            heads.push(std::cmp::Reverse((next, l)));
        }
    }
}

/// Two sorted lanes merged into `out`.
fn merge_two(a: &[(i64, u32)], b: &[(i64, u32)], out: &mut Vec<(i64, u32)>) {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] <= b[j] {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
}

/// How segment files are written (shared by the threads writing them).
pub type Properties = Arc<WriterProperties>;

/// The writer's settings: zstd at `level`, statistics per row group, Parquet
/// 2.0 pages (the integer columns a dictionary does not fit delta-encoded,
/// levels left out of the compression). Against 1.0 pages, an import of a
/// busy trace took 10 % less CPU, its files 10 % less room, and `threads`
/// read them 10 % faster; polars, DuckDB and the `parquet` crate read both.
pub fn properties(level: i32) -> Result<Properties, ParquetError> {
    Ok(Arc::new(
        WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_write_batch_size(8192)
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(level)?))
            // readers skip row groups by their minima and maxima of an event's code and a time, no other column's;
            // pages are not indexed
            .set_statistics_enabled(EnabledStatistics::None)
            .set_column_statistics_enabled("t_ns".into(), EnabledStatistics::Chunk)
            .set_column_statistics_enabled("event".into(), EnabledStatistics::Chunk)
            // stamps, run times and expiry times are nearly all distinct: a dictionary of them only costs its try
            .set_column_dictionary_enabled("t_ns".into(), false)
            .set_column_dictionary_enabled("runtime".into(), false)
            .set_column_dictionary_enabled("expires".into(), false)
            .set_column_dictionary_enabled("softexpires".into(), false)
            // delta-encoded stamps and run times do not shrink under zstd (ratio 1.00 on a 10.7 M-event import):
            // compressing them only cost the writer its try, and a reader its pass
            .set_column_compression("t_ns".into(), Compression::UNCOMPRESSED)
            .set_column_compression("runtime".into(), Compression::UNCOMPRESSED)
            // nothing reads pages by their offsets
            .set_offset_index_disabled(true)
            .build(),
    ))
}

/// Write `c` (time-sorted, as `Cutter::cut` gives) as segment `seg` of the
/// capture in `dir`: `events/NNNNN.parquet`, under a temporary name renamed
/// when whole. Segments are independent: several can be written at once.
/// With `switch` (the code of `sched_switch` among the capture's events),
/// also the threads the segment's switches name (`Written::names`), so that
/// a reader finds threads by name without reading every switch again.
pub fn write(dir: &Path, props: &Properties, seg: u32, c: &Cut, switch: Option<i32>) -> Result<Written, WriteError> {
    let n = c.len();
    let mut out = Written { events: n, names: switch.map(|s| switch_names(c, s)), ..Default::default() };
    if n == 0 {
        return Ok(out);
    }
    out.t_first_ns = Some(c.t(0));
    out.t_last_ns = Some(c.t(n - 1));
    let name = format!("{seg:05}.parquet");
    let path = dir.join("events").join(&name);
    let tmp = path.with_extension("tmp");
    let written = write_file(&tmp, props, c).and_then(|groups| {
        std::fs::rename(&tmp, &path).map_err(|source| WriteError::Io { path: path.clone(), source })?;
        Ok(groups)
    });
    match written {
        Ok(groups) => out.groups = groups,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    }
    out.bytes = std::fs::metadata(&path).map(|m| m.len()).map_err(|source| WriteError::Io { path: path.clone(), source })?;
    out.file = Some(format!("events/{name}"));
    Ok(out)
}

/// Thread ids up to this are kept in a vector (the kernel's largest `pid_max`); a larger one (a damaged file's) in a map.
const PID_MAX: usize = 1 << 22;

/// Each thread named by a switch of `c` (either side), with the latest name it had there, by thread id.
pub fn switch_names(c: &Cut, switch: i32) -> Vec<(i32, i32)> {
    let n = c.len();
    let sides: [(fn(&Columns) -> &[i32], fn(&Columns) -> &[i32]); 2] = [(|x| &x.target, |x| &x.target_comm), (|x| &x.next_pid, |x| &x.next_comm)];
    // by thread id, its name's code + 1 (0: none seen)
    let mut dense: Vec<i32> = Vec::new();
    let mut other: std::collections::BTreeMap<i32, i32> = std::collections::BTreeMap::new();
    for i in (0..n).filter(|&i| c.at(|x| &x.event, i) == switch) {
        // only a switch's own fields are looked up (a gather of whole columns cost the import 3 %)
        for &(tids, comms) in &sides {
            let (tid, comm) = (c.at(tids, i), c.at(comms, i));
            if tid <= 0 || comm < 0 {
                continue;
            }
            let k = tid as usize;
            if k < PID_MAX {
                if k >= dense.len() {
                    dense.resize(k + 1, 0);
                }
                dense[k] = comm + 1;
            } else {
                other.insert(tid, comm);
            }
        }
    }
    let mut out: Vec<(i32, i32)> = dense.iter().enumerate().filter(|x| *x.1 > 0).map(|(t, &c)| (t as i32, c - 1)).collect();
    out.extend(other);
    out
}

fn write_file(path: &Path, props: &Properties, c: &Cut) -> Result<Vec<(i64, i64)>, WriteError> {
    let pq = |source| WriteError::Parquet { path: path.to_path_buf(), source };
    let file = File::create(path).map_err(|source| WriteError::Io { path: path.to_path_buf(), source })?;
    let schema = Arc::new(parse_message_type(SCHEMA).map_err(pq)?);
    let descr = SchemaDescriptor::new(schema.clone());
    let codec = props.compression(&ColumnPath::from("cpu"));
    let Compression::ZSTD(level) = codec else {
        return Err(pq(ParquetError::General(format!("segment files are written with zstd, not {codec}"))));
    };
    let mut dw = dict::DictWriter::new(level.compression_level(), codec).map_err(pq)?;
    let mut w = SerializedFileWriter::new(BufWriter::with_capacity(1 << 20, file), schema, props.clone()).map_err(pq)?;
    let n = c.len();
    let mut groups = Vec::with_capacity(n.div_ceil(GROUP));
    let (mut v32, mut v64, mut def) = (Vec::with_capacity(GROUP), Vec::with_capacity(GROUP), Vec::with_capacity(GROUP));
    // a row group's values of one column, moved into place (when the cut is not in order already)
    let (mut in32, mut in64): (Vec<i32>, Vec<i64>) = (Vec::with_capacity(GROUP), Vec::with_capacity(GROUP));
    for a in (0..n).step_by(GROUP) {
        let b = (a + GROUP).min(n);
        let mut g = w.next_row_group().map_err(pq)?;
        for k in 0..descr.num_columns() {
            let (bytes, close) = match column(k) {
                Col::Long(of, nullable) => {
                    let Some(mut col) = g.next_column().map_err(pq)? else { break };
                    let typed = col.typed::<Int64Type>();
                    if nullable {
                        c.present_rows(of, a, b, &mut v64, &mut def);
                        typed.write_batch(&v64, Some(&def), None)
                    } else {
                        let v = c.rows(of, a, b, &mut in64);
                        groups.push((v[0], v[v.len() - 1]));
                        typed.write_batch(v, None, None)
                    }
                    .map_err(pq)?;
                    col.close().map_err(pq)?;
                    continue;
                }
                // readers skip row groups by the event codes' minimum and maximum
                Col::Int(of) => dw.chunk(descr.column(k), b - a, c.rows(of, a, b, &mut in32), None, k == EVENT),
                Col::Narrow(of) => {
                    c.present_rows(of, a, b, &mut v32, &mut def);
                    dw.chunk(descr.column(k), b - a, &v32, Some(&def), false)
                }
            }
            .map_err(pq)?;
            g.append_column(&bytes, close).map_err(pq)?;
        }
        g.close().map_err(pq)?;
    }
    let inner = w.into_inner().map_err(pq)?;
    inner.into_inner().map_err(|e| WriteError::Io { path: path.to_path_buf(), source: e.into_error() })?;
    Ok(groups)
}

/// `event`'s place in `SCHEMA`.
const EVENT: usize = 3;

/// One decoded column as stored (how to find it in a batch): an INT64
/// (nullable or not: null is a negative value, the event has no such
/// field), an INT32 never null, or `Narrow`: a nullable INT32.
enum Col {
    Long(fn(&Columns) -> &[i64], bool),
    Int(fn(&Columns) -> &[i32]),
    Narrow(fn(&Columns) -> &[i32]),
}

/// Column `k` of `SCHEMA`.
fn column(k: usize) -> Col {
    match k {
        0 => Col::Long(|c| &c.t_ns, false),
        1 => Col::Int(|c| &c.cpu),
        2 => Col::Int(|c| &c.pid),
        3 => Col::Int(|c| &c.event),
        4 => Col::Narrow(|c| &c.target),
        5 => Col::Narrow(|c| &c.target_comm),
        6 => Col::Narrow(|c| &c.next_pid),
        7 => Col::Narrow(|c| &c.next_comm),
        8 => Col::Narrow(|c| &c.prev_state),
        9 => Col::Narrow(|c| &c.irq),
        10 => Col::Narrow(|c| &c.name),
        11 => Col::Narrow(|c| &c.dest_cpu),
        12 => Col::Long(|c| &c.runtime, true),
        13 => Col::Long(|c| &c.expires, true),
        14 => Col::Long(|c| &c.softexpires, true),
        15 => Col::Narrow(|c| &c.prio),
        _ => Col::Narrow(|c| &c.next_prio),
    }
}

/// The values of `src` that are there (not negative) into `vals`, and a
/// definition level per value (1: there, 0: null) into `def`.
///
/// Without a branch on presence: every value is written at the next free
/// place, which moves on only past a value that is there. Events of
/// different kinds interleave, so such a branch mispredicted often (it was
/// the writer's hottest instruction).
fn present<T: Default + Copy + PartialOrd>(vals: &mut Vec<T>, def: &mut Vec<i16>, src: impl ExactSizeIterator<Item = T>) {
    let n = src.len();
    vals.clear();
    vals.resize(n, T::default());
    def.clear();
    def.resize(n, 0);
    let mut k = 0;
    for (v, d) in src.zip(def.iter_mut()) {
        let there = v >= T::default();
        *d = there as i16;
        vals[k] = v;
        k += there as usize;
    }
    vals.truncate(k);
}

/// The events `keys` name (by rank: `a`'s first, then `b`'s), in that order.
fn gather(a: &Columns, b: &Columns, keys: &[(i64, u32)]) -> Columns {
    let na = a.t_ns.len();
    macro_rules! pick {
        ($($f:ident),*) => {
            Columns { $($f: keys.iter().map(|&(_, r)| { let r = r as usize; if r < na { a.$f[r] } else { b.$f[r - na] } }).collect(),)* }
        };
    }
    pick!(t_ns, cpu, event, pid, target, target_comm, next_pid, next_comm, prev_state, irq, name, dest_cpu, runtime, expires, softexpires, prio, next_prio)
}

mod dict;
pub mod read;

/// The tests' random numbers below `m` (xorshift64 from `seed`): repeatable, no crate for it.
#[cfg(test)]
fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |m| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    }
}

#[cfg(test)]
mod tests;
