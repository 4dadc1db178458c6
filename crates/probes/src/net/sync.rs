//! Clock-sync probes: coded pairs of timestamped datagrams between a host
//! and the reference host, every stamp taken by the kernel.
//!
//! An initiator (on every host but the reference) sends, `rate` times a
//! second, a *pair* of small probes `gap_ns` apart to the responder on the
//! reference host; the responder answers each probe as it arrives, so the
//! answers travel back as a pair too. Both ends keep only kernel timestamps:
//! the initiator the TX stamp of each probe (SOF_TIMESTAMPING_TX_SOFTWARE,
//! from the error queue) and the RX stamp of its answer, the responder the
//! RX stamp of each probe and the TX stamp of its answer. Neither end sends
//! its stamps to the other: each writes them into its own trace, one record
//! per probe, and the offline estimator (python/loopscope/clock) joins the
//! two traces on (flow, seq, idx). Causality gives each probe a bound on the
//! offset between the two clocks (an RX stamp follows its TX stamp in true
//! time); the pair tells queueing apart: if the gap between the two probes
//! changed on the way, one of them waited in a queue and both are dropped.
//!
//! Kernel stamps are CLOCK_REALTIME (hardware stamps where the NIC makes
//! them); the trace's calibration pairs relate that clock to the host's
//! CLOCK_MONOTONIC, on which every other record lies. Records:
//! `clocksync/probe` (initiator; payload seq, idx, flow, tx, rx as i64, rx
//! 0 when the answer never came) and `clocksync/serve` (responder; payload
//! flow, seq, idx, rx, tx).

use super::sock::{drain_tx_stamps, recv_stamped, Received, TxStamp, Udp, SCM_TSTAMP_SND};
use crate::error::{ProbeError, Result};
use crate::os::{mono_ns, sleep_until};
use loopscope_trace::{register, Entity, Kind};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub const MAGIC: [u8; 4] = *b"LSCK";
pub const PROBE: u8 = 1;
pub const ANSWER: u8 = 2;
pub const SIZE: usize = 64;

/// A probe or an answer: magic, kind, idx (0/1 within its pair), flow, seq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Msg {
    pub kind: u8,
    pub idx: u8,
    pub flow: u32,
    pub seq: u64,
}

impl Msg {
    pub fn write(&self, b: &mut [u8; SIZE]) {
        b.fill(0);
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = self.kind;
        b[5] = self.idx;
        b[8..12].copy_from_slice(&self.flow.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
    }
    pub fn read(b: &[u8]) -> Option<Msg> {
        if b.len() < 24 || b[0..4] != MAGIC || !(b[4] == PROBE || b[4] == ANSWER) || b[5] > 1 {
            return None;
        }
        Some(Msg { kind: b[4], idx: b[5], flow: u32::from_le_bytes(b[8..12].try_into().ok()?), seq: u64::from_le_bytes(b[16..24].try_into().ok()?) })
    }
}

fn payload(v: &[i64; 5]) -> [u8; 40] {
    let mut p = [0u8; 40];
    for (i, x) in v.iter().enumerate() {
        p[i * 8..i * 8 + 8].copy_from_slice(&x.to_le_bytes());
    }
    p
}

/// Sends on a socket with OPT_ID in order; the TX stamp's key is the index
/// of the send, so a queue of what was sent (in order) names each stamp.
struct Sent {
    next_key: u32,
    waiting: VecDeque<(u32, (u32, u64, u8), i64)>, // key, (flow, seq, idx), mono time sent
}

impl Sent {
    fn new() -> Sent {
        Sent { next_key: 0, waiting: VecDeque::new() }
    }
    fn push(&mut self, id: (u32, u64, u8)) {
        self.waiting.push_back((self.next_key, id, mono_ns()));
        self.next_key = self.next_key.wrapping_add(1);
    }
    /// Match drained stamps to what was sent; return (id, tx) pairs found,
    /// and count those that waited longer than `give_up_ns` without one.
    fn settle(&mut self, stamps: &mut Vec<TxStamp>, give_up_ns: i64, missing: &mut u64) -> Vec<((u32, u64, u8), i64)> {
        let mut by_key: HashMap<u32, i64> = HashMap::new();
        for s in stamps.drain(..) {
            if s.kind == SCM_TSTAMP_SND {
                by_key.insert(s.key, s.ns);
            }
        }
        let mut out = Vec::new();
        let now = mono_ns();
        let mut keep = VecDeque::new();
        while let Some((k, id, at)) = self.waiting.pop_front() {
            if let Some(ns) = by_key.remove(&k) {
                out.push((id, ns));
            } else if now - at > give_up_ns {
                *missing += 1;
                out.push((id, 0));
            } else {
                keep.push_back((k, id, at));
            }
        }
        self.waiting = keep;
        out
    }
}

// ---- responder ----------------------------------------------------------------------

#[derive(Debug, Default)]
pub struct ServeResult {
    pub received: u64,
    pub answered: u64,
    pub malformed: u64,
    pub send_errors: u64,
    pub no_tx_stamp: u64,
    pub no_rx_stamp: u64,
    pub elapsed_ns: u64,
}

const SERVE_TIMEOUT_MS: i64 = 500;

pub fn bind(addr: &SocketAddr) -> Result<Udp> {
    let s = Udp::bind(addr, 1 << 20)?;
    s.enable_rx_tx_timestamps()?;
    // The responder is never paused while probes measure (the initiators
    // are): each timeout is a wake-up of the lab inside some window, so it
    // looks at `stop` twice a second (at 20 ms it was up to 1 % of a timer
    // probe's outlier time under load); a stop waits that long at most.
    s.set_read_timeout_ms(SERVE_TIMEOUT_MS);
    Ok(s)
}

/// Answer probes until `stop`.
pub fn serve(sock: Udp, stop: Arc<AtomicBool>) -> ServeResult {
    let ent = register(
        "clocksync",
        "serve",
        Kind::Event,
        "a clock-sync probe answered; payload: flow, seq, idx, kernel RX of the probe, kernel TX of the answer (i64, CLOCK_REALTIME ns; 0 = no stamp)",
        None,
    )
    .expect("entity");
    loopscope_trace::prepare_thread();
    let mut r = ServeResult::default();
    let (mut buf, mut ctrl) = ([0u8; 256], [0u8; 256]);
    let mut out = [0u8; SIZE];
    let mut sent = Sent::new();
    let mut rx_of: HashMap<(u32, u64, u8), i64> = HashMap::new();
    let mut stamps = Vec::new();
    let t0 = mono_ns();
    let emit = |sent: &mut Sent, stamps: &mut Vec<TxStamp>, rx_of: &mut HashMap<(u32, u64, u8), i64>, r: &mut ServeResult| {
        drain_tx_stamps(sock.raw(), stamps);
        for (id, tx) in sent.settle(stamps, 500_000_000, &mut r.no_tx_stamp) {
            let rx = rx_of.remove(&id).unwrap_or(0);
            ent.event_payload(id.1 as u32, &payload(&[id.0 as i64, id.1 as i64, id.2 as i64, rx, tx]));
        }
    };
    while !stop.load(Ordering::Relaxed) {
        if let Some(Received { len: n, krx, from: name, from_len: namelen, .. }) = recv_stamped(sock.raw(), &mut buf, &mut ctrl) {
            match Msg::read(&buf[..n]).filter(|m| m.kind == PROBE) {
                None => r.malformed += 1,
                Some(m) => {
                    r.received += 1;
                    if krx == 0 {
                        r.no_rx_stamp += 1;
                    }
                    Msg { kind: ANSWER, ..m }.write(&mut out);
                    let s =
                        unsafe { libc::sendto(sock.raw(), out.as_ptr() as *const libc::c_void, SIZE, 0, &name as *const _ as *const libc::sockaddr, namelen) };
                    if s < 0 {
                        r.send_errors += 1;
                    } else {
                        r.answered += 1;
                        let id = (m.flow, m.seq, m.idx);
                        rx_of.insert(id, krx);
                        sent.push(id);
                    }
                }
            }
        }
        emit(&mut sent, &mut stamps, &mut rx_of, &mut r);
    }
    // The last stamps: give the kernel a moment, then settle everything.
    std::thread::sleep(std::time::Duration::from_millis(5));
    drain_tx_stamps(sock.raw(), &mut stamps);
    for (id, tx) in sent.settle(&mut stamps, -1, &mut r.no_tx_stamp) {
        let rx = rx_of.remove(&id).unwrap_or(0);
        ent.event_payload(id.1 as u32, &payload(&[id.0 as i64, id.1 as i64, id.2 as i64, rx, tx]));
    }
    r.elapsed_ns = (mono_ns() - t0) as u64;
    r
}

// ---- initiator ----------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct SyncConfig {
    pub dest: SocketAddr,
    pub flow: u32,
    /// Pairs per second.
    pub rate: f64,
    /// Gap between the two probes of a pair.
    pub gap_ns: i64,
    pub duration_ns: Option<u64>,
    /// How long to wait for the last answers.
    pub grace_ns: i64,
}

#[derive(Debug, Default)]
pub struct SyncResult {
    pub pairs: u64,
    pub sent: u64,
    pub answered: u64,
    pub lost: u64,
    pub send_errors: u64,
    pub no_tx_stamp: u64,
    pub malformed: u64,
    /// Best round trip seen (answer RX − probe TX), ns.
    pub min_rtt_ns: i64,
    pub elapsed_ns: u64,
    pub interrupted: bool,
}

/// Send pairs until `duration` or `stop`; every probe becomes one record.
pub fn initiate(cfg: &SyncConfig, stop: Arc<AtomicBool>) -> Result<SyncResult> {
    if !(cfg.rate > 0.0 && cfg.rate <= 10_000.0) {
        return Err(ProbeError::Input(format!("rate {} pairs/s: must be above 0 and at most 10000", cfg.rate)));
    }
    let sock = Arc::new(Udp::connect(&cfg.dest, 1 << 20)?);
    sock.enable_rx_tx_timestamps()?;
    sock.set_read_timeout_ms(20);
    let ent = register(
        "clocksync",
        "probe",
        Kind::Event,
        "a clock-sync probe and its answer; payload: seq, idx, flow, kernel TX of the probe, kernel RX of the answer (i64, CLOCK_REALTIME ns; 0 = none)",
        None,
    )
    .expect("entity");
    loopscope_trace::prepare_thread();
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    let answers: Arc<Mutex<HashMap<(u64, u8), i64>>> = Arc::new(Mutex::new(HashMap::new()));
    let done = Arc::new(AtomicBool::new(false));
    let reader = spawn_reader(sock.clone(), answers.clone(), done.clone(), cfg.flow)?;
    let mut r = SyncResult { min_rtt_ns: i64::MAX, ..Default::default() };
    let mut book = Book { cfg, ent, answers, sent: Sent::new(), stamps: Vec::new(), open: HashMap::new() };
    let mut pace = Pace::new(cfg);
    let t0 = pace.t0;
    let mut seq: u64 = 0;
    loop {
        if stop.load(Ordering::Relaxed) {
            r.interrupted = true;
            break;
        }
        if cfg.duration_ns.is_some_and(|d| pace.due as i64 - t0 >= d as i64) {
            break;
        }
        pace.wait();
        send_pair(&sock, cfg, seq, &mut book.sent, &mut r);
        seq += 1;
        book.settle(&sock, 200_000_000, &mut r.no_tx_stamp);
        book.flush(&mut r, false);
        pace.advance();
    }
    r.elapsed_ns = (mono_ns() - t0).max(0) as u64;
    // Wait for the last answers, then settle everything.
    let end = mono_ns() + if r.interrupted { cfg.grace_ns.min(50_000_000) } else { cfg.grace_ns };
    while mono_ns() < end && !(book.open.is_empty() && book.sent.waiting.is_empty()) {
        std::thread::sleep(std::time::Duration::from_millis(2));
        book.settle(&sock, 200_000_000, &mut r.no_tx_stamp);
        book.flush(&mut r, false);
    }
    book.settle(&sock, -1, &mut r.no_tx_stamp);
    book.flush(&mut r, true);
    done.store(true, Ordering::Relaxed);
    r.malformed = reader.join().unwrap_or(0);
    if r.min_rtt_ns == i64::MAX {
        r.min_rtt_ns = 0;
    }
    Ok(r)
}

/// The answers' reader: runs until the sender is done with its grace
/// period, even after a stop (answers still in flight must not count as
/// lost); the malformed messages it saw.
fn spawn_reader(sock: Arc<Udp>, answers: Arc<Mutex<HashMap<(u64, u8), i64>>>, done: Arc<AtomicBool>, flow: u32) -> Result<std::thread::JoinHandle<u64>> {
    std::thread::Builder::new()
        .name("ls-sync-recv".into())
        .spawn(move || {
            let (mut buf, mut ctrl) = ([0u8; 256], [0u8; 256]);
            let mut malformed = 0u64;
            while !done.load(Ordering::Relaxed) {
                if let Some(Received { len: n, krx, .. }) = recv_stamped(sock.raw(), &mut buf, &mut ctrl) {
                    match Msg::read(&buf[..n]).filter(|m| m.kind == ANSWER && m.flow == flow) {
                        Some(m) => {
                            answers.lock().unwrap_or_else(|e| e.into_inner()).insert((m.seq, m.idx), krx);
                        }
                        None => malformed += 1,
                    }
                }
            }
            malformed
        })
        .map_err(ProbeError::os("cannot start the receiving thread"))
}

/// One pair: two probes `gap_ns` apart (spun, not slept).
fn send_pair(sock: &Udp, cfg: &SyncConfig, seq: u64, sent: &mut Sent, r: &mut SyncResult) {
    let mut buf = [0u8; SIZE];
    for idx in 0..2u8 {
        if idx == 1 {
            let until = mono_ns() + cfg.gap_ns;
            while mono_ns() < until {
                std::hint::spin_loop();
            }
        }
        Msg { kind: PROBE, idx, flow: cfg.flow, seq }.write(&mut buf);
        if unsafe { libc::send(sock.raw(), buf.as_ptr() as *const libc::c_void, SIZE, 0) } < 0 {
            r.send_errors += 1;
        } else {
            r.sent += 1;
            sent.push((cfg.flow, seq, idx));
        }
    }
    r.pairs += 1;
}

/// When pairs go out: `rate` a second with a small deterministic jitter on
/// the period (so the probes do not lock onto a periodic disturbance of the
/// same period); after a pause it starts again from now.
struct Pace {
    period: f64,
    lcg: u64,
    t0: i64,
    due: f64,
}

impl Pace {
    fn new(cfg: &SyncConfig) -> Pace {
        let t0 = mono_ns() + 1_000_000;
        Pace { period: 1e9 / cfg.rate, lcg: 0x9E37_79B9_7F4A_7C15 ^ cfg.flow as u64, t0, due: t0 as f64 }
    }

    fn wait(&mut self) {
        sleep_until(self.due as i64);
        // Paused (the lab stops the clock-sync probes while a probe step
        // measures): start again from now rather than sending the pairs
        // that came due meanwhile in one burst.
        let now = mono_ns() as f64;
        if now - self.due > self.period {
            self.due = now;
        }
    }

    fn advance(&mut self) {
        self.lcg = self.lcg.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let u = (self.lcg >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        self.due += self.period * (0.9 + 0.2 * u);
    }
}

/// The probes sent and not yet recorded: waiting for their TX stamp
/// (`sent`), then for their answer (`open`: (seq, idx) -> (tx, mono when
/// its stamp came)); each becomes one record when answered or given up.
struct Book<'a> {
    cfg: &'a SyncConfig,
    ent: &'static Entity,
    answers: Arc<Mutex<HashMap<(u64, u8), i64>>>,
    sent: Sent,
    stamps: Vec<TxStamp>,
    open: HashMap<(u64, u8), (i64, i64)>,
}

impl Book<'_> {
    /// Match the kernel's TX stamps to the probes (`max_age` -1: all now).
    fn settle(&mut self, sock: &Udp, max_age: i64, no_tx_stamp: &mut u64) {
        drain_tx_stamps(sock.raw(), &mut self.stamps);
        for ((_, s, i), tx) in self.sent.settle(&mut self.stamps, max_age, no_tx_stamp) {
            self.open.insert((s, i), (tx, mono_ns()));
        }
    }

    /// Record the probes whose answer came, and those waited for longer than
    /// the grace period (or all, at the end) as lost.
    fn flush(&mut self, r: &mut SyncResult, all: bool) {
        let now = mono_ns();
        let mut got = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        let mut finished = Vec::new();
        for (&k, &(tx, at)) in self.open.iter() {
            if let Some(&rx) = got.get(&k) {
                finished.push((k, tx, rx));
            } else if all || now - at > self.cfg.grace_ns {
                finished.push((k, tx, 0));
            }
        }
        for (k, tx, rx) in finished {
            self.open.remove(&k);
            got.remove(&k);
            if rx != 0 {
                r.answered += 1;
                if tx != 0 {
                    r.min_rtt_ns = r.min_rtt_ns.min(rx - tx);
                }
            } else {
                r.lost += 1;
            }
            self.ent.event_payload(k.0 as u32, &payload(&[k.0 as i64, k.1 as i64, self.cfg.flow as i64, tx, rx]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_reads_back_as_written() {
        let m = Msg { kind: PROBE, idx: 1, flow: 7, seq: 123_456_789 };
        let mut b = [0u8; SIZE];
        m.write(&mut b);
        assert_eq!(Msg::read(&b), Some(m));
    }

    #[test]
    fn foreign_datagrams_are_refused() {
        let mut b = [0u8; SIZE];
        Msg { kind: PROBE, idx: 0, flow: 1, seq: 1 }.write(&mut b);
        b[0] = b'X';
        assert_eq!(Msg::read(&b), None);
        Msg { kind: PROBE, idx: 0, flow: 1, seq: 1 }.write(&mut b);
        b[5] = 2;
        assert_eq!(Msg::read(&b), None);
        assert_eq!(Msg::read(&b[..10]), None);
    }

    #[test]
    fn probes_over_loopback_come_back_with_kernel_stamps_in_causal_order() {
        let sock = bind(&"127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = sock.local;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let server = std::thread::spawn(move || serve(sock, s2));
        let cfg = SyncConfig { dest: addr, flow: 3, rate: 200.0, gap_ns: 20_000, duration_ns: Some(200_000_000), grace_ns: 100_000_000 };
        let r = initiate(&cfg, Arc::new(AtomicBool::new(false))).unwrap();
        stop.store(true, Ordering::Relaxed);
        let s = server.join().unwrap();
        assert!(r.pairs >= 30, "{r:?}");
        assert_eq!(r.sent, 2 * r.pairs);
        assert_eq!(r.lost, 0, "{r:?}");
        assert_eq!(s.received, r.sent);
        assert_eq!(r.no_tx_stamp, 0);
        assert!(r.min_rtt_ns > 0, "{r:?}");
        assert_eq!(s.no_rx_stamp, 0, "{s:?}");
        assert_eq!(s.no_tx_stamp, 0, "{s:?}");
    }
}
