//! loopscope's event logger.
//!
//! Programs register entities (events, intervals, counters, histograms) under
//! a group/name and log records against them; each record is a few words in
//! the calling thread's own buffer, stamped with the TSC, and a background
//! writer moves the buffers into a chunked, checksummed file that
//! `loopscope.trace.read` turns into a table. The modules, in the order data
//! flows through them:
//!
//! - [`entity`]: names, kinds, which streams log which groups;
//! - [`clock`]: the timestamp source and its calibration to CLOCK_MONOTONIC;
//! - `local` and `buffer`: the per-thread hot path and its rings;
//! - [`session`]: opening and closing a trace, triggers, group switches;
//! - `writer`: the background thread that writes chunks;
//! - [`format`]: the file layout both sides share; [`reader`]: parsing it back.
//!
//! ```no_run
//! use loopscope_trace::{session, config::Config, register, Kind};
//! session::open("app.lstrace".as_ref(), Config::default()).unwrap();
//! let frame = register("app", "frame", Kind::Event, "a frame arrived", None).unwrap();
//! frame.event(42);
//! session::close().unwrap();
//! ```

mod batch;
mod buffer;
pub mod clock;
pub mod config;
pub mod entity;
pub mod format;
pub mod hist;
mod local;
pub mod reader;
pub mod session;
mod shared;
pub mod vclock;
mod writer;

pub use entity::{lookup, register, Entity};
pub use format::Kind;
pub use local::prepare_thread;
pub use writer::count_records;

use format::rec;

/// What went wrong, and whether the caller's input (exit code 2) or the
/// run itself (exit code 1) is to blame.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The caller's input cannot work: a file that is not a trace, a bad
    /// configuration, a histogram layout out of range (exit 2).
    #[error("{0}")]
    Input(String),
    /// Something failed while tracing or reading (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl Error {
    pub fn input(msg: String) -> Error {
        Error::Input(msg)
    }
    pub fn failed(msg: String) -> Error {
        Error::Failed(msg)
    }
    /// Whether the caller's input is at fault (exit 2) rather than the run (exit 1).
    pub fn is_input(&self) -> bool {
        matches!(self, Error::Input(_))
    }
}

/// The raw timestamp of now, for starting an interval.
#[inline(always)]
pub fn now() -> u64 {
    clock::now_raw()
}

impl Entity {
    #[inline(always)]
    fn active(&self, kind: Kind) -> u32 {
        let m = self.mask.load(std::sync::atomic::Ordering::Relaxed);
        if m != 0 && self.kind != kind {
            session::count_refused();
            return 0;
        }
        m
    }

    /// Log an event.
    #[inline(always)]
    pub fn event(&self, tag: u32) {
        let m = self.active(Kind::Event);
        if m == 0 {
            return;
        }
        local::emit2(m, rec::word0(rec::EVENT, self.id, tag), clock::now_raw());
    }

    /// Log an event carrying a number.
    #[inline(always)]
    pub fn event_value(&self, tag: u32, value: i64) {
        let m = self.active(Kind::Event);
        if m == 0 {
            return;
        }
        local::emit3(m, rec::word0(rec::EVENT_VALUE, self.id, tag), clock::now_raw(), value as u64);
    }

    /// Log an event carrying bytes (at most [`rec::MAX_PAYLOAD`]; a larger
    /// payload is refused and counted as a lost record).
    pub fn event_payload(&self, tag: u32, payload: &[u8]) {
        let m = self.active(Kind::Event);
        if m == 0 {
            return;
        }
        if payload.len() > rec::MAX_PAYLOAD {
            session::count_refused();
            return;
        }
        let head = [rec::word0(rec::EVENT_PAYLOAD, self.id, tag), clock::now_raw(), payload.len() as u64];
        local::emit_var(m, &head, payload);
    }

    /// Log an interval that started at raw timestamp `start` (from [`now`]) and ends now.
    #[inline(always)]
    pub fn interval(&self, tag: u32, start: u64) {
        let m = self.active(Kind::Interval);
        if m == 0 {
            return;
        }
        let end = clock::now_raw();
        local::emit3(m, rec::word0(rec::INTERVAL, self.id, tag), start, end.wrapping_sub(start));
    }

    /// Log an interval between two raw timestamps.
    #[inline(always)]
    pub fn interval_raw(&self, tag: u32, start: u64, end: u64) {
        let m = self.active(Kind::Interval);
        if m == 0 {
            return;
        }
        local::emit3(m, rec::word0(rec::INTERVAL, self.id, tag), start, end.saturating_sub(start));
    }

    /// Log an interval given in CLOCK_MONOTONIC nanoseconds (e.g. from a
    /// deadline computed with `clock_gettime`).
    #[inline(always)]
    pub fn interval_mono(&self, tag: u32, start_ns: u64, dur_ns: u64) {
        let m = self.active(Kind::Interval);
        if m == 0 {
            return;
        }
        local::emit3(m, rec::word0(rec::INTERVAL, self.id, tag) | rec::MONO_FLAG as u64, start_ns, dur_ns);
    }

    /// Add to a counter (no record is written).
    #[inline(always)]
    pub fn counter_add(&self, v: i64) {
        if self.active(Kind::Counter) != 0 {
            self.counter.fetch_add(v, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Log a counter's current value.
    pub fn counter_log(&self) {
        let m = self.active(Kind::Counter);
        if m == 0 {
            return;
        }
        let v = self.counter.load(std::sync::atomic::Ordering::Relaxed);
        local::emit3(m, rec::word0(rec::COUNTER, self.id, rec::COUNTER_LOG), clock::now_raw(), v as u64);
    }

    /// Reset a counter to zero, logging the value it had.
    pub fn counter_reset(&self) {
        let v = self.counter.swap(0, std::sync::atomic::Ordering::Relaxed);
        let m = self.active(Kind::Counter);
        if m == 0 {
            return;
        }
        local::emit3(m, rec::word0(rec::COUNTER, self.id, rec::COUNTER_RESET), clock::now_raw(), v as u64);
    }

    /// Add a value to a histogram (no record is written).
    #[inline(always)]
    pub fn histogram_add(&self, v: i64) {
        if self.active(Kind::Histogram) != 0 {
            if let Some(h) = &self.hist {
                h.add(v);
            }
        }
    }

    fn histogram_record(&self, m: u32, tag: u32) {
        let Some(h) = &self.hist else { return };
        let s = h.snapshot();
        let k = s.buckets.len();
        let head = [rec::word0(rec::HISTOGRAM, self.id, tag), clock::now_raw(), k as u64, s.under, s.over, s.sum as u64, s.min as u64, s.max as u64];
        let mut tail = Vec::with_capacity((k * 4).div_ceil(8) * 8 + k * 8);
        for (i, _) in &s.buckets {
            tail.extend_from_slice(&i.to_le_bytes());
        }
        tail.resize((k * 4).div_ceil(8) * 8, 0);
        for (_, c) in &s.buckets {
            tail.extend_from_slice(&c.to_le_bytes());
        }
        local::emit_var(m, &head, &tail);
    }

    /// Log a histogram's buckets.
    pub fn histogram_log(&self) {
        let m = self.active(Kind::Histogram);
        if m != 0 {
            self.histogram_record(m, rec::COUNTER_LOG);
        }
    }

    /// Reset a histogram, logging the counts it had.
    pub fn histogram_reset(&self) {
        let m = self.active(Kind::Histogram);
        if m != 0 {
            self.histogram_record(m, rec::COUNTER_RESET);
        }
        if let Some(h) = &self.hist {
            h.reset();
        }
    }
}
