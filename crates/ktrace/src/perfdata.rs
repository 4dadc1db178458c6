//! perf.data's records read in the order the file holds them.
//!
//! perf writes each CPU's ring buffer out in turn, so its records are sorted
//! per CPU but not across CPUs; a `FINISHED_ROUND` record ends each pass over
//! the buffers. The linux-perf-data crate sorts every round before it hands a
//! record over (a heap allocation, a hash lookup and a sort key per record):
//! 30 % of an import's time on a busy recording. The importer sorts its
//! batches anyway (the segment cut sorts stamps and holds back what may still
//! be preceded), so this walker gives records in file order and a
//! *watermark*: perf's own rule (its ordered-events queue) is that once round
//! k has ended, nothing later is earlier than the latest stamp seen when round
//! k-1 ended. Events before that stamp are final.
//!
//! The common layouts are walked here: a little-endian file whose
//! attributes' sample formats have `TIME` and `RAW` and no `READ` before the
//! raw payload, without AUX data (compressed or not), and either all share
//! one format or all carry `IDENTIFIER` (the attribute's id, first in a
//! sample and last in another record's sample id), so each record says
//! whose layout it has: `perf sched record` writes the second kind (one of
//! its events lacks `PERIOD`). Any other file goes through the crate's
//! sorted reader ([`Layouts::of`] says which).
//!
//! The data section is read in large chunks into one buffer (a record never
//! exceeds 64 KiB, its size being 16 bits); a record cut by the section's end
//! or too short for its own header is damage, as the crate reports it.

use std::fs::File;
use std::os::unix::fs::FileExt;

// perf_event_attr.sample_type bits (include/uapi/linux/perf_event.h)
const IP: u64 = 1 << 0;
const TID: u64 = 1 << 1;
const TIME: u64 = 1 << 2;
const ADDR: u64 = 1 << 3;
const READ: u64 = 1 << 4;
const CALLCHAIN: u64 = 1 << 5;
const ID: u64 = 1 << 6;
const CPU: u64 = 1 << 7;
const PERIOD: u64 = 1 << 8;
const STREAM_ID: u64 = 1 << 9;
const RAW: u64 = 1 << 10;
const IDENTIFIER: u64 = 1 << 16;

/// Record types the walker reads (PERF_RECORD_*).
pub const SAMPLE: u32 = 9;
pub const LOST: u32 = 2;
pub const LOST_SAMPLES: u32 = 13;
pub const FINISHED_ROUND: u32 = 68;
/// perf's own records (its rounds, ids, maps, time conversion) from here on; the kernel's below it.
pub const USER_TYPE_START: u32 = 64;
/// Records whose payload lies outside their size: never walked.
const AUXTRACE: u32 = 71;
/// Records holding other records, zstd-compressed (`perf record -z`).
const COMPRESSED: u32 = 81;
const COMPRESSED2: u32 = 83;

/// Where a sample's time, CPU and raw payload lie, for one sample format.
#[derive(Debug, Clone, Copy)]
pub struct Walkable {
    time: usize,
    cpu: Option<usize>,
    /// bytes before the callchain (or the raw payload without one)
    fixed: usize,
    callchain: bool,
    /// the sample id every other record carries at its end (`sample_id_all`)
    trailer: Option<Trailer>,
}

/// A sample as its attribute's layout reads it.
#[derive(Debug, PartialEq, Eq)]
pub enum Sample<'a> {
    /// its time, CPU (-1: not sampled) and raw payload
    Event(i64, i32, &'a [u8]),
    /// shorter than its format says: damage the records stop at
    Short,
    /// its id names no attribute of the file (a damaged id): this sample alone is lost
    NoAttribute(u64),
}

/// The sample layouts of a file's attributes: one they all share, or one
/// per attribute found by the record's id. Ids are the kernel's, handed out
/// in turn as the recorder opened its events, so they are looked up in a
/// table from the smallest (a span past 65,536 is left to the crate).
#[derive(Debug, Clone)]
pub enum Layouts {
    One(Walkable),
    ById { base: u64, index: Vec<u8>, layouts: Vec<Walkable> },
}

/// No layout at this id (`Layouts::ById`'s index).
const NO_LAYOUT: u8 = u8::MAX;

impl Layouts {
    /// The layouts of a file whose attributes are `(sample format,
    /// sample_id_all, ids)`, or None when the walker does not read it.
    pub fn of(attrs: &[(u64, bool, &[u64])]) -> Option<Self> {
        let &(fmt, id_all, _) = attrs.first()?;
        if attrs.iter().all(|a| a.0 == fmt && a.1 == id_all) {
            return Walkable::of(fmt, id_all).map(Layouts::One);
        }
        // several formats: each record must say whose it is, and sample ids be all or none
        if attrs.len() >= usize::from(NO_LAYOUT) || attrs.iter().any(|a| a.0 & IDENTIFIER == 0 || a.1 != id_all || a.2.is_empty()) {
            return None;
        }
        let ids = || attrs.iter().flat_map(|a| a.2.iter().copied());
        let (base, top) = (ids().min()?, ids().max()?);
        if top - base >= 1 << 16 {
            return None;
        }
        let mut index = vec![NO_LAYOUT; (top - base + 1) as usize];
        let mut layouts = Vec::new();
        for (k, &(fmt, id_all, ids)) in attrs.iter().enumerate() {
            layouts.push(Walkable::of(fmt, id_all)?);
            for &id in ids {
                let slot = &mut index[(id - base) as usize];
                if *slot != NO_LAYOUT {
                    return None; // one id for two attributes: the file does not say whose a record is
                }
                *slot = k as u8;
            }
        }
        Some(Layouts::ById { base, index, layouts })
    }

    fn by_id(&self, id: u64) -> Option<&Walkable> {
        match self {
            Layouts::One(w) => Some(w),
            Layouts::ById { base, index, layouts } => {
                let k = *index.get(usize::try_from(id.checked_sub(*base)?).ok()?)?;
                layouts.get(usize::from(k))
            }
        }
    }

    /// A sample's time, CPU and payload, by its attribute's layout.
    pub fn sample<'a>(&self, body: &'a [u8]) -> Sample<'a> {
        let w = match self {
            Layouts::One(w) => w,
            Layouts::ById { .. } => {
                let Some(id) = u64_at(body, 0) else { return Sample::Short };
                match self.by_id(id) {
                    Some(w) => w,
                    None => return Sample::NoAttribute(id),
                }
            }
        };
        match w.sample(body) {
            Some((t, cpu, raw)) => Sample::Event(t, cpu, raw),
            None => Sample::Short,
        }
    }

    /// A non-sample record's (CPU, time) from its sample id, when it carries both.
    pub fn id_of(&self, body: &[u8]) -> Option<(i32, i64)> {
        match self {
            Layouts::One(w) => w.id_of(body),
            // the identifier ends the sample id
            Layouts::ById { .. } => self.by_id(u64_at(body, body.len().checked_sub(8)?)?)?.id_of(body),
        }
    }
}

/// The `sample_id` fields at the end of a non-sample record.
#[derive(Debug, Clone, Copy)]
struct Trailer {
    len: usize,
    time: Option<usize>,
    cpu: Option<usize>,
}

impl Walkable {
    /// The layout of samples of format `fmt` (the same for every attribute),
    /// or None when this walker does not read it.
    pub fn of(fmt: u64, sample_id_all: bool) -> Option<Self> {
        if fmt & TIME == 0 || fmt & RAW == 0 || fmt & READ != 0 {
            return None;
        }
        let ([_, _, _, time, _, _, _, cpu, _], fixed) = lay_out(fmt, [IDENTIFIER, IP, TID, TIME, ADDR, ID, STREAM_ID, CPU, PERIOD]);
        let time = time?;
        let trailer = sample_id_all.then(|| {
            let ([_, time, _, _, cpu, _], len) = lay_out(fmt, [TID, TIME, ID, STREAM_ID, CPU, IDENTIFIER]);
            Trailer { len, time, cpu }
        });
        Some(Walkable { time, cpu, fixed, callchain: fmt & CALLCHAIN != 0, trailer })
    }

    /// A sample's (time, CPU, raw payload); None when the body is too short
    /// for what its format says (damage). The CPU is -1 when not sampled.
    pub fn sample<'a>(&self, body: &'a [u8]) -> Option<(i64, i32, &'a [u8])> {
        let t = u64_at(body, self.time)? as i64;
        let cpu = match self.cpu {
            Some(c) => u32_at(body, c)? as i32,
            None => -1,
        };
        let mut at = self.fixed;
        if self.callchain {
            let nr = u64_at(body, at)?;
            at = nr.checked_mul(8).and_then(|n| n.checked_add(8 + at as u64)).and_then(|n| usize::try_from(n).ok())?;
        }
        let size = u32_at(body, at)? as usize;
        let raw = body.get(at + 4..(at + 4).checked_add(size)?)?;
        Some((t, cpu, raw))
    }

    /// A non-sample record's (CPU, time) from its sample id, when it carries both.
    pub fn id_of(&self, body: &[u8]) -> Option<(i32, i64)> {
        let tr = self.trailer?;
        let base = body.len().checked_sub(tr.len)?;
        let cpu = u32_at(body, base + tr.cpu?)? as i32;
        let t = u64_at(body, base + tr.time?)? as i64;
        Some((cpu, t))
    }
}

/// Where each of `order`'s fields lies (None when `fmt` lacks it), every
/// field present being 8 bytes, and the bytes they take together.
fn lay_out<const N: usize>(fmt: u64, order: [u64; N]) -> ([Option<usize>; N], usize) {
    let mut at = 0;
    let offsets = order.map(|bit| {
        let here = (fmt & bit != 0).then_some(at);
        at += if here.is_some() { 8 } else { 0 };
        here
    });
    (offsets, at)
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap()))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).map(|s| u32::from_le_bytes(s.try_into().unwrap()))
}

/// The data section's records, a chunk of the file at a time; a
/// compressed file's (`perf record -z`) through one zstd stream that runs
/// across its COMPRESSED records, as perf writes it.
pub struct Records {
    f: File,
    /// the file offset of `buf[hi]`'s next byte and the section's end
    pos: u64,
    end: u64,
    buf: Vec<u8>,
    lo: usize,
    hi: usize,
    /// decompressed records not yet read (from `dlo`), and the stream's state
    dec: Vec<u8>,
    dlo: usize,
    zstd: Option<zstd::stream::raw::Decoder<'static>>,
}

/// What reading a record met.
pub enum Next<'a> {
    Record(u32, &'a [u8]),
    End,
    /// why the records stop here (the rest of the section is not read)
    Damage(String),
}

const CHUNK: usize = 4 << 20;

/// A record's (type, size) from its header, or why it is not one.
fn header(h: &[u8]) -> Result<(u32, usize), String> {
    let kind = u32::from_le_bytes(h[0..4].try_into().unwrap());
    let size = u16::from_le_bytes(h[6..8].try_into().unwrap()) as usize;
    if size < 8 {
        return Err(format!("a record says it is {size} bytes, less than its own header"));
    }
    Ok((kind, size))
}

impl Records {
    pub fn new(f: File, offset: u64, size: u64) -> Self {
        Records { f, pos: offset, end: offset + size, buf: vec![0; CHUNK], lo: 0, hi: 0, dec: Vec::new(), dlo: 0, zstd: None }
    }

    /// At least `n` unread bytes in the buffer (false at the section's end).
    fn fill(&mut self, n: usize) -> std::io::Result<bool> {
        if self.hi - self.lo >= n {
            return Ok(true);
        }
        self.buf.copy_within(self.lo..self.hi, 0);
        self.hi -= self.lo;
        self.lo = 0;
        while self.hi < n && self.pos < self.end {
            let want = (self.buf.len() - self.hi).min((self.end - self.pos) as usize);
            let got = self.f.read_at(&mut self.buf[self.hi..self.hi + want], self.pos)?;
            if got == 0 {
                break;
            }
            self.hi += got;
            self.pos += got as u64;
        }
        Ok(self.hi - self.lo >= n)
    }

    /// The next record of the file itself: its type and where its body lies in `buf` (None at the end).
    fn raw(&mut self) -> Result<Option<(u32, usize, usize)>, String> {
        match self.fill(8) {
            Ok(true) => {}
            Ok(false) if self.hi == self.lo => return Ok(None),
            Ok(false) => return Err(format!("the data section ends inside a record's header ({} bytes left)", self.hi - self.lo)),
            Err(e) => return Err(format!("a record does not read: {e}")),
        }
        let (kind, size) = header(&self.buf[self.lo..self.lo + 8])?;
        if kind == AUXTRACE {
            // the file offset of buf[lo]: `pos` is that of buf[hi]
            let at = self.pos - (self.hi - self.lo) as u64;
            return Err(format!("an AUX data record at offset {at} in a file that did not declare it"));
        }
        match self.fill(size) {
            Ok(true) => {}
            Ok(false) => return Err(format!("the data section ends inside a record of {size} bytes")),
            Err(e) => return Err(format!("a record does not read: {e}")),
        }
        let at = self.lo;
        self.lo += size;
        Ok(Some((kind, at + 8, at + size)))
    }

    /// A COMPRESSED record's payload (`buf[at..end]`) decompressed onto `dec`.
    fn inflate(&mut self, kind: u32, at: usize, end: usize) -> Result<(), String> {
        let body = &self.buf[at..end];
        // COMPRESSED2 says how much of its body is data (the rest pads it to 8 bytes)
        let data = if kind == COMPRESSED2 { u64_at(body, 0).and_then(|n| body.get(8..8 + usize::try_from(n).ok()?)) } else { Some(body) };
        let data = data.ok_or("a compressed record's size is past its end")?;
        if self.dlo > 0 {
            self.dec.drain(..self.dlo);
            self.dlo = 0;
        }
        let z = match &mut self.zstd {
            Some(z) => z,
            None => self.zstd.insert(zstd::stream::raw::Decoder::new().map_err(|e| format!("zstd: {e}"))?),
        };
        let mut input = zstd::stream::raw::InBuffer::around(data);
        loop {
            self.dec.reserve(1 << 18);
            let (before, room) = (self.dec.len(), self.dec.capacity() - self.dec.len());
            let mut out = zstd::stream::raw::OutBuffer::around_pos(&mut self.dec, before);
            zstd::stream::raw::Operation::run(z, &mut input, &mut out).map_err(|e| format!("compressed records do not decompress: {e}"))?;
            let wrote = out.pos() - before;
            if input.pos() >= data.len() && wrote < room {
                return Ok(());
            }
        }
    }

    /// The next record's type and body (its header taken off).
    pub fn next(&mut self) -> Next<'_> {
        loop {
            // a whole record decompressed earlier comes first
            let avail = self.dec.len() - self.dlo;
            if avail >= 8 {
                let (kind, size) = match header(&self.dec[self.dlo..self.dlo + 8]) {
                    Ok(h) => h,
                    Err(why) => return Next::Damage(why),
                };
                if matches!(kind, AUXTRACE | COMPRESSED | COMPRESSED2) {
                    return Next::Damage(format!("a record of type {kind} inside compressed data"));
                }
                if avail >= size {
                    let at = self.dlo;
                    self.dlo += size;
                    return Next::Record(kind, &self.dec[at + 8..at + size]);
                }
            }
            match self.raw() {
                Err(why) => return Next::Damage(why),
                Ok(None) if avail > 0 => return Next::Damage(format!("the compressed data ends inside a record ({avail} bytes left)")),
                Ok(None) => return Next::End,
                Ok(Some((kind @ (COMPRESSED | COMPRESSED2), at, end))) => {
                    if let Err(why) = self.inflate(kind, at, end) {
                        return Next::Damage(why);
                    }
                }
                Ok(Some((kind, at, end))) => return Next::Record(kind, &self.buf[at..end]),
            }
        }
    }
}

/// Where the crate's sorted reader would be asked for more memory than the
/// file holds: an AUX data record (kept whole in memory, its payload after
/// it) whose payload's size runs past the data section's end. The crate
/// allocates that size before it reads, so a damaged one would abort the
/// process; the importer cuts the reader at such a record instead.
/// A pass over the records' headers (and an AUX record's first word) only.
/// The record's offset and what is wrong with it, or None.
pub fn aux_past_end(f: &File, offset: u64, size: u64) -> Option<(u64, String)> {
    use std::io::{BufReader, Read, Seek, SeekFrom};
    let end = offset.checked_add(size)?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    r.seek(SeekFrom::Start(offset)).ok()?;
    let (mut pos, mut h) = (offset, [0u8; 16]);
    while pos + 8 <= end {
        // a header that does not read or is too short: the crate reports it itself
        r.read_exact(&mut h[..8]).ok()?;
        let (kind, size) = header(&h[..8]).ok()?;
        let mut skip = size as u64 - 8;
        let mut aux = 0;
        if kind == AUXTRACE && size >= 16 {
            r.read_exact(&mut h[8..16]).ok()?;
            skip -= 8;
            aux = u64::from_le_bytes(h[8..16].try_into().unwrap());
            if pos.checked_add(size as u64).and_then(|p| p.checked_add(aux)).is_none_or(|e| e > end) {
                return Some((pos, format!("an AUX data record at offset {pos} says {aux} bytes of data follow it, past the data section's end")));
            }
        }
        r.seek_relative((skip + aux) as i64).ok()?;
        pos += size as u64 + aux;
    }
    None
}

/// perf's round rule as a watermark: events before it are in their final order.
#[derive(Debug, Default)]
pub struct Rounds {
    latest: Option<i64>,
    /// the latest stamp when the previous round ended
    at_last_end: Option<i64>,
    watermark: Option<i64>,
}

impl Rounds {
    pub fn saw(&mut self, t: i64) {
        self.latest = Some(self.latest.map_or(t, |l| l.max(t)));
    }

    pub fn ended(&mut self) {
        if let Some(w) = self.at_last_end {
            self.watermark = Some(w);
        }
        self.at_last_end = self.latest;
    }

    /// Events stamped before it are final (i64::MIN before two rounds ended: none are).
    pub fn watermark(&self) -> i64 {
        self.watermark.unwrap_or(i64::MIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(fmt: u64, fields: &[(u64, u64)], callchain: &[u64], raw: &[u8]) -> Vec<u8> {
        // fields in the kernel's order; each present one is 8 bytes
        let mut b = Vec::new();
        for &(bit, v) in fields {
            if fmt & bit != 0 {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        if fmt & CALLCHAIN != 0 {
            b.extend_from_slice(&(callchain.len() as u64).to_le_bytes());
            for c in callchain {
                b.extend_from_slice(&c.to_le_bytes());
            }
        }
        b.extend_from_slice(&(raw.len() as u32).to_le_bytes());
        b.extend_from_slice(raw);
        b
    }

    #[test]
    fn a_sample_of_perf_records_usual_format_gives_its_time_cpu_and_payload() {
        let fmt = IDENTIFIER | IP | TID | TIME | ID | CPU | PERIOD | RAW;
        let body = sample(fmt, &[(IDENTIFIER, 7), (IP, 1), (TID, 2), (TIME, 123_456), (ID, 7), (CPU, 3), (PERIOD, 1)], &[], b"abcdef");
        let w = Walkable::of(fmt, true).unwrap();
        assert_eq!(w.sample(&body), Some((123_456, 3, &b"abcdef"[..])));
    }

    #[test]
    fn a_callchain_before_the_payload_is_stepped_over() {
        let fmt = TID | TIME | CPU | CALLCHAIN | RAW;
        let body = sample(fmt, &[(TID, 2), (TIME, 9), (CPU, 1)], &[10, 20, 30], b"xy");
        assert_eq!(Walkable::of(fmt, false).unwrap().sample(&body), Some((9, 1, &b"xy"[..])));
    }

    #[test]
    fn a_sample_cut_short_is_damage_not_a_panic() {
        let fmt = TIME | CPU | CALLCHAIN | RAW;
        let w = Walkable::of(fmt, false).unwrap();
        let mut body = sample(fmt, &[(TIME, 9), (CPU, 1)], &[5], b"xy");
        assert_eq!(w.sample(&body), Some((9, 1, &b"xy"[..])));
        assert_eq!(w.sample(&body[..body.len() - 1]), None, "the payload cut");
        body[16..24].copy_from_slice(&(u64::MAX / 4).to_le_bytes()); // a callchain longer than the record
        assert_eq!(w.sample(&body), None);
        assert_eq!(w.sample(&[]), None);
    }

    #[test]
    fn formats_without_time_or_payload_or_with_read_values_are_left_to_the_crate() {
        assert!(Walkable::of(TIME | CPU, true).is_none());
        assert!(Walkable::of(RAW | CPU, true).is_none());
        assert!(Walkable::of(TIME | READ | RAW, true).is_none());
    }

    #[test]
    fn a_loss_records_sample_id_gives_its_cpu_and_time() {
        let fmt = IDENTIFIER | TID | TIME | ID | CPU | RAW;
        let w = Walkable::of(fmt, true).unwrap();
        // LOST: id, count, then sample_id { pid/tid, time, id, cpu/res, identifier }
        let mut body = Vec::new();
        for v in [7u64, 40, 2, 5_000, 7, 1, 7] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(w.id_of(&body), Some((1, 5_000)));
        assert_eq!(Walkable::of(fmt, false).unwrap().id_of(&body), None);
    }

    #[test]
    fn attributes_of_two_formats_are_told_apart_by_the_id_each_sample_begins_with() {
        // perf sched record: one of its events samples no PERIOD
        let (a, b) = (IDENTIFIER | IP | TID | TIME | CPU | PERIOD | RAW, IDENTIFIER | IP | TID | TIME | CPU | RAW);
        let l = Layouts::of(&[(a, true, &[40, 41][..]), (b, true, &[42, 43][..])]).unwrap();
        let sa = sample(a, &[(IDENTIFIER, 41), (IP, 1), (TID, 2), (TIME, 100), (CPU, 1), (PERIOD, 1)], &[], b"aa");
        let sb = sample(b, &[(IDENTIFIER, 42), (IP, 1), (TID, 2), (TIME, 200), (CPU, 0)], &[], b"bbb");
        assert_eq!(l.sample(&sa), Sample::Event(100, 1, &b"aa"[..]));
        assert_eq!(l.sample(&sb), Sample::Event(200, 0, &b"bbb"[..]));
        let mut bad = sb.clone();
        bad[0..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert_eq!(l.sample(&bad), Sample::NoAttribute(1 << 40));
        assert_eq!(l.sample(&sb[..4]), Sample::Short);
        // a loss record's sample id { tid, time, cpu, identifier } ends with the id too
        let mut lost = Vec::new();
        for v in [7u64, 40, 2, 5_000, 1, 42] {
            lost.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(l.id_of(&lost), Some((1, 5_000)));
    }

    #[test]
    fn formats_that_differ_without_ids_to_tell_them_apart_are_left_to_the_crate() {
        let (a, b) = (TID | TIME | CPU | PERIOD | RAW, TID | TIME | CPU | RAW);
        assert!(Layouts::of(&[(a, true, &[1][..]), (b, true, &[2][..])]).is_none(), "no IDENTIFIER");
        let (a, b) = (a | IDENTIFIER, b | IDENTIFIER);
        assert!(Layouts::of(&[(a, true, &[1][..]), (b, true, &[1][..])]).is_none(), "one id for two");
        assert!(Layouts::of(&[(a, true, &[1][..]), (b, true, &[][..])]).is_none(), "no ids");
        assert!(Layouts::of(&[(a, true, &[1][..]), (b, false, &[2][..])]).is_none(), "sample ids on some");
        assert!(Layouts::of(&[(a, true, &[1][..]), (b, true, &[1 << 20][..])]).is_none(), "ids too far apart");
        assert!(matches!(Layouts::of(&[(a, true, &[1][..]), (a, true, &[2][..])]), Some(Layouts::One(_))));
    }

    #[test]
    fn the_watermark_trails_the_rounds_by_one() {
        let mut r = Rounds::default();
        assert_eq!(r.watermark(), i64::MIN);
        r.saw(10);
        r.saw(30);
        r.ended();
        assert_eq!(r.watermark(), i64::MIN, "after one round nothing is final: the next may hold earlier events");
        r.saw(20);
        r.saw(50);
        r.ended();
        assert_eq!(r.watermark(), 30);
        r.ended();
        assert_eq!(r.watermark(), 50);
    }
}
