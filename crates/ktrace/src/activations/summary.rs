//! The activations of chosen threads folded as they close, in memory that
//! does not grow with the capture: per thread, its counts, a histogram of
//! each figure and its worst activations.
//!
//! A figure's histogram is HdrHistogram's (log-linear buckets auto-sized to
//! the largest value seen) at `SIG_DIGITS` significant digits: a quantile
//! read from it is within 10^-SIG_DIGITS of the value's size of the exact
//! one (0.1 %), the maximum is kept exactly. The outliers of a thread are
//! its complete activations whose lateness (from the sleep timer's expiry
//! where the thread slept on one, else from its wake-up) lies in the bucket
//! of the lateness' p99 or above; the `top_k` latest are kept with their
//! windows (from the expiry or the wake-up to the latest the switch-in can
//! have been), for attribution. Memory is a thread's histograms (tens of kB)
//! and its `top_k` windows, whatever the capture's length.

use super::{Row, NULL};
use hdrhistogram::Histogram;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The precision of every figure's quantiles: significant decimal digits.
pub const SIG_DIGITS: u8 = 3;

/// One figure of a thread: its histogram and exact maximum.
pub struct Figure {
    hist: Histogram<u32>,
    max: i64,
}

impl Figure {
    fn new() -> Self {
        // auto-resizing: the buckets cover the largest value seen, never more
        Figure { hist: Histogram::new(SIG_DIGITS).expect("3 significant digits is a valid precision"), max: NULL }
    }

    fn add(&mut self, v: i64) {
        // the figures are durations (never below 0 from a time-ordered capture): a negative one counts as 0
        // `record` grows the buckets to the value (`saturating_record` would clamp it to those there are)
        self.hist.record(v.max(0) as u64).expect("an auto-resizing histogram takes any value below 2^63");
        self.max = self.max.max(v);
    }

    /// How many values were added.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The value at quantile `q` (0–1), never above the exact maximum; `NULL` when empty.
    pub fn quantile(&self, q: f64) -> i64 {
        if self.hist.is_empty() {
            return NULL;
        }
        (self.hist.value_at_quantile(q) as i64).min(self.max)
    }

    pub fn max(&self) -> i64 {
        self.max
    }
}

/// One thread's fold.
pub struct ThreadSum {
    pub tid: i64,
    pub activations: u64,
    pub complete: u64,
    pub preemptions: i64,
    pub migrations: i64,
    pub wakeup_latency: Figure,
    pub timer_lateness: Figure,
    pub runtime: Figure,
    pub period: Figure,
    /// widths of untraced switch-ins (those above 0)
    pub on_bound: Figure,
    /// the lateness outliers are chosen by
    pub late: Figure,
    /// the latest activations: (lateness, window start, window end), a min-heap of at most `top_k`
    worst: BinaryHeap<Reverse<(i64, i64, i64)>>,
}

impl ThreadSum {
    fn new(tid: i64) -> Self {
        ThreadSum {
            tid,
            activations: 0,
            complete: 0,
            preemptions: 0,
            migrations: 0,
            wakeup_latency: Figure::new(),
            timer_lateness: Figure::new(),
            runtime: Figure::new(),
            period: Figure::new(),
            on_bound: Figure::new(),
            late: Figure::new(),
            worst: BinaryHeap::new(),
        }
    }

    /// The outliers: how many there are, and the kept ones (lateness, start,
    /// end), latest first.
    pub fn outliers(&self) -> (u64, Vec<(i64, i64, i64)>) {
        if self.late.hist.is_empty() {
            return (0, Vec::new());
        }
        let h = &self.late.hist;
        let lo = h.lowest_equivalent(h.value_at_quantile(0.99));
        let n = h.count_between(lo, h.highest_equivalent(h.max()));
        let mut kept: Vec<(i64, i64, i64)> = self.worst.iter().map(|r| r.0).filter(|w| w.0.max(0) as u64 >= lo).collect();
        kept.sort_unstable_by(|a, b| b.cmp(a));
        (n.max(kept.len() as u64), kept)
    }
}

/// Every chosen thread's fold, in the order threads first closed an activation.
pub struct Summary {
    window: Option<(i64, i64)>,
    top_k: usize,
    index: rustc_hash::FxHashMap<i64, usize>,
    pub threads: Vec<ThreadSum>,
}

impl Summary {
    /// `window`: only the activations woken (or, with no wake-up, switched
    /// in) inside it, both ends included; `top_k`: the outliers kept per thread.
    pub fn new(window: Option<(i64, i64)>, top_k: usize) -> Self {
        Summary { window, top_k, index: Default::default(), threads: Vec::new() }
    }

    pub(super) fn add(&mut self, r: Row) {
        let at = if r.woken != NULL { r.woken } else { r.on };
        if let Some((lo, hi)) = self.window {
            if at < lo || at > hi {
                return;
            }
        }
        let j = *self.index.entry(r.tid).or_insert_with(|| {
            self.threads.push(ThreadSum::new(r.tid));
            self.threads.len() - 1
        });
        let t = &mut self.threads[j];
        t.activations += 1;
        t.preemptions += r.preemptions;
        t.migrations += r.migrations;
        if !r.complete {
            return;
        }
        t.complete += 1;
        for (f, v) in
            [(&mut t.wakeup_latency, r.wakeup_latency), (&mut t.timer_lateness, r.timer_lateness), (&mut t.runtime, r.runtime), (&mut t.period, r.period)]
        {
            if v != NULL {
                f.add(v);
            }
        }
        if r.on_bound > 0 {
            t.on_bound.add(r.on_bound);
        }
        if r.wakeup_latency == NULL {
            return;
        }
        // a window starts at the timer's expiry when the thread slept on one and it expired before the wake-up
        let timed = r.timer_expires != NULL && r.timer_expires <= r.woken;
        let (late, start) = if timed && r.timer_lateness != NULL { (r.timer_lateness, r.timer_expires) } else { (r.wakeup_latency, r.woken) };
        t.late.add(late);
        let w = (late, start, r.on + r.on_bound.max(0));
        if t.worst.len() < self.top_k {
            t.worst.push(Reverse(w));
        } else if self.top_k > 0 && t.worst.peek().is_some_and(|m| w > m.0) {
            t.worst.pop();
            t.worst.push(Reverse(w));
        }
    }
}
