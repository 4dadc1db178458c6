//! The background writer: drains every thread's buffers into the file.
//!
//! Each cycle it (1) reads the published heads of all buffers, (2) writes the
//! metadata those records may refer to (new threads, new entities, group
//! switches), (3) copies each normal ring's new bytes into data chunks, one per
//! block, with the number of records the ring dropped since its last chunk,
//! (4) serves flight-recorder triggers, (5) logs a calibration pair once a
//! second, and (6) writes the cycle's chunks with one `write`. Reading the heads
//! before the registry is what guarantees an entity's namespace entry lands
//! before its first record. The writer sleeps 1 ms between busy cycles and
//! `flush_ms` between quiet ones; producers never wake it. Record data is not
//! copied: the batch references it in the rings and one `writev` hands it
//! to the kernel; the rings' tails move only after that write.
//!
//! A failed write (full disk, I/O error) stops writing but not draining: the
//! records that could not be written are counted and the error names the file
//! and the offset, so `close` can report both.

use crate::batch::{json, Batch};
use crate::clock;
use crate::format::{self, chunk, rec, ChunkHeader, DumpInfo, End, ThreadInfo, BLOCK};
use crate::shared::{Shared, ThreadShared};
use std::fs::File;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Cursor {
    t: Arc<ThreadShared>,
    announced: bool,
    last_lost: Vec<u64>,
    dumped_to: Vec<u64>,
    has_ring: bool,
}

fn round_up(x: u64) -> u64 {
    x.div_ceil(BLOCK) * BLOCK
}

/// Append data chunks for ring positions [a, b), one per block piece,
/// referencing the ring's bytes in place.
fn push_range(out: &mut Batch, stream: u16, thread: u32, ring: &crate::buffer::Ring, a: u64, b: u64, mut lost: u64) {
    if a == b && lost > 0 {
        unsafe { out.data_chunk(header(stream, thread, lost), &[]) };
        return;
    }
    let mut p = a;
    while p < b {
        let q = (((p / BLOCK) + 1) * BLOCK).min(b);
        // Below the published head and above the tail, which moves only
        // after the batch is written: the producer does not touch these bytes.
        unsafe { out.data_chunk(header(stream, thread, lost), ring.bytes(p, q)) };
        lost = 0;
        p = q;
    }
}

fn header(stream: u16, thread: u32, lost: u64) -> ChunkHeader {
    ChunkHeader { ty: chunk::DATA, flags: 0, stream, thread, len: 0, payload_crc: 0, lost }
}

/// Count the records in a run of bytes taken from a buffer (up to a PAD).
pub fn count_records(mut b: &[u8]) -> u64 {
    let mut n = 0;
    while b.len() >= 8 {
        let w = u32::from_le_bytes(b[0..4].try_into().unwrap());
        let size = match (w >> rec::TYPE_SHIFT) & rec::TYPE_MASK {
            rec::EVENT => 16,
            rec::EVENT_VALUE | rec::INTERVAL | rec::COUNTER => 24,
            rec::EVENT_PAYLOAD if b.len() >= 24 => 24 + (u32::from_le_bytes(b[16..20].try_into().unwrap()) as usize).div_ceil(8) * 8,
            rec::HISTOGRAM if b.len() >= 24 => {
                let k = u32::from_le_bytes(b[16..20].try_into().unwrap()) as usize;
                64 + (k * 4).div_ceil(8) * 8 + k * 8
            }
            _ => break,
        };
        n += 1;
        if size > b.len() {
            break;
        }
        b = &b[size..];
    }
    n
}

pub(crate) fn run(sh: Arc<Shared>, file: File, offset: u64) -> End {
    if sh.config.writer_idle {
        let p = libc::sched_param { sched_priority: 0 };
        // SAFETY: this thread's own policy; a refusal leaves it as it was.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) };
    }
    // SAFETY: this thread's own id.
    sh.writer_tid.store(unsafe { libc::gettid() }, Ordering::Release);
    let quiet = Duration::from_millis(sh.config.flush_ms);
    let mut w = Writer::new(sh, file, offset);
    loop {
        let stopping = w.sh.stop.load(Ordering::Acquire);
        let flush_req = w.sh.flush_req.load(Ordering::Acquire);
        w.attach_new();
        let exited: Vec<bool> = w.cursors.iter().map(|c| c.t.exited.load(Ordering::Acquire)).collect();
        let heads: Vec<Vec<u64>> = w.cursors.iter().map(|c| c.t.rings.iter().map(|r| r.head.load(Ordering::Acquire)).collect()).collect();
        w.metadata();
        let (moved, consumed) = w.reference_new(&heads);
        w.dump_triggers();
        w.calibrate(stopping);
        if stopping {
            w.end_chunk();
        }
        w.write_out();
        for (ci, s, head) in consumed {
            w.cursors[ci].t.rings[s].tail.store(head, Ordering::Release);
        }
        w.drop_exited(&exited);
        {
            let mut d = w.sh.flush_done.lock().unwrap_or_else(|e| e.into_inner());
            *d = (*d).max(flush_req);
            w.sh.flush_cv.notify_all();
        }
        if stopping {
            return w.finish();
        }
        std::thread::park_timeout(if moved > BLOCK { Duration::from_millis(1) } else { quiet });
    }
}

/// The writer's state between cycles: a cursor per attached thread, the
/// batch being built, where the file stands and what went wrong.
struct Writer {
    sh: Arc<Shared>,
    file: File,
    offset: u64,
    cursors: Vec<Cursor>,
    ns_done: usize,
    out: Batch,
    last_cal: Instant,
    cal_interval: Duration,
    dumps: u32,
    failed: Option<String>,
    unwritten_records: u64,
    lost_by_stream: Vec<u64>,
}

impl Writer {
    fn new(sh: Arc<Shared>, file: File, offset: u64) -> Writer {
        let n = sh.config.streams.len();
        Writer {
            sh,
            file,
            offset,
            cursors: Vec::new(),
            ns_done: 0,
            out: Batch::new(),
            last_cal: Instant::now(),
            cal_interval: Duration::from_millis(100),
            dumps: 0,
            failed: None,
            unwritten_records: 0,
            lost_by_stream: vec![0; n],
        }
    }

    /// Cursors for the threads attached since the last cycle (the session's
    /// list is a queue of them).
    fn attach_new(&mut self) {
        let n = self.sh.config.streams.len();
        let fresh = std::mem::take(&mut *self.sh.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in fresh {
            let has_ring = t.rings.iter().any(|r| r.overwrite);
            self.cursors.push(Cursor { t, announced: false, last_lost: vec![0; n], dumped_to: vec![0; n], has_ring });
        }
    }

    /// Metadata the records of this cycle may refer to: new threads, new
    /// entities, group switches.
    fn metadata(&mut self) {
        let fresh: Vec<ThreadInfo> = self
            .cursors
            .iter_mut()
            .filter(|c| !c.announced)
            .map(|c| {
                c.announced = true;
                ThreadInfo { index: c.t.index, tid: c.t.tid, name: c.t.name.clone() }
            })
            .collect();
        if !fresh.is_empty() {
            json(&mut self.out, chunk::THREADS, 0, &fresh);
        }
        {
            let c = crate::entity::control();
            if c.entities.len() > self.ns_done {
                let infos: Vec<_> = c.entities[self.ns_done..].iter().map(|e| e.info()).collect();
                self.ns_done = c.entities.len();
                drop(c);
                json(&mut self.out, chunk::NAMESPACE, 0, &infos);
            }
        }
        let changes: Vec<_> = std::mem::take(&mut *self.sh.changes.lock().unwrap_or_else(|e| e.into_inner()));
        for ch in &changes {
            json(&mut self.out, chunk::CONFIG, ch.stream, ch);
        }
    }

    /// Normal streams: reference [tail, head) of each ring in the batch (the
    /// tails move after the write). The bytes referenced, and which tails
    /// to move where.
    fn reference_new(&mut self, heads: &[Vec<u64>]) -> (u64, Vec<(usize, usize, u64)>) {
        let mut moved = 0u64;
        let mut consumed = Vec::new();
        for (ci, c) in self.cursors.iter_mut().enumerate() {
            for (s, ring) in c.t.rings.iter().enumerate() {
                if ring.overwrite {
                    continue;
                }
                let tail = ring.tail.load(Ordering::Relaxed);
                let head = heads[ci][s];
                let lost = ring.lost.load(Ordering::Relaxed);
                let delta = lost - c.last_lost[s];
                if head > tail || delta > 0 {
                    push_range(&mut self.out, s as u16, c.t.index, ring, tail, head, delta);
                    consumed.push((ci, s, head));
                    moved += head - tail;
                    c.last_lost[s] = lost;
                    self.lost_by_stream[s] += delta;
                }
            }
        }
        (moved, consumed)
    }

    /// Flight-recorder triggers: each thread's ring of that stream, as much
    /// of it as the producer cannot have overwritten while it was copied.
    fn dump_triggers(&mut self) {
        let triggers: Vec<_> = std::mem::take(&mut *self.sh.triggers.lock().unwrap_or_else(|e| e.into_inner()));
        for t in triggers {
            self.dumps += 1;
            let s = t.stream as usize;
            let mut data: Vec<u8> = Vec::new();
            let mut overwritten = 0u64;
            for c in self.cursors.iter_mut() {
                overwritten += dump_ring(c, s, &mut data);
            }
            json(
                &mut self.out,
                chunk::DUMP,
                t.stream,
                &DumpInfo { stream: t.stream, dump: self.dumps, tag: t.tag, trigger_raw: t.raw, overwritten_bytes: overwritten },
            );
            self.out.own(|v| v.extend_from_slice(&data));
        }
    }

    /// A calibration pair at once, then once a second, and at the end.
    fn calibrate(&mut self, stopping: bool) {
        if stopping || self.last_cal.elapsed() >= self.cal_interval {
            json(&mut self.out, chunk::CALIBRATION, 0, &vec![clock::calibration_pair(20)]);
            self.last_cal = Instant::now();
            self.cal_interval = Duration::from_secs(1);
        }
    }

    fn lost_total(&self) -> u64 {
        self.lost_by_stream.iter().sum::<u64>() + self.sh.lost_unattached.load(Ordering::Relaxed)
    }

    fn end_chunk(&mut self) {
        let end = End {
            end_mono_ns: clock::mono_ns(),
            bytes_written: self.offset + self.out.len() as u64,
            lost_records: self.lost_total(),
            lost_by_stream: self.lost_by_stream.clone(),
            dumps: self.dumps,
            error: None,
        };
        json(&mut self.out, chunk::END, 0, &end);
    }

    /// The batch in one write; after a failure, only counted.
    fn write_out(&mut self) {
        if self.out.is_empty() {
            return;
        }
        let unwritten = |b: &Batch| b.ring_pieces().map(count_records).sum::<u64>();
        if self.failed.is_none() {
            match self.out.write_to(&mut self.file) {
                Ok(()) => self.offset += self.out.len() as u64,
                Err(e) => {
                    self.unwritten_records += unwritten(&self.out);
                    self.failed = Some(format!("{}: write failed at offset {}: {e}", self.sh.path.display(), self.offset));
                }
            }
            self.sh.bytes_written.store(self.offset, Ordering::Relaxed);
        } else {
            self.unwritten_records += unwritten(&self.out);
        }
        self.out.clear();
    }

    /// Drop drained buffers of threads that have exited (flight-recorder
    /// buffers are kept, bounded, so a later trigger still shows them).
    fn drop_exited(&mut self, exited: &[bool]) {
        let mut i = 0;
        let mut kept_exited = 0;
        self.cursors.retain(|c| {
            let ex = exited.get(i).copied().unwrap_or(false);
            i += 1;
            if ex && c.has_ring {
                kept_exited += 1;
                return kept_exited <= 64;
            }
            !ex
        });
    }

    fn finish(mut self) -> End {
        if self.failed.is_none() && self.sh.config.fsync {
            if let Err(e) = self.file.sync_data() {
                self.failed = Some(format!("{}: fsync failed: {e}", self.sh.path.display()));
            }
        }
        let lost_records = self.lost_total();
        let unwritten = self.unwritten_records;
        End {
            end_mono_ns: clock::mono_ns(),
            bytes_written: self.offset,
            lost_records,
            lost_by_stream: self.lost_by_stream,
            dumps: self.dumps,
            error: self.failed.map(|f| format!("{f}; {unwritten} records could not be written")),
        }
    }
}

/// Copy what one thread's ring of stream `s` holds since its last dump into
/// `data`, keeping only the blocks the producer cannot have overwritten while
/// they were copied; the bytes it had overwritten since the last dump.
fn dump_ring(c: &mut Cursor, s: usize, data: &mut Vec<u8>) -> u64 {
    let ring = &c.t.rings[s];
    let h1 = ring.head.load(Ordering::Acquire);
    let lo = c.dumped_to[s].max(round_up(h1.saturating_sub(ring.cap)));
    let mut copy: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut p = lo;
    while p < h1 {
        let q = ((p / BLOCK + 1) * BLOCK).min(h1);
        copy.push((p, unsafe { ring.bytes(p, q) }.to_vec()));
        p = q;
    }
    fence(Ordering::Acquire);
    let h2 = ring.head.load(Ordering::Acquire);
    // The producer may have overwritten slots up to one block past
    // h2 - cap while we copied; keep only blocks it cannot have touched.
    let valid = round_up((h2 + BLOCK).saturating_sub(ring.cap)).max(lo);
    let overwritten = valid.saturating_sub(c.dumped_to[s]);
    for (p, bytes) in copy {
        if p >= valid {
            format::push_chunk(data, header(s as u16, c.t.index, 0), &bytes);
        }
    }
    c.dumped_to[s] = h1;
    overwritten
}
