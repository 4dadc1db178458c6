//! When each packet leaves: departure offsets from the start of a run.
//!
//! A schedule is a deterministic sequence of offsets (ns since the start),
//! so a sender that waits for each absolute deadline cannot drift, and a
//! test can check every offset exactly. `cbr` spaces packets `1e9/pps` ns
//! apart computed from the packet index (k × 1e9 / pps in integer
//! arithmetic, no accumulated rounding); `poisson` draws exponential gaps
//! from a seeded generator; `onoff` sends CBR bursts at the given rate for
//! `on` then pauses for `off`; `replay` reads the offsets from a file.

use crate::error::{ProbeError, Result};
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub enum Pattern {
    Cbr,
    Poisson { seed: u64 },
    OnOff { on_ns: u64, off_ns: u64 },
    Replay { offsets: Vec<u64> },
}

/// A source of departure offsets.
pub struct Schedule {
    pattern: Pattern,
    /// Packets per second, as a rational pps_num / pps_den (exact for bit rates).
    pps_num: u128,
    pps_den: u128,
    k: u64,
    t: u64,
    rng: u64,
    limit: Option<u64>,
    end_ns: Option<u64>,
}

impl Schedule {
    /// `pps` given as num/den packets per second; `count` and/or `end_ns` bound it.
    pub fn new(pattern: Pattern, pps_num: u128, pps_den: u128, count: Option<u64>, end_ns: Option<u64>) -> Schedule {
        let rng = match pattern {
            Pattern::Poisson { seed } => seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            _ => 1,
        };
        let limit = match &pattern {
            Pattern::Replay { offsets } => Some(count.map_or(offsets.len() as u64, |c| c.min(offsets.len() as u64))),
            _ => count,
        };
        Schedule { pattern, pps_num, pps_den: pps_den.max(1), k: 0, t: 0, rng, limit, end_ns }
    }

    /// Mean gap in ns (for choosing between sleeping and spinning).
    pub fn mean_gap_ns(&self) -> f64 {
        1e9 * self.pps_den as f64 / self.pps_num.max(1) as f64
    }

    fn cbr(&self, k: u64) -> u64 {
        (k as u128 * 1_000_000_000u128 * self.pps_den / self.pps_num.max(1)) as u64
    }

    fn uniform(&mut self) -> f64 {
        // xorshift64*, top 53 bits as a double in (0, 1].
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        ((x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

impl Iterator for Schedule {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.limit.is_some_and(|l| self.k >= l) {
            return None;
        }
        let off = match &self.pattern {
            Pattern::Cbr => self.cbr(self.k),
            Pattern::Poisson { .. } => {
                if self.k > 0 {
                    let u = self.uniform();
                    self.t += (-u.ln() * self.mean_gap_ns()).round() as u64;
                }
                self.t
            }
            Pattern::OnOff { on_ns, off_ns } => {
                // Packets that fit in one on-period at this rate.
                let per_burst = ((*on_ns as u128 * self.pps_num) / (self.pps_den * 1_000_000_000)).max(1) as u64;
                let burst = self.k / per_burst;
                let i = self.k % per_burst;
                burst * (on_ns + off_ns) + self.cbr(i)
            }
            Pattern::Replay { offsets } => offsets[self.k as usize],
        };
        if self.end_ns.is_some_and(|e| off >= e) {
            return None;
        }
        self.k += 1;
        Some(off)
    }
}

/// Parse a replay file: one offset per line (ns, or with a unit: 10us, 1.5ms),
/// `#` comments; offsets must not decrease.
pub fn read_replay(path: &Path) -> Result<Vec<u64>> {
    let text = std::fs::read_to_string(path).map_err(|e| ProbeError::Input(format!("{}: cannot read the replay file: {e}", path.display())))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.split('#').next().unwrap_or("").trim();
        if l.is_empty() {
            continue;
        }
        let v = parse_offset(l)
            .ok_or_else(|| ProbeError::Input(format!("{}:{}: {l:?} is not an offset (write ns, or a number with ns/us/ms/s)", path.display(), i + 1)))?;
        if out.last().is_some_and(|&p| v < p) {
            return Err(ProbeError::Input(format!("{}:{}: offsets must not decrease ({v} ns after {} ns)", path.display(), i + 1, out.last().unwrap())));
        }
        out.push(v);
    }
    if out.is_empty() {
        return Err(ProbeError::Input(format!("{}: the replay file holds no offsets", path.display())));
    }
    Ok(out)
}

fn parse_offset(s: &str) -> Option<u64> {
    let (num, mult) =
        [("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)].iter().find_map(|(u, m)| s.strip_suffix(u).map(|n| (n.trim(), *m))).unwrap_or((s, 1.0));
    let v: f64 = num.parse().ok()?;
    if !(v >= 0.0) || !v.is_finite() {
        return None;
    }
    Some((v * mult).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cbr_offsets_are_exact_multiples_without_drift() {
        // 1400-byte packets at 1 Gbit/s: 89285.714... pps, i.e. 11200 ns apart.
        let pps_num = 1_000_000_000u128;
        let pps_den = 1400 * 8;
        let s: Vec<u64> = Schedule::new(Pattern::Cbr, pps_num, pps_den, Some(4), None).collect();
        assert_eq!(s, vec![0, 11_200, 22_400, 33_600]);
        // 3 pps: offsets are floor(k * 1e9 / 3), never accumulating error.
        let s: Vec<u64> = Schedule::new(Pattern::Cbr, 3, 1, Some(4), None).collect();
        assert_eq!(s, vec![0, 333_333_333, 666_666_666, 1_000_000_000]);
        let big = Schedule::new(Pattern::Cbr, 3, 1, None, None).nth(3_000_000).unwrap();
        assert_eq!(big, 1_000_000_000_000_000);
    }

    #[test]
    fn a_duration_ends_the_schedule() {
        assert_eq!(Schedule::new(Pattern::Cbr, 1000, 1, None, Some(10_000_000)).count(), 10);
    }

    #[test]
    fn poisson_is_reproducible_from_its_seed_and_has_the_right_mean() {
        let a: Vec<u64> = Schedule::new(Pattern::Poisson { seed: 42 }, 1000, 1, Some(20_000), None).collect();
        let b: Vec<u64> = Schedule::new(Pattern::Poisson { seed: 42 }, 1000, 1, Some(20_000), None).collect();
        assert_eq!(a, b);
        assert_eq!(&a[..3], &Schedule::new(Pattern::Poisson { seed: 42 }, 1000, 1, Some(3), None).collect::<Vec<_>>()[..]);
        let mean = *a.last().unwrap() as f64 / (a.len() - 1) as f64;
        assert!((mean - 1e6).abs() < 3e4, "{mean}");
        assert!(a.windows(2).all(|w| w[1] >= w[0]));
        assert_ne!(a, Schedule::new(Pattern::Poisson { seed: 43 }, 1000, 1, Some(20_000), None).collect::<Vec<_>>());
    }

    #[test]
    fn on_off_sends_bursts_then_pauses() {
        // 10 kpps in 1 ms bursts with 4 ms pauses: 10 packets per burst.
        let s: Vec<u64> = Schedule::new(Pattern::OnOff { on_ns: 1_000_000, off_ns: 4_000_000 }, 10_000, 1, Some(12), None).collect();
        assert_eq!(&s[..10], &(0..10).map(|i| i * 100_000).collect::<Vec<_>>()[..]);
        assert_eq!(s[10], 5_000_000);
        assert_eq!(s[11], 5_100_000);
    }

    #[test]
    fn replay_reads_offsets_with_units_and_refuses_bad_lines() {
        let d = std::env::temp_dir().join(format!("ls-replay-{}", std::process::id()));
        std::fs::write(&d, "# offsets\n0\n10us\n1.5ms\n2000000 # ns\n").unwrap();
        let o = read_replay(&d).unwrap();
        assert_eq!(o, vec![0, 10_000, 1_500_000, 2_000_000]);
        assert_eq!(Schedule::new(Pattern::Replay { offsets: o }, 1, 1, None, None).collect::<Vec<_>>().len(), 4);
        std::fs::write(&d, "0\n5ms\n1ms\n").unwrap();
        assert!(read_replay(&d).unwrap_err().to_string().contains(":3: offsets must not decrease"));
        std::fs::write(&d, "0\nsoon\n").unwrap();
        assert!(read_replay(&d).unwrap_err().to_string().contains(":2:"));
        std::fs::remove_file(&d).unwrap();
    }
}
