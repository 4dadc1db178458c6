//! Fixed-memory histograms with explicit underflow and overflow counts.
//!
//! Two bucket layouts. `Log` is HDR-style log-linear: values below 2^b get a
//! bucket each, above that every power-of-two range is split into 2^(b-1)
//! equal buckets, so a bucket's width is at most 1/2^(b-1) of its lower
//! bound (b = 7: 1.6 %). `Linear` has n equal buckets over [lo, hi). The
//! bucket array is allocated once at registration and never grows; values
//! outside the range are counted as underflow or overflow, never clamped into
//! the edge buckets. Adds are relaxed atomic increments, so any thread may add
//! without a lock; a log takes a snapshot that may be torn across buckets by
//! concurrent adds (each bucket is exact, the set is not a point-in-time cut).

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Largest number of buckets a histogram may have (its log record must fit a block).
pub const MAX_BUCKETS: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scale", rename_all = "lowercase")]
pub enum Scale {
    /// Log-linear over [0, max]; `sub_bits` sets the precision.
    Log { sub_bits: u32, max: u64 },
    /// `n` equal buckets over [lo, hi).
    Linear { lo: i64, hi: i64, n: u32 },
}

impl Scale {
    /// Check the layout; the error says which parameter is wrong.
    pub fn validate(&self) -> Result<(), crate::Error> {
        match *self {
            Scale::Log { sub_bits, max } => {
                if !(1..=12).contains(&sub_bits) {
                    return Err(crate::Error::input(format!("sub_bits must be 1..12 [got {sub_bits}]")));
                }
                if max == 0 || max > i64::MAX as u64 {
                    return Err(crate::Error::input(format!("max must be 1..2^63-1 [got {max}]")));
                }
            }
            Scale::Linear { lo, hi, n } => {
                if hi <= lo {
                    return Err(crate::Error::input(format!("hi must be greater than lo [got lo={lo}, hi={hi}]")));
                }
                if n == 0 {
                    return Err(crate::Error::input("n must be at least 1 [got 0]".into()));
                }
            }
        }
        let nb = self.buckets();
        if nb > MAX_BUCKETS {
            return Err(crate::Error::input(format!("layout needs {nb} buckets, at most {MAX_BUCKETS} are allowed; lower sub_bits or max")));
        }
        Ok(())
    }

    /// Number of buckets of this layout.
    pub fn buckets(&self) -> u64 {
        match *self {
            Scale::Log { sub_bits, max } => log_index(max, sub_bits) + 1,
            Scale::Linear { n, .. } => n as u64,
        }
    }

    /// Bucket of `v`, or Err(false) for underflow, Err(true) for overflow.
    #[inline]
    pub fn index(&self, v: i64) -> Result<u64, bool> {
        match *self {
            Scale::Log { sub_bits, max } => {
                if v < 0 {
                    Err(false)
                } else if v as u64 > max {
                    Err(true)
                } else {
                    Ok(log_index(v as u64, sub_bits))
                }
            }
            Scale::Linear { lo, hi, n } => {
                if v < lo {
                    Err(false)
                } else if v >= hi {
                    Err(true)
                } else {
                    let w = (hi as i128 - lo as i128) as u128;
                    Ok(((v as i128 - lo as i128) as u128 * n as u128 / w) as u64)
                }
            }
        }
    }

    /// Inclusive lower and exclusive upper bound of bucket `i`.
    pub fn bounds(&self, i: u64) -> (i64, i64) {
        match *self {
            Scale::Log { sub_bits, .. } => {
                let (lo, hi) = log_bounds(i, sub_bits);
                (lo as i64, hi.min(i64::MAX as u64) as i64)
            }
            Scale::Linear { lo, hi, n } => {
                let w = hi as i128 - lo as i128;
                let a = lo as i128 + w * i as i128 / n as i128;
                let b = lo as i128 + w * (i as i128 + 1) / n as i128;
                (a as i64, b as i64)
            }
        }
    }
}

#[inline]
fn log_index(v: u64, b: u32) -> u64 {
    let small = 1u64 << b;
    if v < small {
        return v;
    }
    let e = 63 - v.leading_zeros(); // 2^e <= v < 2^(e+1), e >= b
    let shift = e - b + 1;
    let half = 1u64 << (b - 1);
    small + (e - b) as u64 * half + ((v >> shift) - half)
}

fn log_bounds(i: u64, b: u32) -> (u64, u64) {
    let small = 1u64 << b;
    if i < small {
        return (i, i + 1);
    }
    let half = 1u64 << (b - 1);
    let k = i - small;
    let g = k / half;
    let m = k % half + half;
    let shift = g + 1;
    let lo = m.checked_shl(shift as u32).unwrap_or(u64::MAX);
    let hi = (m + 1).checked_shl(shift as u32).unwrap_or(u64::MAX);
    (lo, hi)
}

/// A histogram's live state.
pub struct Histogram {
    pub scale: Scale,
    buckets: Box<[AtomicU64]>,
    under: AtomicU64,
    over: AtomicU64,
    sum: AtomicI64,
    min: AtomicI64,
    max: AtomicI64,
}

/// A copy of a histogram's counts at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub under: u64,
    pub over: u64,
    pub sum: i64,
    pub min: i64,
    pub max: i64,
    /// Non-empty buckets only: (index, count).
    pub buckets: Vec<(u32, u64)>,
}

impl Snapshot {
    pub fn count(&self) -> u64 {
        self.under + self.over + self.buckets.iter().map(|b| b.1).sum::<u64>()
    }
}

impl Histogram {
    pub fn new(scale: Scale) -> Result<Histogram, crate::Error> {
        scale.validate()?;
        let n = scale.buckets() as usize;
        let buckets = (0..n).map(|_| AtomicU64::new(0)).collect::<Vec<_>>().into_boxed_slice();
        Ok(Histogram {
            scale,
            buckets,
            under: AtomicU64::new(0),
            over: AtomicU64::new(0),
            sum: AtomicI64::new(0),
            min: AtomicI64::new(i64::MAX),
            max: AtomicI64::new(i64::MIN),
        })
    }

    #[inline]
    pub fn add(&self, v: i64) {
        match self.scale.index(v) {
            Ok(i) => {
                self.buckets[i as usize].fetch_add(1, Relaxed);
            }
            Err(false) => {
                self.under.fetch_add(1, Relaxed);
            }
            Err(true) => {
                self.over.fetch_add(1, Relaxed);
            }
        }
        self.sum.fetch_add(v, Relaxed);
        if v < self.min.load(Relaxed) {
            self.min.fetch_min(v, Relaxed);
        }
        if v > self.max.load(Relaxed) {
            self.max.fetch_max(v, Relaxed);
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut buckets = Vec::new();
        for (i, b) in self.buckets.iter().enumerate() {
            let c = b.load(Relaxed);
            if c != 0 {
                buckets.push((i as u32, c));
            }
        }
        Snapshot {
            under: self.under.load(Relaxed),
            over: self.over.load(Relaxed),
            sum: self.sum.load(Relaxed),
            min: self.min.load(Relaxed),
            max: self.max.load(Relaxed),
            buckets,
        }
    }

    pub fn reset(&self) {
        for b in self.buckets.iter() {
            b.store(0, Relaxed);
        }
        self.under.store(0, Relaxed);
        self.over.store(0, Relaxed);
        self.sum.store(0, Relaxed);
        self.min.store(i64::MAX, Relaxed);
        self.max.store(i64::MIN, Relaxed);
    }
}

/// A histogram owned by one thread: the same layout and snapshot as
/// [`Histogram`] with plain counters, for per-item hot loops (a packet
/// receiver adds four values per packet; atomic adds would cost more than
/// the rest of its work).
pub struct LocalHistogram {
    pub scale: Scale,
    buckets: Box<[u64]>,
    under: u64,
    over: u64,
    sum: i64,
    min: i64,
    max: i64,
}

impl LocalHistogram {
    pub fn new(scale: Scale) -> Result<LocalHistogram, crate::Error> {
        scale.validate()?;
        Ok(LocalHistogram { scale, buckets: vec![0; scale.buckets() as usize].into_boxed_slice(), under: 0, over: 0, sum: 0, min: i64::MAX, max: i64::MIN })
    }

    #[inline]
    pub fn add(&mut self, v: i64) {
        match self.scale.index(v) {
            Ok(i) => self.buckets[i as usize] += 1,
            Err(false) => self.under += 1,
            Err(true) => self.over += 1,
        }
        self.sum = self.sum.wrapping_add(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            under: self.under,
            over: self.over,
            sum: self.sum,
            min: self.min,
            max: self.max,
            buckets: self.buckets.iter().enumerate().filter(|(_, &c)| c != 0).map(|(i, &c)| (i as u32, c)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_buckets_are_contiguous_and_contain_their_values() {
        let s = Scale::Log { sub_bits: 5, max: 1 << 30 };
        let mut prev_hi = 0i64;
        for i in 0..s.buckets() {
            let (lo, hi) = s.bounds(i);
            assert_eq!(lo, prev_hi, "bucket {i}");
            assert!(hi > lo);
            assert_eq!(s.index(lo), Ok(i));
            // The last bucket may reach past max; values above max overflow.
            assert_eq!(s.index((hi - 1).min(1 << 30)), Ok(i));
            prev_hi = hi;
        }
    }

    #[test]
    fn log_bucket_width_stays_within_the_stated_precision() {
        let s = Scale::Log { sub_bits: 7, max: 1 << 40 };
        for v in [129i64, 1000, 65_537, 1 << 33, (1 << 40) - 1] {
            let (lo, hi) = s.bounds(s.index(v).unwrap());
            assert!((hi - lo) as f64 / lo as f64 <= 1.0 / 64.0 + 1e-12, "v={v}");
        }
    }

    #[test]
    fn out_of_range_values_are_counted_not_clamped() {
        let h = Histogram::new(Scale::Linear { lo: 10, hi: 20, n: 5 }).unwrap();
        for v in [5, 10, 19, 20, 100] {
            h.add(v);
        }
        let s = h.snapshot();
        assert_eq!((s.under, s.over), (1, 2));
        assert_eq!(s.buckets, vec![(0, 1), (4, 1)]);
        assert_eq!((s.min, s.max, s.count()), (5, 100, 5));
    }

    #[test]
    fn oversized_layouts_are_refused_with_a_reason() {
        let e = Histogram::new(Scale::Log { sub_bits: 12, max: 1 << 60 }).err().unwrap();
        assert!(e.is_input() && e.to_string().contains("buckets"), "{e}");
        assert!(Scale::Linear { lo: 5, hi: 5, n: 3 }.validate().is_err());
    }

    #[test]
    fn a_local_histogram_counts_like_the_shared_one() {
        let scale = Scale::Log { sub_bits: 5, max: 10_000 };
        let (shared, mut local) = (Histogram::new(scale).unwrap(), LocalHistogram::new(scale).unwrap());
        for v in [-3i64, 0, 7, 31, 32, 999, 10_000, 10_001, 50] {
            shared.add(v);
            local.add(v);
        }
        assert_eq!(shared.snapshot(), local.snapshot());
    }

    #[test]
    fn reset_empties_every_count() {
        let h = Histogram::new(Scale::Log { sub_bits: 4, max: 1000 }).unwrap();
        h.add(3);
        h.add(5000);
        h.reset();
        assert_eq!(h.snapshot().count(), 0);
    }
}
