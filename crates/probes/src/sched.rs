//! Scheduler-responsiveness probe: the three-thread microbenchmark of Paul et al. 2003.
//!
//! Two threads spin on a trivial computation; a third alternates sleeping
//! for `sleep_ns` and computing a fixed amount of work that takes `work_ns`
//! when it has a CPU to itself. With the CPUs kept busy, how quickly the
//! scheduler gives the third thread a CPU when it wakes, and how much of its
//! burst it loses to the others, is what "responsive" means: the probe
//! records each wake-up's delay past its deadline and each burst's extra
//! completion time over the fastest burst measured alone before the busy
//! threads started (the minimum, i.e. the least disturbed). Both go into the
//! trace as intervals, so the analysis can open any slow cycle.

use crate::os::{mono_ns, pin, sleep_until};
use loopscope_trace::{register, Entity, Kind};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct SchedConfig {
    pub busy_threads: usize,
    pub sleep_ns: u64,
    pub work_ns: u64,
    pub duration_ns: u64,
    /// Pin all three kinds of thread to these CPUs (round-robin); empty: no pinning.
    pub cpus: Vec<usize>,
    /// Use this burst size and alone-reference instead of calibrating, so
    /// that runs in different phases do the same work (calibrate once, idle).
    pub fixed: Option<(u64, i64)>,
    /// Only calibrate: measure the burst alone and return.
    pub calibrate_only: bool,
}

#[derive(Debug, Default)]
pub struct SchedResult {
    /// Iterations of the work loop in one burst.
    pub work_iters: u64,
    /// Fastest burst measured alone (ns): the reference for the extra time.
    pub alone_ns: i64,
    /// All bursts measured alone (ns).
    pub alone_samples: Vec<i64>,
    /// Per cycle: wake-up delay past the deadline (ns).
    pub wake_delay_ns: Vec<i64>,
    /// Per cycle: burst wall time minus `alone_ns` (ns).
    pub extra_ns: Vec<i64>,
    /// Iterations the busy threads completed, each.
    pub busy_ops: Vec<u64>,
    pub elapsed_ns: u64,
    pub interrupted: bool,
}

/// The computation: adding integers, as in Paul et al. 2003's scheduler benchmark.
#[inline(never)]
fn work(iters: u64) -> u64 {
    let mut a = 0u64;
    for i in 0..iters {
        a = black_box(a.wrapping_add(i));
    }
    a
}

pub struct SchedEntities {
    pub wakeup: &'static Entity,
    pub burst: &'static Entity,
}

pub fn entities() -> SchedEntities {
    SchedEntities {
        wakeup: register("sched", "wakeup", Kind::Interval, "from the sleeping thread's deadline to when it ran (tag: cycle)", None).expect("built-in entity"),
        burst: register("sched", "burst", Kind::Interval, "one burst of the alternating thread's work, wall time (tag: cycle)", None).expect("built-in entity"),
    }
}

/// Calibrate the burst and measure it alone: (iterations, samples).
fn calibrate(work_ns: u64) -> (u64, Vec<i64>) {
    let mut iters = 10_000u64;
    // Grow until one timing is long enough to scale from.
    loop {
        let t = mono_ns();
        black_box(work(iters));
        let d = mono_ns() - t;
        if d > 200_000 || iters > 1 << 34 {
            iters = ((iters as f64) * work_ns as f64 / d.max(1) as f64).max(1.0) as u64;
            break;
        }
        iters *= 4;
    }
    let samples = (0..21)
        .map(|_| {
            let t = mono_ns();
            black_box(work(iters));
            mono_ns() - t
        })
        .collect();
    (iters, samples)
}

pub fn run(cfg: &SchedConfig, stop: Arc<AtomicBool>) -> SchedResult {
    let ents = entities();
    loopscope_trace::prepare_thread();
    if let Some(&c) = cfg.cpus.first() {
        pin(c);
    }
    let mut res = match cfg.fixed {
        Some((iters, alone_ns)) => SchedResult { work_iters: iters, alone_ns, ..Default::default() },
        None => {
            let (iters, alone) = calibrate(cfg.work_ns);
            SchedResult { work_iters: iters, alone_ns: *alone.iter().min().unwrap_or(&0), alone_samples: alone, ..Default::default() }
        }
    };
    if cfg.calibrate_only {
        return res;
    }
    let iters = res.work_iters;
    let done = Arc::new(AtomicBool::new(false));
    let counters: Vec<Arc<AtomicU64>> = (0..cfg.busy_threads).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let busy: Vec<_> = counters
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (done, c) = (done.clone(), c.clone());
            let cpu = if cfg.cpus.is_empty() { None } else { Some(cfg.cpus[(i + 1) % cfg.cpus.len()]) };
            std::thread::Builder::new()
                .name(format!("ls-sched-busy{i}"))
                .spawn(move || {
                    if let Some(c) = cpu {
                        pin(c);
                    }
                    let mut a = 0u64;
                    let mut n = 0u64;
                    while !done.load(Ordering::Relaxed) {
                        for i in 0..4096u64 {
                            a = black_box(a.wrapping_add(i));
                        }
                        n += 4096;
                    }
                    c.store(n, Ordering::Relaxed);
                })
                .expect("spawn busy thread")
        })
        .collect();
    // Let the busy threads get going.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let t0 = mono_ns();
    let end = t0 + cfg.duration_ns as i64;
    let expected = (cfg.duration_ns / (cfg.sleep_ns + cfg.work_ns).max(1)) as usize + 2;
    res.wake_delay_ns.reserve(expected);
    res.extra_ns.reserve(expected);
    let mut cycle = 0u32;
    while mono_ns() < end && !stop.load(Ordering::Relaxed) {
        let deadline = mono_ns() + cfg.sleep_ns as i64;
        sleep_until(deadline);
        let woke = mono_ns();
        black_box(work(iters));
        let done_at = mono_ns();
        res.wake_delay_ns.push(woke - deadline);
        res.extra_ns.push(done_at - woke - res.alone_ns);
        ents.wakeup.interval_mono(cycle, deadline as u64, (woke - deadline).max(0) as u64);
        ents.burst.interval_mono(cycle, woke as u64, (done_at - woke).max(0) as u64);
        cycle = cycle.wrapping_add(1);
    }
    res.elapsed_ns = (mono_ns() - t0) as u64;
    res.interrupted = stop.load(Ordering::Relaxed);
    done.store(true, Ordering::Relaxed);
    for h in busy {
        let _ = h.join();
    }
    res.busy_ops = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_measures_every_cycle_and_the_busy_threads_work() {
        let cfg =
            SchedConfig { busy_threads: 2, sleep_ns: 500_000, work_ns: 500_000, duration_ns: 200_000_000, cpus: vec![], fixed: None, calibrate_only: false };
        let r = run(&cfg, Arc::new(AtomicBool::new(false)));
        assert!(r.work_iters > 0 && r.alone_ns > 0);
        assert!(r.wake_delay_ns.len() > 20, "{}", r.wake_delay_ns.len());
        assert_eq!(r.wake_delay_ns.len(), r.extra_ns.len());
        assert!(r.busy_ops.iter().all(|&n| n > 0));
        assert!(r.wake_delay_ns.iter().all(|&d| d >= 0));
    }

    #[test]
    fn a_fixed_burst_skips_calibration_and_calibration_alone_runs_nothing_else() {
        let base =
            SchedConfig { busy_threads: 1, sleep_ns: 200_000, work_ns: 200_000, duration_ns: 50_000_000, cpus: vec![], fixed: None, calibrate_only: true };
        let c = run(&base, Arc::new(AtomicBool::new(false)));
        assert!(c.work_iters > 0 && c.wake_delay_ns.is_empty() && c.busy_ops.is_empty());
        let r = run(&SchedConfig { fixed: Some((c.work_iters, c.alone_ns)), calibrate_only: false, ..base }, Arc::new(AtomicBool::new(false)));
        assert_eq!((r.work_iters, r.alone_ns), (c.work_iters, c.alone_ns));
        assert!(r.alone_samples.is_empty() && !r.extra_ns.is_empty());
    }
}
