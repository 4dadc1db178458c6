//! Timer-latency probe: how late periodic wake-ups on absolute deadlines are.
//!
//! The cyclictest measurement. Each thread sleeps with `clock_nanosleep(
//! CLOCK_MONOTONIC, TIMER_ABSTIME)` until its next deadline, reads the clock
//! when it wakes, and records the difference. Deadlines advance by the
//! interval from the first one, so there is no cumulative drift; when a
//! wake-up is so late that later deadlines have already passed, those periods
//! are counted as missed and skipped rather than producing a burst of
//! zero-latency catch-up samples. Every sample goes into a preallocated,
//! pre-faulted array (no allocation or page fault inside the loop) and, when
//! the trace has the `timer` group enabled, into the trace as an interval from
//! the deadline to the wake-up, so later analysis can open the exact window in
//! which the thread should have run.

use crate::os::{mono_ns, pin, sleep_until};
use loopscope_trace::{register, Entity, Kind};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Barrier};

/// What to run.
#[derive(Clone, Debug)]
pub struct TimerConfig {
    pub interval_ns: u64,
    pub duration_ns: u64,
    pub threads: usize,
    /// CPUs to pin threads to, round-robin; empty: no pinning.
    pub cpus: Vec<usize>,
    /// SCHED_FIFO priority; None: leave the scheduling policy alone.
    pub priority: Option<i32>,
    pub mlock: bool,
    /// Hold /dev/cpu_dma_latency at this many µs during the run (as
    /// cyclictest does by default with 0), keeping CPUs out of deep idle
    /// states; None leaves power management alone.
    pub dma_latency_us: Option<i32>,
    /// Most samples kept per thread (the rest still counts in `samples`).
    pub max_samples: usize,
}

/// One thread's outcome.
#[derive(Debug, Default)]
pub struct ThreadResult {
    pub index: usize,
    pub tid: u32,
    pub cpu: Option<usize>,
    /// Latency of each wake-up, ns, in order (up to `max_samples`).
    pub latencies: Vec<i64>,
    /// Wake-ups measured (may exceed `latencies.len()`).
    pub wakeups: u64,
    /// Deadlines that passed while the thread was still late for an earlier one.
    pub missed: u64,
    pub min_ns: i64,
    pub max_ns: i64,
    pub sum_ns: i128,
    /// How the scheduling request went, e.g. "SCHED_FIFO 80" or a reason it was refused.
    pub sched: String,
    pub sched_ok: bool,
    pub affinity_ok: bool,
    /// Set when the thread stopped for a reason other than the end of the run.
    pub error: Option<String>,
}

/// The probe's whole outcome.
#[derive(Debug, Default)]
pub struct TimerResult {
    pub threads: Vec<ThreadResult>,
    pub mlock: String,
    pub mlock_ok: bool,
    /// What happened to the /dev/cpu_dma_latency request.
    pub dma_latency: String,
    pub dma_latency_ok: bool,
    /// Cost of one clock read, measured before the run (ns): the probe's own
    /// contribution to each latency.
    pub overhead_ns: f64,
    pub interrupted: bool,
    pub elapsed_ns: u64,
}

/// SCHED_FIFO at `prio` for the calling thread; the kernel's refusal as is.
fn set_fifo(prio: i32) -> std::io::Result<()> {
    let p = libc::sched_param { sched_priority: prio };
    let r = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &p) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(r))
    }
}

/// Entities the probe logs (group `timer`).
pub struct TimerEntities {
    pub wakeup: &'static Entity,
    pub missed: &'static Entity,
}

pub fn entities() -> TimerEntities {
    TimerEntities {
        wakeup: register("timer", "wakeup", Kind::Interval, "from a wake-up's deadline to when the thread ran (tag: thread)", None).expect("built-in entity"),
        missed: register("timer", "missed", Kind::Event, "deadlines skipped because a wake-up was later than them (tag: thread, value: count)", None)
            .expect("built-in entity"),
    }
}

/// The cost of one clock read, the only work between the wake-up and the
/// measurement (the trace record is written after the latency is taken).
/// Median of 9 batches of 2,000 reads.
pub fn clock_read_ns() -> f64 {
    let mut v: Vec<f64> = (0..9)
        .map(|_| {
            let n = 2_000;
            let t0 = mono_ns();
            let mut acc = 0i64;
            for _ in 0..n {
                acc = acc.wrapping_add(mono_ns());
            }
            std::hint::black_box(acc);
            (mono_ns() - t0) as f64 / n as f64
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Run the probe. `stop` ends it early (e.g. Ctrl-C); what was measured is kept.
pub fn run(cfg: &TimerConfig, stop: Arc<AtomicBool>) -> TimerResult {
    let ents = entities();
    let mut res = TimerResult::default();
    (res.mlock, res.mlock_ok) = lock_memory(cfg.mlock);
    // The request holds only while the file stays open: keep it to the end.
    let (_qos, dma_note, dma_ok) = hold_dma_latency(cfg.dma_latency_us);
    (res.dma_latency, res.dma_latency_ok) = (dma_note, dma_ok);
    res.overhead_ns = clock_read_ns();
    let expected = (cfg.duration_ns / cfg.interval_ns.max(1)) as usize + 2;
    let keep = expected.min(cfg.max_samples);
    // Threads set themselves up (buffers, scheduling, pinning) first; the
    // first deadline is fixed only once all are ready, so set-up time never
    // shows up as latency.
    let start = Start { ready: Arc::new(Barrier::new(cfg.threads + 1)), go: Arc::new(Barrier::new(cfg.threads + 1)), at: Arc::new(AtomicI64::new(0)) };
    let handles: Vec<_> = (0..cfg.threads)
        .map(|i| {
            let (cfg, stop, start) = (cfg.clone(), stop.clone(), start.clone());
            let (wakeup, missed) = (ents.wakeup, ents.missed);
            std::thread::Builder::new()
                .name(format!("ls-timer-{i}"))
                .spawn(move || {
                    let mut r = pinned(i, &cfg);
                    // Trace buffers and sample memory are made and touched
                    // before the first deadline, never inside the loop, and
                    // before the thread turns SCHED_FIFO: faulting them in
                    // (locked, under mlockall) takes milliseconds, which at
                    // FIFO on the measured CPU held up the probes of other
                    // hosts already measuring there (a fleet monitor's lanes
                    // named this probe's own thread as their outliers' cause).
                    loopscope_trace::prepare_thread();
                    let mut lat = prefaulted(keep);
                    scheduled(&cfg, &mut r);
                    start.ready.wait();
                    start.go.wait();
                    measure(&cfg, i, start.at.load(Ordering::Acquire), &stop, (wakeup, missed), &mut r, &mut lat);
                    r.latencies = lat;
                    r
                })
                .expect("spawn timer thread")
        })
        .collect();
    start.ready.wait();
    let t_begin = mono_ns();
    start.at.store(t_begin + 1_000_000, Ordering::Release); // first deadline 1 ms out
    start.go.wait();
    for h in handles {
        match h.join() {
            Ok(r) => res.threads.push(r),
            Err(_) => res.threads.push(ThreadResult { error: Some("timer thread panicked".into()), ..Default::default() }),
        }
    }
    res.elapsed_ns = (mono_ns() - t_begin) as u64;
    res.interrupted = stop.load(Ordering::Relaxed);
    if cfg.mlock && res.mlock_ok {
        unsafe { libc::munlockall() };
    }
    res
}

/// The threads' rendezvous: all set up (`ready`), then the first deadline
/// is published in `at` and they start (`go`).
#[derive(Clone)]
struct Start {
    ready: Arc<Barrier>,
    go: Arc<Barrier>,
    at: Arc<AtomicI64>,
}

/// `mlockall` when asked: what came of it, and whether it took.
fn lock_memory(want: bool) -> (String, bool) {
    if !want {
        return ("not requested".into(), false);
    }
    let r = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
    if r == 0 {
        ("mlockall(MCL_CURRENT|MCL_FUTURE)".into(), true)
    } else {
        (format!("mlockall refused: {}", std::io::Error::last_os_error()), false)
    }
}

/// Hold /dev/cpu_dma_latency at `us` (the open file is the request), and say how it went.
fn hold_dma_latency(us: Option<i32>) -> (Option<std::fs::File>, String, bool) {
    use std::io::Write;
    let Some(us) = us else {
        return (None, "not requested (idle states as configured)".into(), true);
    };
    match std::fs::OpenOptions::new().write(true).open("/dev/cpu_dma_latency").and_then(|mut f| f.write_all(&us.to_ne_bytes()).map(|_| f)) {
        Ok(f) => (Some(f), format!("/dev/cpu_dma_latency held at {us} µs"), true),
        Err(e) => (None, format!("/dev/cpu_dma_latency {us} µs refused: {e}"), false),
    }
}

/// A thread's pinning, as its result starts.
fn pinned(i: usize, cfg: &TimerConfig) -> ThreadResult {
    let mut r = ThreadResult { index: i, tid: unsafe { libc::gettid() } as u32, min_ns: i64::MAX, max_ns: i64::MIN, ..Default::default() };
    if !cfg.cpus.is_empty() {
        let c = cfg.cpus[i % cfg.cpus.len()];
        r.cpu = Some(c);
        r.affinity_ok = pin(c);
    }
    r
}

/// A thread's scheduling policy, once its memory is ready.
fn scheduled(cfg: &TimerConfig, r: &mut ThreadResult) {
    match cfg.priority {
        Some(p) => match set_fifo(p) {
            Ok(()) => {
                r.sched = format!("SCHED_FIFO {p}");
                r.sched_ok = true;
            }
            Err(e) => r.sched = format!("SCHED_FIFO {p} refused ({e}); ran SCHED_OTHER"),
        },
        None => {
            r.sched = "SCHED_OTHER".into();
            r.sched_ok = true;
        }
    }
}

/// Room for `keep` samples, every page touched now.
fn prefaulted(keep: usize) -> Vec<i64> {
    let mut lat: Vec<i64> = Vec::with_capacity(keep);
    unsafe {
        let p = lat.as_mut_ptr();
        let mut k = 0;
        while k < keep {
            p.add(k).write_volatile(0);
            k += 512;
        }
    }
    lat
}

/// The loop: sleep to each deadline, take the lateness, log it; deadlines
/// that passed while the thread was late are counted as missed and skipped.
fn measure(cfg: &TimerConfig, i: usize, start: i64, stop: &AtomicBool, (wakeup, missed): (&Entity, &Entity), r: &mut ThreadResult, lat: &mut Vec<i64>) {
    let keep = lat.capacity();
    let end = start + cfg.duration_ns as i64;
    // Stagger threads by a fraction of the interval, as cyclictest does.
    let mut next = start + (i as i64 * cfg.interval_ns as i64) / (cfg.threads as i64).max(1) / 2;
    let iv = cfg.interval_ns as i64;
    while next < end && !stop.load(Ordering::Relaxed) {
        sleep_until(next);
        let now = mono_ns();
        let l = now - next;
        if lat.len() < keep {
            lat.push(l);
        }
        r.wakeups += 1;
        r.sum_ns += l as i128;
        r.min_ns = r.min_ns.min(l);
        r.max_ns = r.max_ns.max(l);
        wakeup.interval_mono(i as u32, next as u64, l.max(0) as u64);
        next += iv;
        if now >= next {
            let k = (now - next) / iv + 1;
            // Only deadlines inside the run count as missed.
            let inside = if next >= end { 0 } else { k.min((end - next + iv - 1) / iv) };
            if inside > 0 {
                r.missed += inside as u64;
                missed.event_value(i as u32, inside);
            }
            next += k * iv;
        }
    }
}
