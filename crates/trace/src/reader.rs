//! Reading a trace back into columns.
//!
//! Two passes over the file. The first walks the chunk headers, checks both
//! CRCs, collects all metadata (the timestamp conversion needs every
//! calibration pair before any record is converted) and remembers where the
//! intact data chunks are. A damaged chunk is skipped and counted, a damaged
//! header is skipped by resynchronising on the next intact one, and a file
//! that ends inside a chunk reports how many bytes were lost: none of these is
//! an error. The second pass decodes the records of the intact data chunks
//! into plain column vectors, which the Python side hands to numpy without
//! copying. An error is returned only for input that is not a trace, a format
//! this reader does not know, or an intact chunk whose contents contradict the
//! namespace (a writer bug, never silent).

use crate::clock::{CalPair, ClockKind, RawToMono};
use crate::format::{self, chunk, rec, ChunkHeader, ConfigChange, DumpInfo, End, EntityInfo, Info, Kind, ThreadInfo};
use crate::Error;
use serde::Serialize;
use std::path::Path;

/// What was read, what was damaged, what was lost.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    pub file_bytes: u64,
    pub chunks: u64,
    pub data_chunks: u64,
    pub damaged_chunks: u64,
    pub damaged_bytes: u64,
    pub truncated_bytes: u64,
    pub unknown_chunks: u64,
    pub records: u64,
    /// Records the writer reported dropped (buffer full, refused).
    pub lost_records: u64,
    pub lost_by_stream: Vec<u64>,
    /// Records skipped because their namespace entry was in a damaged chunk.
    pub orphan_records: u64,
    /// Whether the END chunk is present (the writer closed the file).
    pub closed: bool,
    /// The file's format version.
    pub version: [u16; 2],
    /// Human-readable notes on damage, with offsets (first 20).
    pub problems: Vec<String>,
}

/// Column vectors, one entry per record.
#[derive(Default)]
pub struct Columns {
    pub t_ns: Vec<i64>,
    pub entity: Vec<u32>,
    pub thread: Vec<u32>,
    pub stream: Vec<u16>,
    /// 0 for records of normal streams, else the flight-recorder dump number.
    pub dump: Vec<u32>,
    pub rtype: Vec<u8>,
    pub tag: Vec<u32>,
    pub dur_ns: Vec<i64>,
    pub value: Vec<i64>,
    /// Offsets into `payload` (len rows + 1) once any record has a payload; empty otherwise.
    pub payload_off: Vec<i64>,
    pub payload: Vec<u8>,
    /// Histogram records: row of the record, and its summary fields.
    pub hist_row: Vec<u64>,
    pub hist_under: Vec<u64>,
    pub hist_over: Vec<u64>,
    pub hist_sum: Vec<i64>,
    pub hist_min: Vec<i64>,
    pub hist_max: Vec<i64>,
    /// Non-empty buckets of all histogram records: which record, bucket, count.
    pub bucket_rec: Vec<u32>,
    pub bucket_idx: Vec<u32>,
    pub bucket_count: Vec<u64>,
}

impl Columns {
    pub fn len(&self) -> usize {
        self.t_ns.len()
    }
    pub fn is_empty(&self) -> bool {
        self.t_ns.is_empty()
    }
}

#[derive(Default)]
pub struct Trace {
    pub info: Info,
    pub entities: Vec<EntityInfo>,
    pub threads: Vec<ThreadInfo>,
    pub calibration: Vec<CalPair>,
    pub dumps: Vec<DumpInfo>,
    pub changes: Vec<ConfigChange>,
    pub end: Option<End>,
    pub stats: Stats,
    pub cols: Columns,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Sort records by time (stable; records are per-thread ordered already).
    pub sort: bool,
    /// Only count records, do not build columns.
    pub count_only: bool,
}

struct DataRef {
    off: usize,
    h: ChunkHeader,
    dump: u32,
}

fn note(stats: &mut Stats, s: String) {
    if stats.problems.len() < 20 {
        stats.problems.push(s);
    }
}

/// Read a trace file.
pub fn read_file(path: &Path, opts: Options) -> Result<Trace, Error> {
    let f = std::fs::File::open(path).map_err(|e| Error::input(format!("{}: cannot open: {e}", path.display())))?;
    let meta = f.metadata().map_err(|e| Error::input(format!("{}: cannot stat: {e}", path.display())))?;
    if meta.is_dir() {
        return Err(Error::input(format!("{}: is a directory, not a trace file", path.display())));
    }
    if meta.len() == 0 {
        return Err(Error::input(format!("{}: not a loopscope trace (the file is empty)", path.display())));
    }
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::input(format!("{}: cannot map: {e}", path.display())))?;
    read_bytes(&map, &path.display().to_string(), opts)
}

/// Read a trace held in memory; `name` is used in messages. In stages: the
/// file header, a walk over the chunks (metadata parsed, data chunks noted,
/// damage skipped and counted), then the records: counted per chunk and
/// decoded into columns in parallel.
pub fn read_bytes(data: &[u8], name: &str, opts: Options) -> Result<Trace, Error> {
    let (major, minor, hlen) = file_header(data, name)?;
    let mut t = Trace::default();
    t.stats.file_bytes = data.len() as u64;
    t.stats.version = [major, minor];
    let refs = walk_chunks(data, name, hlen, &mut t)?;
    if let Some(e) = &t.end {
        t.stats.lost_records = t.stats.lost_records.max(e.lost_records);
    }

    let clock = if t.info.clock == "mono" { ClockKind::Mono } else { ClockKind::Tsc };
    let conv = RawToMono::new(clock, &t.calibration, if t.info.raw_hz > 0.0 { t.info.raw_hz } else { 1e9 });
    // Entity id -> kind, for validating records.
    let max_id = t.entities.iter().map(|e| e.id).max().unwrap_or(0) as usize;
    let mut kinds: Vec<Option<Kind>> = vec![None; max_id + 1];
    for e in &t.entities {
        kinds[e.id as usize] = Some(e.kind);
    }
    let damaged = t.stats.damaged_chunks > 0 || t.stats.truncated_bytes > 0;
    let dec = Decoder { data, name, kinds: &kinds, damaged, conv: &conv };
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 8);

    let (plans, total) = plan_rows(&dec, &refs, workers, &mut t.stats)?;
    t.stats.records = total as u64;
    if opts.count_only {
        return Ok(t);
    }
    t.cols = decode_rows(&dec, &plans, total, workers);
    if opts.sort && !t.cols.t_ns.windows(2).all(|w| w[0] <= w[1]) {
        sort_columns(&mut t.cols);
    }
    Ok(t)
}

/// The file header's version and length, or why this is not a trace we read.
fn file_header(data: &[u8], name: &str) -> Result<(u16, u16, usize), Error> {
    if data.len() < format::FILE_HEADER_LEN || data[0..8] != format::FILE_MAGIC {
        let head: String = data.iter().take(8).map(|&b| if b.is_ascii_graphic() { b as char } else { '.' }).collect();
        return Err(Error::input(format!("{name}: not a loopscope trace (starts with {head:?}, expected \"LSTRACE\"); give a file written by loopscope")));
    }
    let major = u16::from_le_bytes([data[8], data[9]]);
    let minor = u16::from_le_bytes([data[10], data[11]]);
    let hlen = u32::from_le_bytes(data[12..16].try_into().unwrap()) as usize;
    if major != format::VERSION_MAJOR {
        return Err(Error::input(format!(
            "{name}: offset 8: trace format {major}.{minor} cannot be read by this reader (format {}.x); use the loopscope version that wrote it",
            format::VERSION_MAJOR
        )));
    }
    if hlen < format::FILE_HEADER_LEN || hlen > data.len() || hlen % 8 != 0 {
        return Err(Error::input(format!("{name}: offset 12: file header length {hlen} is not valid; the header is damaged")));
    }
    Ok((major, minor, hlen))
}

/// A chunk header at `pos` that can be trusted (its length fits the format).
fn intact_header(data: &[u8], pos: usize) -> Option<ChunkHeader> {
    ChunkHeader::decode(&data[pos..]).filter(|h| (h.len as usize) <= format::MAX_CHUNK_PAYLOAD && h.len % 8 == 0)
}

/// The offset of the next intact chunk header after a damaged one at `pos`
/// (the end of the data when there is none).
fn resync(data: &[u8], pos: usize) -> usize {
    let mut q = pos + 8;
    while q + format::CHUNK_HEADER_LEN <= data.len() {
        if data[q..q + 4] == format::CHUNK_MAGIC && intact_header(data, q).is_some() {
            return q;
        }
        q += 8;
    }
    data.len()
}

/// Walk the chunks from `hlen`: metadata chunks go into `t`, data chunks
/// are returned for decoding; damaged and cut-short chunks are skipped and
/// counted in `t.stats` (with their records, when their header says).
fn walk_chunks(data: &[u8], name: &str, hlen: usize, t: &mut Trace) -> Result<Vec<DataRef>, Error> {
    let mut refs: Vec<DataRef> = Vec::new();
    let mut have_info = false;
    let mut dump_of_stream: std::collections::HashMap<u16, u32> = Default::default();
    let mut pos = hlen;
    while pos < data.len() {
        if data.len() - pos < format::CHUNK_HEADER_LEN {
            t.stats.truncated_bytes += (data.len() - pos) as u64;
            note(&mut t.stats, format!("offset {pos}: file ends inside a chunk header ({} bytes lost)", data.len() - pos));
            break;
        }
        let Some(h) = intact_header(data, pos) else {
            let q = resync(data, pos);
            t.stats.damaged_chunks += 1;
            t.stats.damaged_bytes += (q - pos) as u64;
            note(&mut t.stats, format!("offset {pos}: damaged chunk header, {} bytes skipped", q - pos));
            pos = q;
            continue;
        };
        let body = pos + format::CHUNK_HEADER_LEN;
        let end = body + h.len as usize;
        if end > data.len() {
            t.stats.truncated_bytes += (data.len() - pos) as u64;
            note(&mut t.stats, format!("offset {pos}: file ends inside a {} chunk ({} of {} bytes present)", chunk::name(h.ty), data.len() - pos, end - pos));
            if h.ty == chunk::DATA {
                t.stats.lost_records += h.lost;
            }
            break;
        }
        t.stats.chunks += 1;
        if h.ty == chunk::DATA {
            // The header is intact, so its count of dropped records is too.
            count_lost(&mut t.stats, &h);
        }
        let payload = &data[body..end];
        if crc32c::crc32c(payload) != h.payload_crc {
            t.stats.damaged_chunks += 1;
            t.stats.damaged_bytes += (end - pos) as u64;
            note(&mut t.stats, format!("offset {pos}: {} chunk of {} bytes fails its checksum, skipped", chunk::name(h.ty), h.len));
        } else if h.ty == chunk::DATA {
            t.stats.data_chunks += 1;
            let ring = t.info.streams.get(h.stream as usize).map(|s| s.kind == "ring").unwrap_or(false);
            let dump = if ring { dump_of_stream.get(&h.stream).copied().unwrap_or(0) } else { 0 };
            if !payload.is_empty() {
                refs.push(DataRef { off: body, h, dump });
            }
        } else {
            let json_err = |e: serde_json::Error| Error::input(format!("{name}: offset {pos}: {} chunk is not valid: {e}", chunk::name(h.ty)));
            have_info |= metadata(&h, payload, pos, t, &mut dump_of_stream).map_err(json_err)?;
        }
        pos = end;
    }
    if !have_info {
        return Err(Error::input(format!(
            "{name}: offset {}: the info chunk is missing or damaged, so the trace cannot be interpreted",
            format::FILE_HEADER_LEN
        )));
    }
    Ok(refs)
}

fn count_lost(stats: &mut Stats, h: &ChunkHeader) {
    stats.lost_records += h.lost;
    let s = h.stream as usize;
    if stats.lost_by_stream.len() <= s {
        stats.lost_by_stream.resize(s + 1, 0);
    }
    stats.lost_by_stream[s] += h.lost;
}

/// One metadata chunk into `t`; true when it was the info chunk.
fn metadata(
    h: &ChunkHeader,
    payload: &[u8],
    pos: usize,
    t: &mut Trace,
    dump_of_stream: &mut std::collections::HashMap<u16, u32>,
) -> Result<bool, serde_json::Error> {
    match h.ty {
        chunk::INFO => {
            t.info = serde_json::from_slice(payload)?;
            return Ok(true);
        }
        chunk::NAMESPACE => t.entities.extend(serde_json::from_slice::<Vec<EntityInfo>>(payload)?),
        chunk::THREADS => t.threads.extend(serde_json::from_slice::<Vec<ThreadInfo>>(payload)?),
        chunk::CALIBRATION => t.calibration.extend(serde_json::from_slice::<Vec<CalPair>>(payload)?),
        chunk::DUMP => {
            let d: DumpInfo = serde_json::from_slice(payload)?;
            dump_of_stream.insert(d.stream, d.dump);
            t.dumps.push(d);
        }
        chunk::CONFIG => t.changes.push(serde_json::from_slice::<ConfigChange>(payload)?),
        chunk::END => {
            t.stats.closed = true;
            t.end = Some(serde_json::from_slice::<End>(payload)?);
        }
        _ => {
            t.stats.unknown_chunks += 1;
            note(&mut t.stats, format!("offset {pos}: unknown chunk type {} skipped (written by a newer loopscope?)", h.ty));
        }
    }
    Ok(false)
}

/// Validate every record and count the rows of each data chunk (in
/// parallel), so the columns can be allocated once at their final size:
/// each chunk's first row and row count, and the total.
fn plan_rows<'a>(dec: &Decoder, refs: &'a [DataRef], workers: usize, stats: &mut Stats) -> Result<(Vec<Plan<'a>>, usize), Error> {
    let counts: Vec<Result<(usize, u64), Error>> = {
        let per = refs.len().div_ceil(workers).max(1);
        std::thread::scope(|sc| {
            let hs: Vec<_> = refs.chunks(per).map(|part| sc.spawn(move || part.iter().map(|r| dec.scan(r)).collect::<Vec<_>>())).collect();
            hs.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
        })
    };
    let mut plans: Vec<Plan> = Vec::with_capacity(refs.len());
    let mut first = 0usize;
    for (r, c) in refs.iter().zip(counts) {
        let (rows, orphans) = c?;
        stats.orphan_records += orphans;
        plans.push(Plan { r, first, rows });
        first += rows;
    }
    Ok((plans, first))
}

/// Decode the planned chunks into columns, each worker filling its own
/// row range, then join what they found besides (histograms, payloads).
fn decode_rows(dec: &Decoder, plans: &[Plan], total: usize, workers: usize) -> Columns {
    let mut cols = Columns::zeroed(total);
    let mut parts: Vec<&[Plan]> = Vec::new();
    let per = total.div_ceil(workers).max(1);
    let mut start = 0;
    for i in 0..plans.len() {
        let end_row = plans[i].first + plans[i].rows;
        if end_row - plans[start].first >= per || i + 1 == plans.len() {
            parts.push(&plans[start..=i]);
            start = i + 1;
        }
    }
    let extras: Vec<Extras> = {
        let mut rest = cols.slices();
        let mut jobs = Vec::new();
        for part in &parts {
            let rows: usize = part.iter().map(|p| p.rows).sum();
            let (mine, tail) = rest.split_at(rows);
            rest = tail;
            jobs.push((*part, mine));
        }
        std::thread::scope(|sc| {
            let hs: Vec<_> = jobs.into_iter().map(|(part, mine)| sc.spawn(move || dec.fill(part, mine))).collect();
            hs.into_iter().map(|h| h.join().unwrap_or_default()).collect()
        })
    };
    join_extras(&mut cols, extras, total);
    cols
}

/// Append each worker's histograms and payloads, renumbered, to the columns.
fn join_extras(c: &mut Columns, extras: Vec<Extras>, total: usize) {
    let mut payload_rows: Vec<(usize, usize, usize)> = Vec::new(); // row, start, len (in merged payload)
    for x in extras {
        let hbase = c.hist_row.len() as u32;
        c.hist_row.extend(x.hist_row);
        c.hist_under.extend(x.hist_under);
        c.hist_over.extend(x.hist_over);
        c.hist_sum.extend(x.hist_sum);
        c.hist_min.extend(x.hist_min);
        c.hist_max.extend(x.hist_max);
        c.bucket_rec.extend(x.bucket_rec.iter().map(|r| r + hbase));
        c.bucket_idx.extend(x.bucket_idx);
        c.bucket_count.extend(x.bucket_count);
        let pbase = c.payload.len();
        c.payload.extend_from_slice(&x.payload);
        payload_rows.extend(x.payload_rows.iter().map(|&(row, st, len)| (row, st + pbase, len)));
    }
    if !payload_rows.is_empty() {
        // Offsets for every row: rows without a payload get an empty slice.
        let mut off = vec![0i64; total + 1];
        let mut len = vec![0i64; total];
        for &(row, _, l) in &payload_rows {
            len[row] = l as i64;
        }
        for i in 0..total {
            off[i + 1] = off[i] + len[i];
        }
        c.payload_off = off;
    }
}

struct Plan<'a> {
    r: &'a DataRef,
    first: usize,
    rows: usize,
}

/// Per-worker variable-size results, merged in order afterwards.
#[derive(Default)]
struct Extras {
    hist_row: Vec<u64>,
    hist_under: Vec<u64>,
    hist_over: Vec<u64>,
    hist_sum: Vec<i64>,
    hist_min: Vec<i64>,
    hist_max: Vec<i64>,
    bucket_rec: Vec<u32>,
    bucket_idx: Vec<u32>,
    bucket_count: Vec<u64>,
    payload: Vec<u8>,
    payload_rows: Vec<(usize, usize, usize)>,
}

/// Mutable views of a row range of the fixed-width columns.
struct ColsMut<'a> {
    t_ns: &'a mut [i64],
    entity: &'a mut [u32],
    thread: &'a mut [u32],
    stream: &'a mut [u16],
    dump: &'a mut [u32],
    rtype: &'a mut [u8],
    tag: &'a mut [u32],
    dur_ns: &'a mut [i64],
    value: &'a mut [i64],
}

impl<'a> ColsMut<'a> {
    fn split_at(self, n: usize) -> (ColsMut<'a>, ColsMut<'a>) {
        let (a0, b0) = self.t_ns.split_at_mut(n);
        let (a1, b1) = self.entity.split_at_mut(n);
        let (a2, b2) = self.thread.split_at_mut(n);
        let (a3, b3) = self.stream.split_at_mut(n);
        let (a4, b4) = self.dump.split_at_mut(n);
        let (a5, b5) = self.rtype.split_at_mut(n);
        let (a6, b6) = self.tag.split_at_mut(n);
        let (a7, b7) = self.dur_ns.split_at_mut(n);
        let (a8, b8) = self.value.split_at_mut(n);
        (
            ColsMut { t_ns: a0, entity: a1, thread: a2, stream: a3, dump: a4, rtype: a5, tag: a6, dur_ns: a7, value: a8 },
            ColsMut { t_ns: b0, entity: b1, thread: b2, stream: b3, dump: b4, rtype: b5, tag: b6, dur_ns: b7, value: b8 },
        )
    }
}

impl Columns {
    fn zeroed(n: usize) -> Columns {
        Columns {
            t_ns: vec![0; n],
            entity: vec![0; n],
            thread: vec![0; n],
            stream: vec![0; n],
            dump: vec![0; n],
            rtype: vec![0; n],
            tag: vec![0; n],
            dur_ns: vec![0; n],
            value: vec![0; n],
            ..Default::default()
        }
    }

    fn slices(&mut self) -> ColsMut<'_> {
        ColsMut {
            t_ns: &mut self.t_ns,
            entity: &mut self.entity,
            thread: &mut self.thread,
            stream: &mut self.stream,
            dump: &mut self.dump,
            rtype: &mut self.rtype,
            tag: &mut self.tag,
            dur_ns: &mut self.dur_ns,
            value: &mut self.value,
        }
    }
}

struct Decoder<'a> {
    data: &'a [u8],
    name: &'a str,
    kinds: &'a [Option<Kind>],
    damaged: bool,
    conv: &'a RawToMono,
}

#[inline(always)]
fn word(b: &[u8], p: usize, i: usize) -> u64 {
    u64::from_le_bytes(b[p + 8 * i..p + 8 * i + 8].try_into().unwrap())
}

impl Decoder<'_> {
    fn bad(&self, off: usize, msg: String) -> Error {
        Error::input(format!("{}: offset {off}: {msg}", self.name))
    }

    fn chunk(&self, r: &DataRef) -> &[u8] {
        &self.data[r.off..r.off + r.h.len as usize]
    }

    /// Size of the record at `p`, checked against the chunk end.
    #[inline(always)]
    fn size_at(&self, r: &DataRef, b: &[u8], p: usize, ty: u32) -> Result<usize, Error> {
        let at = r.off + p;
        let need = |n: usize| -> Result<(), Error> {
            if p + n > b.len() {
                Err(self.bad(at, format!("record of type {ty} runs past the end of its chunk")))
            } else {
                Ok(())
            }
        };
        let size = match ty {
            rec::EVENT => 16,
            rec::EVENT_VALUE | rec::INTERVAL | rec::COUNTER => 24,
            rec::EVENT_PAYLOAD => {
                need(24)?;
                24 + (word(b, p, 2) as u32 as usize).div_ceil(8) * 8
            }
            rec::HISTOGRAM => {
                need(64)?;
                let k = word(b, p, 2) as u32 as usize;
                64 + (k * 4).div_ceil(8) * 8 + k * 8
            }
            _ => return Err(self.bad(at, format!("unknown record type {ty} in an intact data chunk"))),
        };
        need(size)?;
        Ok(size)
    }

    /// Validate a chunk's records: (rows, orphans).
    fn scan(&self, r: &DataRef) -> Result<(usize, u64), Error> {
        let b = self.chunk(r);
        let (mut p, mut rows, mut orphans) = (0usize, 0usize, 0u64);
        while p + 8 <= b.len() {
            let idtype = word(b, p, 0) as u32;
            let ty = (idtype >> rec::TYPE_SHIFT) & rec::TYPE_MASK;
            if ty == rec::PAD {
                break;
            }
            let size = self.size_at(r, b, p, ty)?;
            let id = idtype & rec::ID_MASK;
            match self.kinds.get(id as usize).copied().flatten() {
                Some(k) if k.accepts(ty) => rows += 1,
                Some(k) => {
                    return Err(self.bad(r.off + p, format!("record type {ty} does not fit entity {id}, which is a {}", k.as_str())));
                }
                None if self.damaged => orphans += 1,
                None => return Err(self.bad(r.off + p, format!("record refers to entity {id}, which the namespace does not define"))),
            }
            p += size;
        }
        Ok((rows, orphans))
    }

    /// Decode the (already validated) records of `plans` into `out`.
    fn fill(&self, plans: &[Plan], out: ColsMut) -> Extras {
        let mut x = Extras::default();
        let mut hint = 0usize;
        let mut i = 0usize;
        let base = plans.first().map(|p| p.first).unwrap_or(0);
        for pl in plans {
            let r = pl.r;
            let b = self.chunk(r);
            let mut p = 0usize;
            while p + 8 <= b.len() {
                let w0 = word(b, p, 0);
                let idtype = w0 as u32;
                let ty = (idtype >> rec::TYPE_SHIFT) & rec::TYPE_MASK;
                if ty == rec::PAD {
                    break;
                }
                let Ok(size) = self.size_at(r, b, p, ty) else { break };
                let id = idtype & rec::ID_MASK;
                if !matches!(self.kinds.get(id as usize), Some(Some(_))) {
                    p += size;
                    continue;
                }
                let mono = idtype & rec::MONO_FLAG != 0;
                let ts = word(b, p, 1);
                out.t_ns[i] = if mono { ts as i64 } else { self.conv.convert(ts, &mut hint) };
                out.entity[i] = id;
                out.thread[i] = r.h.thread;
                out.stream[i] = r.h.stream;
                out.dump[i] = r.dump;
                out.rtype[i] = ty as u8;
                out.tag[i] = (w0 >> 32) as u32;
                match ty {
                    rec::INTERVAL => out.dur_ns[i] = if mono { word(b, p, 2) as i64 } else { self.conv.duration(word(b, p, 2)) },
                    rec::EVENT_VALUE | rec::COUNTER => out.value[i] = word(b, p, 2) as i64,
                    rec::EVENT_PAYLOAD => {
                        let n = word(b, p, 2) as u32 as usize;
                        x.payload_rows.push((base + i, x.payload.len(), n));
                        x.payload.extend_from_slice(&b[p + 24..p + 24 + n]);
                    }
                    rec::HISTOGRAM => {
                        let k = word(b, p, 2) as u32 as usize;
                        let hi = x.hist_row.len() as u32;
                        x.hist_row.push((base + i) as u64);
                        x.hist_under.push(word(b, p, 3));
                        x.hist_over.push(word(b, p, 4));
                        x.hist_sum.push(word(b, p, 5) as i64);
                        x.hist_min.push(word(b, p, 6) as i64);
                        x.hist_max.push(word(b, p, 7) as i64);
                        let ib = p + 64;
                        let cb = ib + (k * 4).div_ceil(8) * 8;
                        let mut total = word(b, p, 3).wrapping_add(word(b, p, 4));
                        for j in 0..k {
                            let idx = u32::from_le_bytes(b[ib + 4 * j..ib + 4 * j + 4].try_into().unwrap());
                            let cnt = u64::from_le_bytes(b[cb + 8 * j..cb + 8 * j + 8].try_into().unwrap());
                            x.bucket_rec.push(hi);
                            x.bucket_idx.push(idx);
                            x.bucket_count.push(cnt);
                            total = total.wrapping_add(cnt);
                        }
                        out.value[i] = total as i64;
                    }
                    _ => {}
                }
                i += 1;
                p += size;
            }
        }
        x
    }
}

fn permute<T: Copy>(v: &mut Vec<T>, idx: &[u32]) {
    if v.is_empty() {
        return;
    }
    let out: Vec<T> = idx.iter().map(|&i| v[i as usize]).collect();
    *v = out;
}

fn sort_columns(c: &mut Columns) {
    let mut idx: Vec<u32> = (0..c.t_ns.len() as u32).collect();
    let t = &c.t_ns;
    idx.sort_by_key(|&i| t[i as usize]);
    permute(&mut c.t_ns, &idx);
    permute(&mut c.entity, &idx);
    permute(&mut c.thread, &idx);
    permute(&mut c.stream, &idx);
    permute(&mut c.dump, &idx);
    permute(&mut c.rtype, &idx);
    permute(&mut c.tag, &idx);
    permute(&mut c.dur_ns, &idx);
    permute(&mut c.value, &idx);
    if !c.payload_off.is_empty() {
        let mut off = Vec::with_capacity(c.payload_off.len());
        let mut data = Vec::with_capacity(c.payload.len());
        off.push(0i64);
        for &i in &idx {
            let (a, b) = (c.payload_off[i as usize] as usize, c.payload_off[i as usize + 1] as usize);
            data.extend_from_slice(&c.payload[a..b]);
            off.push(data.len() as i64);
        }
        c.payload_off = off;
        c.payload = data;
    }
    if !c.hist_row.is_empty() {
        let mut inv = vec![0u64; idx.len()];
        for (new, &old) in idx.iter().enumerate() {
            inv[old as usize] = new as u64;
        }
        for r in c.hist_row.iter_mut() {
            *r = inv[*r as usize];
        }
    }
}
