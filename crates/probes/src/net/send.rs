//! The paced UDP sender: what was asked, when it was asked.
//!
//! Every packet has an absolute departure deadline from the schedule (so
//! there is no drift to compensate, unlike Egg's hand-tuned offsets).
//! A worker sleeps until shortly before a deadline and spins the rest
//! (timer wake-ups are tens of microseconds late on commodity machines, so
//! the margin adapts to how late this one wakes), and
//! when it is at or behind a deadline it sends every packet that is due in
//! one `sendmmsg` (so a gap smaller than the cost of a send does not turn
//! into a growing backlog). N workers share one schedule, worker w sending
//! packets w, w+N, w+2N, …, each on its own socket. Each packet carries its
//! scheduled and actual send times; each departure's error (actual minus
//! scheduled) is kept, and with `tx_timestamps` the kernel's TX_SCHED and
//! TX_SOFTWARE times of every packet go into the trace.
//!
//! A duration-bounded run stops at its end even if it fell behind: packets
//! whose deadline passed unsent are counted as not sent, and the result says
//! the sender could not keep up, never a silently short rate.

use super::packet::{Header, DATA, HEADER};
use super::schedule::{Pattern, Schedule};
use super::sock::{drain_tx_stamps, realtime_offset_ns, TxStamp, Udp, SCM_TSTAMP_SCHED, SCM_TSTAMP_SND};
use crate::error::{ProbeError, Result};
use crate::os::{mono_ns, pin, sleep_until};
use loopscope_trace::{register, Entity, Kind};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

/// Sleep until `margin` before a deadline, then spin. The margin adapts to
/// how late this machine wakes sleepers: doubled whenever a wake-up came
/// after the deadline itself, shrunk by 1/64 after each timely one, within
/// these bounds.
const MARGIN_MIN_NS: i64 = 30_000;
const MARGIN_MAX_NS: i64 = 5_000_000;
const MAX_BATCH: usize = 64;

#[derive(Clone, Debug)]
pub struct SendConfig {
    pub dest: SocketAddr,
    pub size: usize,
    /// Packets per second as num/den.
    pub pps_num: u128,
    pub pps_den: u128,
    pub pattern: Pattern,
    pub count: Option<u64>,
    pub duration_ns: Option<u64>,
    pub workers: usize,
    pub flow: u32,
    pub tx_timestamps: bool,
    /// Log every packet to the trace (group `net`).
    pub records: bool,
    pub cpus: Vec<usize>,
}

#[derive(Debug, Default)]
pub struct WorkerResult {
    pub sent: u64,
    pub unsent: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub batches: u64,
    pub largest_batch: usize,
    pub tx_sched: u64,
    pub tx_sw: u64,
    pub dep_err_ns: Vec<i32>,
    pub last_sent_mono: i64,
}

#[derive(Debug, Default)]
pub struct SendResult {
    pub workers: Vec<WorkerResult>,
    pub start_mono: i64,
    /// Scheduled span: from the first deadline to one mean gap after the last.
    pub scheduled_ns: u64,
    pub elapsed_ns: u64,
    pub interrupted: bool,
    pub realtime_offset_ns: i64,
}

struct Ents {
    send: &'static Entity,
    tx_sched: &'static Entity,
    tx_sw: &'static Entity,
}

fn ents() -> Ents {
    Ents {
        send: register("net", "send", Kind::Interval, "a packet's departure: from its scheduled time to the send call (tag: sequence number)", None)
            .expect("entity"),
        tx_sched: register("net", "tx_sched", Kind::Event, "kernel TX_SCHED timestamp of a packet, CLOCK_REALTIME ns (tag: sequence number)", None)
            .expect("entity"),
        tx_sw: register("net", "tx_sw", Kind::Event, "kernel TX_SOFTWARE timestamp of a packet, CLOCK_REALTIME ns (tag: sequence number)", None)
            .expect("entity"),
    }
}

fn log_stamps(e: &Ents, st: &mut Vec<TxStamp>, w: usize, n: usize, r: &mut WorkerResult, records: bool) {
    for s in st.drain(..) {
        let seq = w as u64 + s.key as u64 * n as u64;
        match s.kind {
            SCM_TSTAMP_SCHED => {
                r.tx_sched += 1;
                if records {
                    e.tx_sched.event_value(seq as u32, s.ns);
                }
            }
            SCM_TSTAMP_SND => {
                r.tx_sw += 1;
                if records {
                    e.tx_sw.event_value(seq as u32, s.ns);
                }
            }
            _ => {}
        }
    }
}

fn worker(cfg: &SendConfig, w: usize, sock: Udp, t0: i64, rt_off: i64, stop: &AtomicBool) -> WorkerResult {
    let e = ents();
    loopscope_trace::prepare_thread();
    if !cfg.cpus.is_empty() {
        pin(cfg.cpus[w % cfg.cpus.len()]);
    }
    let n = cfg.workers;
    let mut r = WorkerResult::default();
    let expected = cfg.count.map(|c| c as usize).unwrap_or_else(|| {
        let d = cfg.duration_ns.unwrap_or(0) as f64 / 1e9;
        (d * cfg.pps_num as f64 / cfg.pps_den as f64 / n as f64) as usize + 16
    });
    r.dep_err_ns.reserve(expected.min(20_000_000));
    let mut sched = Schedule::new(cfg.pattern.clone(), cfg.pps_num, cfg.pps_den, cfg.count, cfg.duration_ns).enumerate().filter(move |(k, _)| k % n == w);
    let mut due: VecDeque<(u64, i64)> = VecDeque::with_capacity(MAX_BATCH * 2);
    let mut out = Outgoing::new(cfg.size);
    let mut stamps: Vec<TxStamp> = Vec::new();
    let end = cfg.duration_ns.map(|d| t0 + d as i64);
    let mut since_drain = 0usize;
    let mut margin = 200_000i64;
    loop {
        if due.is_empty() {
            match sched.next() {
                Some((k, off)) => due.push_back((k as u64, t0 + off as i64)),
                None => break,
            }
        }
        let deadline = due[0].1;
        if deadline > mono_ns() && cfg.tx_timestamps && since_drain > 0 {
            drain_tx_stamps(sock.raw(), &mut stamps);
            log_stamps(&e, &mut stamps, w, n, &mut r, cfg.records);
            since_drain = 0;
        }
        let now = wait_for(deadline, &mut margin);
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if end.is_some_and(|e| now >= e + 1_000_000) {
            // Behind and past the end: what is still due was not sent.
            r.unsent += due.len() as u64 + sched.by_ref().count() as u64;
            break;
        }
        // Everything due by now goes in one batch.
        while due.len() < MAX_BATCH {
            let Some((k, off)) = sched.next() else { break };
            due.push_back((k as u64, t0 + off as i64));
            if t0 + (off as i64) > now {
                break;
            }
        }
        let ready = due.iter().take_while(|(_, d)| *d <= now).count().max(1);
        let sent = out.send(&sock, cfg, w, &due, ready, now, rt_off);
        if !account(&e, cfg, &mut r, &due, ready, sent, now) {
            break;
        }
        due.drain(..ready);
        since_drain += sent.max(0) as usize;
        if cfg.tx_timestamps && since_drain >= 256 {
            drain_tx_stamps(sock.raw(), &mut stamps);
            log_stamps(&e, &mut stamps, w, n, &mut r, cfg.records);
            since_drain = 0;
        }
    }
    if cfg.tx_timestamps {
        // Stamps of the last packets arrive shortly after their send (later
        // on a loaded machine; the wait ends as soon as all are in).
        let until = mono_ns() + 200_000_000;
        while mono_ns() < until && r.tx_sw + r.tx_sched < 2 * r.sent {
            drain_tx_stamps(sock.raw(), &mut stamps);
            log_stamps(&e, &mut stamps, w, n, &mut r, cfg.records);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    r
}

/// Sleep until `margin` before `deadline`, spin the rest; the margin grows
/// when a wake-up came after the deadline and shrinks slowly otherwise.
/// Returns the time it ended (at or after the deadline).
fn wait_for(deadline: i64, margin: &mut i64) -> i64 {
    let now = mono_ns();
    if deadline <= now {
        return now;
    }
    if deadline - now > *margin {
        sleep_until(deadline - *margin);
        *margin = if mono_ns() > deadline { (*margin * 2).min(MARGIN_MAX_NS) } else { (*margin - *margin / 64).max(MARGIN_MIN_NS) };
    }
    loop {
        let now = mono_ns();
        if now >= deadline {
            return now;
        }
        std::hint::spin_loop();
    }
}

/// The buffers of one `sendmmsg` batch, made once.
struct Outgoing {
    bufs: Vec<Vec<u8>>,
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
}

impl Outgoing {
    fn new(size: usize) -> Outgoing {
        Outgoing {
            bufs: (0..MAX_BATCH).map(|_| vec![0u8; size]).collect(),
            iov: vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_BATCH],
            msgs: vec![unsafe { std::mem::zeroed() }; MAX_BATCH],
        }
    }

    /// The first `ready` packets of `due`, each stamped with its schedule
    /// and its send time `now` (CLOCK_REALTIME: + `rt_off`), in one
    /// `sendmmsg`: how many went (-1: the call failed).
    #[allow(clippy::too_many_arguments)]
    fn send(&mut self, sock: &Udp, cfg: &SendConfig, w: usize, due: &VecDeque<(u64, i64)>, ready: usize, now: i64, rt_off: i64) -> isize {
        for (i, &(k, d)) in due.iter().take(ready).enumerate() {
            Header { kind: DATA, flow: cfg.flow, worker: w as u32, seq: k, sched_ns: d + rt_off, sent_ns: now + rt_off }.write(&mut self.bufs[i][..HEADER]);
            self.iov[i] = libc::iovec { iov_base: self.bufs[i].as_mut_ptr() as *mut libc::c_void, iov_len: cfg.size };
            self.msgs[i] = unsafe { std::mem::zeroed() };
            self.msgs[i].msg_hdr.msg_iov = &mut self.iov[i];
            self.msgs[i].msg_hdr.msg_iovlen = 1;
        }
        unsafe { libc::sendmmsg(sock.raw(), self.msgs.as_mut_ptr(), ready as u32, 0) as isize }
    }
}

/// Count a batch of `ready` packets of which `sent` went (-1: the call
/// failed): each sent packet's departure error (sent at `now`), errors,
/// batch sizes. False when nothing has ever got through (no route, no
/// permission) after 1000 tries: the worker stops rather than spin through
/// the schedule.
fn account(e: &Ents, cfg: &SendConfig, r: &mut WorkerResult, due: &VecDeque<(u64, i64)>, ready: usize, sent: isize, now: i64) -> bool {
    let done = mono_ns();
    let ok = if sent < 0 {
        let err = std::io::Error::last_os_error();
        r.errors += ready as u64;
        if r.first_error.is_none() {
            r.first_error = Some(format!("sending to {}: {err}", cfg.dest));
        }
        if r.sent == 0 && r.errors >= 1000 {
            return false;
        }
        0
    } else {
        sent as usize
    };
    r.batches += 1;
    r.largest_batch = r.largest_batch.max(ready);
    for &(k, d) in due.iter().take(ok) {
        let err = now - d;
        if r.dep_err_ns.len() < 20_000_000 {
            r.dep_err_ns.push(err.clamp(i32::MIN as i64, i32::MAX as i64) as i32);
        }
        if cfg.records {
            e.send.interval_mono(k as u32, d as u64, err.max(0) as u64);
        }
    }
    if sent >= 0 && ok < ready {
        r.errors += (ready - ok) as u64;
    }
    r.sent += ok as u64;
    r.last_sent_mono = done;
    true
}

/// Validate and open the workers' sockets (errors before anything is sent).
pub fn open_sockets(cfg: &SendConfig) -> Result<Vec<Udp>> {
    if cfg.size < HEADER || cfg.size > 65_507 {
        return Err(ProbeError::Input(format!("packet size must be {HEADER}..65507 bytes (a loopscope header is {HEADER}) [got {}]", cfg.size)));
    }
    if cfg.workers == 0 || cfg.workers > 256 {
        return Err(ProbeError::Input(format!("workers must be 1..256 [got {}]", cfg.workers)));
    }
    (0..cfg.workers)
        .map(|_| {
            let s = Udp::connect(&cfg.dest, 4 << 20)?;
            if cfg.tx_timestamps {
                s.enable_tx_timestamps()?;
            }
            Ok(s)
        })
        .collect()
}

pub fn run(cfg: &SendConfig, stop: Arc<AtomicBool>) -> Result<SendResult> {
    let socks = open_sockets(cfg)?;
    let rt_off = realtime_offset_ns();
    let barrier = Arc::new(Barrier::new(cfg.workers + 1));
    let t0 = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let hs: Vec<_> = socks
        .into_iter()
        .enumerate()
        .map(|(w, s)| {
            let (cfg, stop, barrier, t0) = (cfg.clone(), stop.clone(), barrier.clone(), t0.clone());
            std::thread::Builder::new()
                .name(format!("ls-send-{w}"))
                .spawn(move || {
                    loopscope_trace::prepare_thread();
                    barrier.wait();
                    barrier.wait();
                    worker(&cfg, w, s, t0.load(Ordering::Acquire), rt_off, &stop)
                })
                .expect("spawn sender")
        })
        .collect();
    barrier.wait();
    let start = mono_ns() + 5_000_000;
    t0.store(start, Ordering::Release);
    barrier.wait();
    let workers: Vec<WorkerResult> = hs.into_iter().map(|h| h.join().unwrap_or_default()).collect();
    let sched = Schedule::new(cfg.pattern.clone(), cfg.pps_num, cfg.pps_den, cfg.count, cfg.duration_ns);
    let gap = sched.mean_gap_ns();
    let last = Schedule::new(cfg.pattern.clone(), cfg.pps_num, cfg.pps_den, cfg.count, cfg.duration_ns).last().unwrap_or(0);
    let scheduled = match cfg.duration_ns {
        Some(d) => d,
        None => last + gap.round() as u64,
    };
    let last_sent = workers.iter().map(|w| w.last_sent_mono).max().unwrap_or(start);
    Ok(SendResult {
        start_mono: start,
        scheduled_ns: scheduled,
        elapsed_ns: (last_sent - start).max(0) as u64,
        interrupted: stop.load(Ordering::Relaxed),
        realtime_offset_ns: rt_off,
        workers,
    })
}
