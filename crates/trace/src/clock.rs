//! Timestamps for the hot path, and their calibration against CLOCK_MONOTONIC.
//!
//! A record's timestamp is whatever is cheapest to read that still maps onto
//! CLOCK_MONOTONIC afterwards: the TSC when the CPU says it is invariant (it
//! ticks at a constant rate in every P- and C-state and the kernel itself uses
//! it as clocksource), CLOCK_MONOTONIC in nanoseconds otherwise. The choice is
//! made once per process and written into the trace's info chunk.
//!
//! Readers convert TSC ticks with the calibration pairs the writer logs through
//! the run: each pair is a TSC value and the CLOCK_MONOTONIC value read between
//! two TSC reads, keeping the narrowest of several tries, so the pair carries
//! its own uncertainty (half the window). CLOCK_MONOTONIC is slewed by NTP while
//! the TSC is not, so readers interpolate piecewise between pairs instead of
//! fitting one line. Each pair also relates CLOCK_MONOTONIC to CLOCK_REALTIME,
//! which later stages need because kernel packet timestamps are REALTIME.

use std::sync::atomic::{AtomicU8, Ordering};

/// How the raw timestamps of this process are to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockKind {
    /// Raw values are TSC ticks; the trace carries calibration pairs.
    Tsc,
    /// Raw values are CLOCK_MONOTONIC nanoseconds.
    Mono,
}

impl ClockKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ClockKind::Tsc => "tsc",
            ClockKind::Mono => "mono",
        }
    }
}

const UNSET: u8 = 0;
const TSC: u8 = 1;
const MONO: u8 = 2;
static MODE: AtomicU8 = AtomicU8::new(UNSET);

/// The raw timestamp of now: a TSC read, or CLOCK_MONOTONIC in ns.
#[inline(always)]
pub fn now_raw() -> u64 {
    if MODE.load(Ordering::Relaxed) == TSC {
        rdtsc()
    } else {
        now_raw_slow()
    }
}

#[cold]
#[inline(never)]
fn now_raw_slow() -> u64 {
    match kind() {
        ClockKind::Tsc => rdtsc(),
        ClockKind::Mono => mono_ns(),
    }
}

/// The clock this process uses, deciding it on first call.
pub fn kind() -> ClockKind {
    match MODE.load(Ordering::Relaxed) {
        TSC => ClockKind::Tsc,
        MONO => ClockKind::Mono,
        _ => {
            let k = detect();
            let v = if k == ClockKind::Tsc { TSC } else { MONO };
            // First caller wins; every later caller sees the same choice.
            match MODE.compare_exchange(UNSET, v, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => k,
                Err(TSC) => ClockKind::Tsc,
                Err(_) => ClockKind::Mono,
            }
        }
    }
}

/// Why the clock was chosen, for provenance.
pub fn reason() -> String {
    if let Ok(v) = std::env::var("LOOPSCOPE_CLOCK") {
        return format!("LOOPSCOPE_CLOCK={v}");
    }
    let inv = tsc_invariant();
    let cs = kernel_clocksource().unwrap_or_else(|| "unknown".into());
    format!("cpuid invariant TSC: {inv}; kernel clocksource: {cs}")
}

fn detect() -> ClockKind {
    match std::env::var("LOOPSCOPE_CLOCK").as_deref() {
        Ok("mono") => return ClockKind::Mono,
        Ok("tsc") if cfg!(target_arch = "x86_64") => return ClockKind::Tsc,
        _ => {}
    }
    if !tsc_invariant() {
        return ClockKind::Mono;
    }
    // The kernel demotes the TSC when it finds it unstable (e.g. across
    // sockets or after a VM migration); follow its judgement when we can read it.
    match kernel_clocksource() {
        Some(cs) if cs != "tsc" => ClockKind::Mono,
        _ => ClockKind::Tsc,
    }
}

fn kernel_clocksource() -> Option<String> {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource").ok().map(|s| s.trim().to_string())
}

#[cfg(target_arch = "x86_64")]
pub fn tsc_invariant() -> bool {
    // CPUID.80000007H:EDX[8] is "invariant TSC".
    #[allow(unused_unsafe)]
    let (max_ext, edx) = unsafe { (core::arch::x86_64::__cpuid(0x8000_0000).eax, core::arch::x86_64::__cpuid(0x8000_0007).edx) };
    max_ext >= 0x8000_0007 && edx & (1 << 8) != 0
}

#[cfg(not(target_arch = "x86_64"))]
pub fn tsc_invariant() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn rdtsc() -> u64 {
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn rdtsc() -> u64 {
    mono_ns()
}

/// CLOCK_MONOTONIC in nanoseconds (as skewed by a virtual clock, if set).
#[inline]
pub fn mono_ns() -> u64 {
    crate::vclock::mono(loopscope_os::mono_ns()) as u64
}

/// CLOCK_REALTIME in nanoseconds since the epoch (as skewed by a virtual clock, if set).
#[inline]
pub fn realtime_ns() -> u64 {
    crate::vclock::real(loopscope_os::realtime_ns()) as u64
}

/// One calibration pair: a raw timestamp and the CLOCK_MONOTONIC and
/// CLOCK_REALTIME values read at (about) the same instant, with the half-width
/// of the windows the reads were bracketed by.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct CalPair {
    pub raw: u64,
    pub mono_ns: u64,
    /// Half of the raw-clock window around the CLOCK_MONOTONIC read, in raw units.
    pub raw_err: u64,
    pub realtime_ns: u64,
    /// Half of the CLOCK_MONOTONIC window around the CLOCK_REALTIME read, in ns.
    pub realtime_err_ns: u64,
}

/// Take a calibration pair, keeping the narrowest window out of `tries`.
pub fn calibration_pair(tries: usize) -> CalPair {
    let k = kind();
    let mut best = (u64::MAX, 0u64, 0u64);
    for _ in 0..tries.max(1) {
        let (a, m, b) = match k {
            ClockKind::Tsc => {
                let a = rdtsc();
                let m = mono_ns();
                let b = rdtsc();
                (a, m, b)
            }
            ClockKind::Mono => {
                let m = mono_ns();
                (m, m, m)
            }
        };
        let w = b.wrapping_sub(a);
        if w < best.0 {
            best = (w, a + w / 2, m);
        }
    }
    let mut rbest = (u64::MAX, 0u64, 0u64);
    for _ in 0..tries.max(1) {
        let a = mono_ns();
        let r = realtime_ns();
        let b = mono_ns();
        let w = b - a;
        if w < rbest.0 {
            rbest = (w, a + w / 2, r);
        }
    }
    // Express the REALTIME read at the same MONOTONIC instant as the TSC pair.
    let realtime = (rbest.2 as i128 + best.2 as i128 - rbest.1 as i128) as u64;
    CalPair { raw: best.1, mono_ns: best.2, raw_err: best.0.div_ceil(2), realtime_ns: realtime, realtime_err_ns: rbest.0.div_ceil(2) }
}

/// Estimate of raw ticks per second from two pairs (1e9 for the mono clock).
pub fn rate_hz(a: &CalPair, b: &CalPair) -> f64 {
    let dm = b.mono_ns as f64 - a.mono_ns as f64;
    if dm <= 0.0 {
        return 0.0;
    }
    (b.raw as f64 - a.raw as f64) / dm * 1e9
}

/// Maps raw timestamps to CLOCK_MONOTONIC ns from a set of calibration pairs:
/// piecewise-linear between pairs, the end-to-end slope beyond them. Slopes
/// are kept in 32.32 fixed point so a conversion is two multiplies and no
/// floating-point rounding call (this runs once per record when reading).
#[derive(Clone, Debug)]
pub struct RawToMono {
    kind: ClockKind,
    /// (raw, mono, slope of the segment starting here in ns per raw tick, Q32).
    pairs: Vec<(u64, u64, u64)>,
    /// ns per raw tick outside the covered span and for durations, Q32.
    slope_q32: u64,
}

fn q32(num: f64) -> u64 {
    (num * 4294967296.0).round().max(0.0) as u64
}

impl RawToMono {
    pub fn new(kind: ClockKind, pairs: &[CalPair], nominal_hz: f64) -> Self {
        let mut p: Vec<(u64, u64)> = pairs.iter().map(|c| (c.raw, c.mono_ns)).collect();
        p.sort_unstable();
        p.dedup_by_key(|x| x.0);
        // A pair whose mono value goes backwards (it cannot, but a damaged
        // file is not to be trusted) would make time run backwards: drop it.
        let mut clean: Vec<(u64, u64)> = Vec::with_capacity(p.len());
        for x in p {
            if clean.last().is_none_or(|l| x.1 >= l.1) {
                clean.push(x);
            }
        }
        let nominal = 1e9 / nominal_hz.max(1.0);
        let slope = if kind == ClockKind::Mono {
            1.0
        } else if clean.len() >= 2 {
            let (a, b) = (clean[0], clean[clean.len() - 1]);
            let s = (b.1 as f64 - a.1 as f64) / (b.0 as f64 - a.0 as f64);
            if s.is_finite() && s > 0.0 {
                s
            } else {
                nominal
            }
        } else {
            nominal
        };
        let slope_q32 = q32(slope);
        let mut pairs = Vec::with_capacity(clean.len());
        for i in 0..clean.len() {
            let seg = if i + 1 < clean.len() {
                let (r0, m0) = clean[i];
                let (r1, m1) = clean[i + 1];
                q32((m1 - m0) as f64 / (r1 - r0) as f64)
            } else {
                slope_q32
            };
            pairs.push((clean[i].0, clean[i].1, seg));
        }
        RawToMono { kind, pairs, slope_q32 }
    }

    /// ns per raw unit, for converting durations.
    pub fn ns_per_raw(&self) -> f64 {
        self.slope_q32 as f64 / 4294967296.0
    }

    pub fn is_identity(&self) -> bool {
        self.kind == ClockKind::Mono
    }

    #[inline(always)]
    fn scale(d: u64, q: u64) -> i64 {
        ((d as u128 * q as u128 + (1u128 << 31)) >> 32) as i64
    }

    /// Convert one raw timestamp; `hint` caches the segment between calls so
    /// that a sorted run of timestamps costs O(1) each.
    #[inline]
    pub fn convert(&self, raw: u64, hint: &mut usize) -> i64 {
        if self.kind == ClockKind::Mono {
            return raw as i64;
        }
        let p = &self.pairs;
        if p.is_empty() {
            return Self::scale(raw, self.slope_q32);
        }
        if raw < p[0].0 {
            let (r0, m0, _) = p[0];
            return m0 as i64 - Self::scale(r0 - raw, self.slope_q32);
        }
        let last = p.len() - 1;
        let mut i = (*hint).min(last);
        let fits = |i: usize| p[i].0 <= raw && (i == last || raw < p[i + 1].0);
        if !fits(i) {
            i = match p.binary_search_by(|x| x.0.cmp(&raw)) {
                Ok(j) => j,
                Err(j) => j - 1,
            };
            *hint = i;
        }
        let (r0, m0, q) = p[i];
        m0 as i64 + Self::scale(raw - r0, q)
    }

    /// Convert a duration in raw units to ns.
    #[inline]
    pub fn duration(&self, raw: u64) -> i64 {
        if self.kind == ClockKind::Mono {
            raw as i64
        } else {
            Self::scale(raw, self.slope_q32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_pairs_bracket_the_monotonic_read_tightly() {
        let p = calibration_pair(20);
        assert!(p.mono_ns > 0);
        // A window of 1 ms would mean the pair is useless; on any machine it is µs at most.
        if kind() == ClockKind::Tsc {
            assert!(p.raw_err < 5_000_000, "window {}", p.raw_err);
        }
    }

    #[test]
    fn conversion_interpolates_between_pairs_and_extrapolates_beyond() {
        let pairs = [
            CalPair { raw: 1000, mono_ns: 500, raw_err: 0, realtime_ns: 0, realtime_err_ns: 0 },
            CalPair { raw: 3000, mono_ns: 1500, raw_err: 0, realtime_ns: 0, realtime_err_ns: 0 },
            CalPair { raw: 5000, mono_ns: 2600, raw_err: 0, realtime_ns: 0, realtime_err_ns: 0 },
        ];
        let m = RawToMono::new(ClockKind::Tsc, &pairs, 2e9);
        let mut h = 0;
        assert_eq!(m.convert(2000, &mut h), 1000);
        assert_eq!(m.convert(4000, &mut h), 2050);
        assert_eq!(m.convert(3000, &mut h), 1500);
        // Beyond the ends: overall slope (2100 ns over 4000 ticks).
        assert_eq!(m.convert(0, &mut h), 500 - 525);
        assert_eq!(m.convert(9000, &mut h), 2600 + 2100);
    }
}
