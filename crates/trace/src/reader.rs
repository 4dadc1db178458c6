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

/// Read a trace held in memory; `name` is used in messages.
pub fn read_bytes(data: &[u8], name: &str, opts: Options) -> Result<Trace, Error> {
    let bad = |off: usize, msg: String| Error::input(format!("{name}: offset {off}: {msg}"));
    if data.len() < format::FILE_HEADER_LEN || data[0..8] != format::FILE_MAGIC {
        let head: String = data.iter().take(8).map(|&b| if b.is_ascii_graphic() { b as char } else { '.' }).collect();
        return Err(Error::input(format!(
            "{name}: not a loopscope trace (starts with {head:?}, expected \"LSTRACE\"); give a file written by loopscope"
        )));
    }
    let major = u16::from_le_bytes([data[8], data[9]]);
    let minor = u16::from_le_bytes([data[10], data[11]]);
    let hlen = u32::from_le_bytes(data[12..16].try_into().unwrap()) as usize;
    if major != format::VERSION_MAJOR {
        return Err(bad(8, format!(
            "trace format {major}.{minor} cannot be read by this reader (format {}.x); use the loopscope version that wrote it",
            format::VERSION_MAJOR
        )));
    }
    if hlen < format::FILE_HEADER_LEN || hlen > data.len() || hlen % 8 != 0 {
        return Err(bad(12, format!("file header length {hlen} is not valid; the header is damaged")));
    }

    let mut t = Trace::default();
    t.stats.file_bytes = data.len() as u64;
    t.stats.version = [major, minor];
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
        let h = match ChunkHeader::decode(&data[pos..]) {
            Some(h) if (h.len as usize) <= format::MAX_CHUNK_PAYLOAD && h.len % 8 == 0 => h,
            _ => {
                // Resynchronise on the next intact chunk header.
                let mut q = pos + 8;
                while q + format::CHUNK_HEADER_LEN <= data.len() {
                    if data[q..q + 4] == format::CHUNK_MAGIC {
                        if let Some(h2) = ChunkHeader::decode(&data[q..]) {
                            if (h2.len as usize) <= format::MAX_CHUNK_PAYLOAD && h2.len % 8 == 0 {
                                break;
                            }
                        }
                    }
                    q += 8;
                }
                let q = if q + format::CHUNK_HEADER_LEN <= data.len() { q } else { data.len() };
                t.stats.damaged_chunks += 1;
                t.stats.damaged_bytes += (q - pos) as u64;
                note(&mut t.stats, format!("offset {pos}: damaged chunk header, {} bytes skipped", q - pos));
                pos = q;
                continue;
            }
        };
        let body = pos + format::CHUNK_HEADER_LEN;
        let end = body + h.len as usize;
        if end > data.len() {
            t.stats.truncated_bytes += (data.len() - pos) as u64;
            note(&mut t.stats, format!(
                "offset {pos}: file ends inside a {} chunk ({} of {} bytes present)",
                chunk::name(h.ty),
                data.len() - pos,
                end - pos
            ));
            if h.ty == chunk::DATA {
                t.stats.lost_records += h.lost;
            }
            break;
        }
        t.stats.chunks += 1;
        if h.ty == chunk::DATA {
            // The header is intact, so its count of dropped records is too.
            t.stats.lost_records += h.lost;
            let s = h.stream as usize;
            if t.stats.lost_by_stream.len() <= s {
                t.stats.lost_by_stream.resize(s + 1, 0);
            }
            t.stats.lost_by_stream[s] += h.lost;
        }
        let payload = &data[body..end];
        if crc32c::crc32c(payload) != h.payload_crc {
            t.stats.damaged_chunks += 1;
            t.stats.damaged_bytes += (end - pos) as u64;
            note(&mut t.stats, format!("offset {pos}: {} chunk of {} bytes fails its checksum, skipped", chunk::name(h.ty), h.len));
            pos = end;
            continue;
        }
        let json_err = |e: serde_json::Error| bad(pos, format!("{} chunk is not valid: {e}", chunk::name(h.ty)));
        match h.ty {
            chunk::INFO => {
                t.info = serde_json::from_slice(payload).map_err(json_err)?;
                have_info = true;
            }
            chunk::NAMESPACE => {
                let v: Vec<EntityInfo> = serde_json::from_slice(payload).map_err(json_err)?;
                t.entities.extend(v);
            }
            chunk::THREADS => {
                let v: Vec<ThreadInfo> = serde_json::from_slice(payload).map_err(json_err)?;
                t.threads.extend(v);
            }
            chunk::CALIBRATION => {
                let v: Vec<CalPair> = serde_json::from_slice(payload).map_err(json_err)?;
                t.calibration.extend(v);
            }
            chunk::DUMP => {
                let d: DumpInfo = serde_json::from_slice(payload).map_err(json_err)?;
                dump_of_stream.insert(d.stream, d.dump);
                t.dumps.push(d);
            }
            chunk::CONFIG => {
                let c: ConfigChange = serde_json::from_slice(payload).map_err(json_err)?;
                t.changes.push(c);
            }
            chunk::END => {
                let e: End = serde_json::from_slice(payload).map_err(json_err)?;
                t.stats.closed = true;
                t.end = Some(e);
            }
            chunk::DATA => {
                t.stats.data_chunks += 1;
                let ring = t.info.streams.get(h.stream as usize).map(|s| s.kind == "ring").unwrap_or(false);
                let dump = if ring { dump_of_stream.get(&h.stream).copied().unwrap_or(0) } else { 0 };
                if !payload.is_empty() {
                    refs.push(DataRef { off: body, h, dump });
                }
            }
            _ => {
                t.stats.unknown_chunks += 1;
                note(&mut t.stats, format!("offset {pos}: unknown chunk type {} skipped (written by a newer loopscope?)", h.ty));
            }
        }
        pos = end;
    }

    if !have_info {
        return Err(bad(format::FILE_HEADER_LEN, "the info chunk is missing or damaged, so the trace cannot be interpreted".into()));
    }
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

    let est: usize = refs.iter().map(|r| r.h.len as usize / 16).sum();
    let c = &mut t.cols;
    if !opts.count_only {
        c.t_ns.reserve(est);
        c.entity.reserve(est);
        c.thread.reserve(est);
        c.stream.reserve(est);
        c.dump.reserve(est);
        c.rtype.reserve(est);
        c.tag.reserve(est);
        c.dur_ns.reserve(est);
        c.value.reserve(est);
    }
    let mut hint = 0usize;
    let mut records = 0u64;
    for r in &refs {
        let b = &data[r.off..r.off + r.h.len as usize];
        let mut p = 0usize;
        while p + 8 <= b.len() {
            let at = r.off + p;
            let w0 = u64::from_le_bytes(b[p..p + 8].try_into().unwrap());
            let idtype = w0 as u32;
            let ty = (idtype >> rec::TYPE_SHIFT) & rec::TYPE_MASK;
            if ty == rec::PAD {
                break;
            }
            let mono = idtype & rec::MONO_FLAG != 0;
            let id = idtype & rec::ID_MASK;
            let tag = (w0 >> 32) as u32;
            let need = |n: usize| -> Result<(), Error> {
                if p + n > b.len() {
                    Err(bad(at, format!("record of type {ty} runs past the end of its chunk")))
                } else {
                    Ok(())
                }
            };
            let word = |i: usize| u64::from_le_bytes(b[p + 8 * i..p + 8 * i + 8].try_into().unwrap());
            let size = match ty {
                rec::EVENT => 16,
                rec::EVENT_VALUE | rec::INTERVAL | rec::COUNTER => 24,
                rec::EVENT_PAYLOAD => {
                    need(24)?;
                    24 + (word(2) as u32 as usize).div_ceil(8) * 8
                }
                rec::HISTOGRAM => {
                    need(64)?;
                    let k = word(2) as u32 as usize;
                    64 + (k * 4).div_ceil(8) * 8 + k * 8
                }
                _ => return Err(bad(at, format!("unknown record type {ty} in an intact data chunk"))),
            };
            need(size)?;
            match kinds.get(id as usize).copied().flatten() {
                Some(k) if k.accepts(ty) => {}
                Some(k) => {
                    return Err(bad(at, format!("record type {ty} does not fit entity {id}, which is a {}", k.as_str())));
                }
                None if damaged => {
                    t.stats.orphan_records += 1;
                    p += size;
                    continue;
                }
                None => return Err(bad(at, format!("record refers to entity {id}, which the namespace does not define"))),
            }
            records += 1;
            if !opts.count_only {
                let ts = word(1);
                c.t_ns.push(if mono { ts as i64 } else { conv.convert(ts, &mut hint) });
                c.entity.push(id);
                c.thread.push(r.h.thread);
                c.stream.push(r.h.stream);
                c.dump.push(r.dump);
                c.rtype.push(ty as u8);
                c.tag.push(tag);
                let (dur, val) = match ty {
                    rec::INTERVAL => (if mono { word(2) as i64 } else { conv.duration(word(2)) }, 0),
                    rec::EVENT_VALUE | rec::COUNTER => (0, word(2) as i64),
                    rec::HISTOGRAM => {
                        let k = word(2) as u32 as usize;
                        let row = c.t_ns.len() as u64 - 1;
                        let hi = c.hist_row.len() as u32;
                        c.hist_row.push(row);
                        c.hist_under.push(word(3));
                        c.hist_over.push(word(4));
                        c.hist_sum.push(word(5) as i64);
                        c.hist_min.push(word(6) as i64);
                        c.hist_max.push(word(7) as i64);
                        let ib = p + 64;
                        let cb = ib + (k * 4).div_ceil(8) * 8;
                        let mut total = word(3) + word(4);
                        for j in 0..k {
                            let idx = u32::from_le_bytes(b[ib + 4 * j..ib + 4 * j + 4].try_into().unwrap());
                            let cnt = u64::from_le_bytes(b[cb + 8 * j..cb + 8 * j + 8].try_into().unwrap());
                            c.bucket_rec.push(hi);
                            c.bucket_idx.push(idx);
                            c.bucket_count.push(cnt);
                            total = total.wrapping_add(cnt);
                        }
                        (0, total as i64)
                    }
                    _ => (0, 0),
                };
                c.dur_ns.push(dur);
                c.value.push(val);
                if ty == rec::EVENT_PAYLOAD {
                    if c.payload_off.is_empty() {
                        c.payload_off = vec![0; c.t_ns.len() - 1];
                    }
                    let n = word(2) as u32 as usize;
                    c.payload.extend_from_slice(&b[p + 24..p + 24 + n]);
                    c.payload_off.push(c.payload.len() as i64);
                } else if !c.payload_off.is_empty() {
                    c.payload_off.push(c.payload.len() as i64);
                }
            }
            p += size;
        }
    }
    if !c.payload_off.is_empty() {
        c.payload_off.insert(0, 0);
    }
    t.stats.records = records;
    if opts.sort && !opts.count_only && !c.t_ns.windows(2).all(|w| w[0] <= w[1]) {
        sort_columns(c);
    }
    Ok(t)
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
