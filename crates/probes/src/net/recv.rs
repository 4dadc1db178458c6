//! The receiver: kernel timestamps, loss, duplicates, reordering, delays.
//!
//! Datagrams are read in batches with `recvmmsg`, each with the kernel's
//! software RX timestamp (the time the packet entered the stack; hardware
//! where the NIC has it). For every packet the receiver knows, all on
//! CLOCK_REALTIME: when the sender scheduled it and called send (from the
//! packet), when the kernel received it and when the application got it.
//! That splits its one-way delay into *sender and network* (send call →
//! kernel RX; with the sender's TX timestamps, the analysis splits it
//! further) and *end host* (kernel RX → application), the split Marcondes 2005
//! needed kernel patches for.
//!
//! Accounting per flow: a packet with a sequence number above the highest
//! seen is in order (a jump counts the packets skipped as missing); one
//! below it is reordered if not seen before and a duplicate if it was (a
//! window of the last 2^20 sequence numbers remembers which). Lost = the
//! span of sequence numbers seen minus the distinct packets received (a loss
//! at the very end is invisible to a receiver: the sender's count tells).
//! Per-packet records go into the trace unless `records` is off; the
//! summary (histograms of each delay, per-second throughput, interarrival
//! dispersion) is kept in fixed memory either way.

use super::packet::{Header, HEADER};
use super::sock::{realtime_ns, rx_timestamps, Udp};
use crate::error::Result;
use crate::os::mono_ns;
use loopscope_trace::hist::{LocalHistogram, Scale, Snapshot};
use loopscope_trace::{register, Entity, Kind};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const BATCH: usize = 64;
const WINDOW_BITS: u64 = 1 << 20;

#[derive(Clone, Debug)]
pub struct RecvConfig {
    pub bind: SocketAddr,
    /// Stop after this long from the start.
    pub duration_ns: Option<u64>,
    /// Stop when nothing arrived for this long after the first packet.
    pub idle_ns: Option<u64>,
    /// Stop after this many packets.
    pub count: Option<u64>,
    pub records: bool,
    pub rcvbuf: usize,
    /// Size of each receive buffer (larger datagrams are truncated and counted).
    pub max_size: usize,
}

/// Sequence accounting of one flow.
#[derive(Clone, Debug)]
pub struct Flow {
    pub first_seq: u64,
    pub max_seq: u64,
    pub received: u64,
    pub unique: u64,
    pub duplicates: u64,
    pub reordered: u64,
    pub beyond_window: u64,
    seen: Vec<u64>,
}

impl Flow {
    pub fn new(seq: u64) -> Flow {
        let mut f = Flow {
            first_seq: seq,
            max_seq: seq,
            received: 0,
            unique: 0,
            duplicates: 0,
            reordered: 0,
            beyond_window: 0,
            seen: vec![0; (WINDOW_BITS / 64) as usize],
        };
        f.mark(seq);
        f.received = 1;
        f.unique = 1;
        f
    }

    fn bit(&self, s: u64) -> (usize, u64) {
        let i = s % WINDOW_BITS;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    fn mark(&mut self, s: u64) {
        let (w, b) = self.bit(s);
        self.seen[w] |= b;
    }

    fn clear(&mut self, s: u64) {
        let (w, b) = self.bit(s);
        self.seen[w] &= !b;
    }

    fn is_set(&self, s: u64) -> bool {
        let (w, b) = self.bit(s);
        self.seen[w] & b != 0
    }

    /// Account one packet; returns what it was.
    pub fn add(&mut self, s: u64) -> Arrival {
        self.received += 1;
        if s > self.max_seq {
            // Forget the window slots the new packets reuse.
            let from = (self.max_seq + 1).max(s.saturating_sub(WINDOW_BITS - 1));
            if s - from < WINDOW_BITS {
                for x in from..s {
                    self.clear(x);
                }
            } else {
                self.seen.iter_mut().for_each(|w| *w = 0);
            }
            self.mark(s);
            self.max_seq = s;
            self.unique += 1;
            return Arrival::InOrder;
        }
        if s < self.first_seq || self.max_seq - s >= WINDOW_BITS {
            self.beyond_window += 1;
            self.unique += 1;
            if s < self.first_seq {
                self.first_seq = s;
            }
            return Arrival::Reordered;
        }
        if self.is_set(s) {
            self.duplicates += 1;
            return Arrival::Duplicate;
        }
        self.mark(s);
        self.unique += 1;
        self.reordered += 1;
        Arrival::Reordered
    }

    /// Packets missing from the span seen so far.
    pub fn lost(&self) -> u64 {
        (self.max_seq - self.first_seq + 1).saturating_sub(self.unique)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    InOrder,
    Reordered,
    Duplicate,
}

#[derive(Debug, Default)]
pub struct RecvResult {
    pub packets: u64,
    pub bytes: u64,
    pub malformed: u64,
    pub truncated: u64,
    pub no_kernel_ts: u64,
    pub hw_ts: u64,
    pub flows: Vec<(u32, Flow)>,
    /// Per-second bins (by kernel RX time since the first packet): (packets, bytes).
    pub per_second: Vec<(u64, u64)>,
    pub first_krx: i64,
    pub last_krx: i64,
    /// Application receive times of the first and last packet (CLOCK_REALTIME ns).
    pub first_urx: i64,
    pub last_urx: i64,
    pub owd: Snapshot,
    pub stack_net: Snapshot,
    pub end_host: Snapshot,
    pub interarrival: Snapshot,
    pub hist_scale: Option<Scale>,
    pub interarrival_sum: f64,
    pub interarrival_sumsq: f64,
    pub interarrival_n: u64,
    pub elapsed_ns: u64,
    pub interrupted: bool,
    pub batches: u64,
    pub sockbuf_drops: u64,
}

struct Ents {
    recv: &'static Entity,
    malformed: &'static Entity,
}

fn ents() -> Ents {
    Ents {
        recv: register(
            "net",
            "recv",
            Kind::Event,
            "a received packet; payload: flow u32, worker u32, seq u64, scheduled, sent, kernel RX, application RX (i64 CLOCK_REALTIME ns)",
            None,
        )
        .expect("entity"),
        malformed: register("net", "malformed", Kind::Event, "a datagram that is not a loopscope packet (value: its length)", None).expect("entity"),
    }
}

fn hist() -> LocalHistogram {
    LocalHistogram::new(Scale::Log { sub_bits: 7, max: 60_000_000_000 }).expect("layout")
}

/// Datagrams the kernel dropped on this socket (receive buffer full), from /proc/net/udp.
fn socket_drops(local: &SocketAddr) -> u64 {
    let file = if local.is_ipv4() { "/proc/net/udp" } else { "/proc/net/udp6" };
    let Ok(text) = std::fs::read_to_string(file) else { return 0 };
    let port = format!(":{:04X}", local.port());
    text.lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|a| a.ends_with(&port)))
        .filter_map(|l| l.split_whitespace().last().and_then(|d| d.parse::<u64>().ok()))
        .sum()
}

pub fn bind(cfg: &RecvConfig) -> Result<Udp> {
    let s = Udp::bind(&cfg.bind, cfg.rcvbuf)?;
    s.enable_rx_timestamps()?;
    s.set_read_timeout_ms(50);
    Ok(s)
}

pub fn run_on(sock: Udp, cfg: &RecvConfig, stop: Arc<AtomicBool>) -> RecvResult {
    let e = ents();
    loopscope_trace::prepare_thread();
    let size = cfg.max_size.max(HEADER);
    let mut inc = Incoming::new(size);
    let mut t = Tally::new();
    let t_start = mono_ns();
    let drops0 = socket_drops(&sock.local);
    let mut last_arrival = t_start;
    while !stop.load(Ordering::Relaxed) {
        let now = mono_ns();
        if cfg.duration_ns.is_some_and(|d| now - t_start >= d as i64) || cfg.count.is_some_and(|c| t.r.packets >= c) {
            break;
        }
        if t.r.packets > 0 && cfg.idle_ns.is_some_and(|d| now - last_arrival >= d as i64) {
            break;
        }
        let n = inc.recv(&sock);
        if n == 0 {
            continue; // timeout (SO_RCVTIMEO) or EINTR: check the stop conditions
        }
        let urx = realtime_ns();
        last_arrival = mono_ns();
        t.batch(urx);
        for i in 0..n {
            let m = &inc.msgs[i];
            let len = m.msg_len as usize;
            if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                t.r.truncated += 1;
            }
            let (sw, hw) = unsafe { rx_timestamps(&m.msg_hdr) };
            t.packet(&inc.bufs[i][..len.min(size)], len, sw, hw, urx, cfg.records, &e);
        }
    }
    let mut r = t.finish();
    r.elapsed_ns = (mono_ns() - t_start) as u64;
    r.interrupted = stop.load(Ordering::Relaxed);
    r.sockbuf_drops = socket_drops(&sock.local).saturating_sub(drops0);
    r
}

/// The buffers of one `recvmmsg` batch, made once.
struct Incoming {
    size: usize,
    bufs: Vec<Vec<u8>>,
    ctrl: Vec<[u8; 256]>,
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
}

impl Incoming {
    fn new(size: usize) -> Incoming {
        Incoming {
            size,
            bufs: (0..BATCH).map(|_| vec![0u8; size]).collect(),
            ctrl: vec![[0u8; 256]; BATCH],
            iov: vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH],
            msgs: vec![unsafe { std::mem::zeroed() }; BATCH],
        }
    }

    /// Up to BATCH datagrams with their control messages; how many (0: a
    /// timeout or a signal).
    fn recv(&mut self, sock: &Udp) -> usize {
        for i in 0..BATCH {
            self.iov[i] = libc::iovec { iov_base: self.bufs[i].as_mut_ptr() as *mut libc::c_void, iov_len: self.size };
            self.msgs[i] = unsafe { std::mem::zeroed() };
            self.msgs[i].msg_hdr.msg_iov = &mut self.iov[i];
            self.msgs[i].msg_hdr.msg_iovlen = 1;
            self.msgs[i].msg_hdr.msg_control = self.ctrl[i].as_mut_ptr() as *mut libc::c_void;
            self.msgs[i].msg_hdr.msg_controllen = self.ctrl[i].len();
        }
        let n = unsafe { libc::recvmmsg(sock.raw(), self.msgs.as_mut_ptr(), BATCH as u32, libc::MSG_WAITFORONE, std::ptr::null_mut()) };
        n.max(0) as usize
    }
}

/// What the receiver counts: per packet its one-way delay, the network's
/// and the end host's share of it, the gaps between arrivals, each flow's
/// sequence, each second's packets and bytes.
struct Tally {
    r: RecvResult,
    owd: LocalHistogram,
    stack: LocalHistogram,
    endh: LocalHistogram,
    inter: LocalHistogram,
    flows: HashMap<u32, Flow>,
    prev_krx: i64,
    payload: [u8; 48],
}

impl Tally {
    fn new() -> Tally {
        let owd = hist();
        Tally {
            r: RecvResult { hist_scale: Some(owd.scale), ..Default::default() },
            owd,
            stack: hist(),
            endh: hist(),
            inter: hist(),
            flows: HashMap::new(),
            prev_krx: 0,
            payload: [0u8; 48],
        }
    }

    fn batch(&mut self, urx: i64) {
        self.r.batches += 1;
        if self.r.first_urx == 0 {
            self.r.first_urx = urx;
        }
        self.r.last_urx = urx;
    }

    /// One datagram (`buf`, `len` bytes on the wire) with its kernel stamps
    /// (software, hardware) and the time the application read it.
    #[allow(clippy::too_many_arguments)]
    fn packet(&mut self, buf: &[u8], len: usize, sw: i64, hw: i64, urx: i64, records: bool, e: &Ents) {
        let r = &mut self.r;
        let krx = if hw != 0 { hw } else { sw };
        if hw != 0 {
            r.hw_ts += 1;
        }
        let Some(h) = Header::read(buf) else {
            r.malformed += 1;
            if records {
                e.malformed.event_value(0, len as i64);
            }
            return;
        };
        r.packets += 1;
        r.bytes += len as u64;
        match self.flows.get_mut(&h.flow) {
            Some(f) => {
                f.add(h.seq);
            }
            None => {
                self.flows.insert(h.flow, Flow::new(h.seq));
            }
        }
        if krx == 0 {
            r.no_kernel_ts += 1;
        } else {
            self.kernel_stamped(krx, len, h.sent_ns, urx);
        }
        self.owd.add(urx - h.sent_ns);
        if records {
            let p = &mut self.payload;
            p[0..4].copy_from_slice(&h.flow.to_le_bytes());
            p[4..8].copy_from_slice(&h.worker.to_le_bytes());
            p[8..16].copy_from_slice(&h.seq.to_le_bytes());
            p[16..24].copy_from_slice(&h.sched_ns.to_le_bytes());
            p[24..32].copy_from_slice(&h.sent_ns.to_le_bytes());
            p[32..40].copy_from_slice(&krx.to_le_bytes());
            p[40..48].copy_from_slice(&urx.to_le_bytes());
            e.recv.event_payload(h.seq as u32, p);
        }
    }

    /// What a kernel receive stamp adds: the second it falls in, the gap
    /// since the last one, the network's and the end host's shares.
    fn kernel_stamped(&mut self, krx: i64, len: usize, sent_ns: i64, urx: i64) {
        let r = &mut self.r;
        if r.first_krx == 0 {
            r.first_krx = krx;
        }
        r.last_krx = krx;
        let sec = ((krx - r.first_krx) / 1_000_000_000) as usize;
        if sec < 1_000_000 {
            if r.per_second.len() <= sec {
                r.per_second.resize(sec + 1, (0, 0));
            }
            r.per_second[sec].0 += 1;
            r.per_second[sec].1 += len as u64;
        }
        if self.prev_krx != 0 {
            let d = krx - self.prev_krx;
            self.inter.add(d);
            r.interarrival_sum += d as f64;
            r.interarrival_sumsq += (d as f64) * (d as f64);
            r.interarrival_n += 1;
        }
        self.prev_krx = krx;
        self.stack.add(krx - sent_ns);
        self.endh.add(urx - krx);
    }

    fn finish(self) -> RecvResult {
        let mut r = self.r;
        r.owd = self.owd.snapshot();
        r.stack_net = self.stack.snapshot();
        r.end_host = self.endh.snapshot();
        r.interarrival = self.inter.snapshot();
        let mut fl: Vec<(u32, Flow)> = self.flows.into_iter().collect();
        fl.sort_by_key(|f| f.0);
        r.flows = fl;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(seqs: &[u64]) -> Flow {
        let mut f = Flow::new(seqs[0]);
        for &s in &seqs[1..] {
            f.add(s);
        }
        f
    }

    #[test]
    fn in_order_packets_count_nothing_lost() {
        let f = feed(&[0, 1, 2, 3, 4]);
        assert_eq!((f.unique, f.lost(), f.duplicates, f.reordered), (5, 0, 0, 0));
    }

    #[test]
    fn a_gap_is_lost_until_the_packet_turns_up_late() {
        let f = feed(&[0, 1, 4, 5]);
        assert_eq!((f.lost(), f.reordered), (2, 0));
        let f = feed(&[0, 1, 4, 5, 2, 3]);
        assert_eq!((f.lost(), f.reordered, f.duplicates), (0, 2, 0));
    }

    #[test]
    fn duplicates_are_told_from_late_packets() {
        let f = feed(&[0, 1, 2, 2, 1, 3, 3]);
        assert_eq!((f.unique, f.duplicates, f.reordered, f.lost()), (4, 3, 0, 0));
    }

    #[test]
    fn the_window_forgets_old_sequence_numbers_correctly() {
        let mut f = Flow::new(0);
        f.add(WINDOW_BITS + 10);
        // Slot of seq 10 was reused by WINDOW_BITS+10: seq 10 is beyond the window, not a duplicate.
        assert_eq!(f.add(10), Arrival::Reordered);
        assert_eq!(f.beyond_window, 1);
        assert_eq!(f.add(WINDOW_BITS + 10), Arrival::Duplicate);
    }
}
