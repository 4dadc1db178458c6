//! A virtual clock for validating clock synchronization (test only).
//!
//! Hosts that share one kernel share one CLOCK_REALTIME, so the kernel
//! packet timestamps the clock-sync probes exchange between network
//! namespaces agree exactly and an estimator could not fail. To give it
//! something to find, `LOOPSCOPE_VCLOCK=OFFSET_NS,DRIFT_PPM,EPOCH_REALTIME_NS`
//! skews every timestamp this process produces, its CLOCK_MONOTONIC and
//! CLOCK_REALTIME reads and the kernel timestamps it reads off sockets
//! alike, as
//!
//! ```text
//! t' = t + OFFSET + DRIFT · (t − epoch)
//! ```
//!
//! with the epoch given in CLOCK_REALTIME (the same instant for every process
//! of a host, so they all skew alike) and its CLOCK_MONOTONIC value derived
//! once at start-up. The truth is then known exactly, and the estimate can
//! be compared against it. Without the variable nothing changes and the
//! cost is one load of an initialised cell.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VClock {
    pub offset_ns: i64,
    pub drift_ppm: f64,
    pub epoch_realtime_ns: i64,
    pub epoch_mono_ns: i64,
}

static VCLOCK: OnceLock<Option<VClock>> = OnceLock::new();

fn raw(id: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as i64 * 1_000_000_000 + ts.tv_nsec as i64
}

/// Parse `OFFSET_NS,DRIFT_PPM,EPOCH_REALTIME_NS`.
pub fn parse(v: &str) -> Result<(i64, f64, i64), crate::Error> {
    let f: Vec<&str> = v.split(',').map(str::trim).collect();
    if f.len() != 3 {
        return Err(crate::Error::input(format!("LOOPSCOPE_VCLOCK={v:?}: expected OFFSET_NS,DRIFT_PPM,EPOCH_REALTIME_NS")));
    }
    let off = f[0].parse::<i64>().map_err(|e| crate::Error::input(format!("LOOPSCOPE_VCLOCK offset {:?}: {e}", f[0])))?;
    let drift = f[1].parse::<f64>().map_err(|e| crate::Error::input(format!("LOOPSCOPE_VCLOCK drift {:?}: {e}", f[1])))?;
    if !drift.is_finite() || drift.abs() >= 1e5 {
        return Err(crate::Error::input(format!("LOOPSCOPE_VCLOCK drift {drift} ppm: must be finite and below 100000 ppm in size")));
    }
    let epoch = f[2].parse::<i64>().map_err(|e| crate::Error::input(format!("LOOPSCOPE_VCLOCK epoch {:?}: {e}", f[2])))?;
    Ok((off, drift, epoch))
}

/// The process's virtual clock, if one is set (read once).
pub fn get() -> Option<&'static VClock> {
    VCLOCK
        .get_or_init(|| {
            let v = std::env::var("LOOPSCOPE_VCLOCK").ok()?;
            match parse(&v) {
                Ok((offset_ns, drift_ppm, epoch_realtime_ns)) => {
                    let (r, m) = (raw(libc::CLOCK_REALTIME), raw(libc::CLOCK_MONOTONIC));
                    Some(VClock { offset_ns, drift_ppm, epoch_realtime_ns, epoch_mono_ns: m - (r - epoch_realtime_ns) })
                }
                Err(e) => {
                    eprintln!("loopscope: ignoring {e}");
                    None
                }
            }
        })
        .as_ref()
}

impl VClock {
    #[inline]
    fn apply(&self, t: i64, epoch: i64) -> i64 {
        t + self.offset_ns + ((t - epoch) as f64 * self.drift_ppm * 1e-6).round() as i64
    }
    pub fn mono(&self, t: i64) -> i64 {
        self.apply(t, self.epoch_mono_ns)
    }
    pub fn real(&self, t: i64) -> i64 {
        self.apply(t, self.epoch_realtime_ns)
    }
}

/// A CLOCK_MONOTONIC value as this process reports it.
#[inline]
pub fn mono(t: i64) -> i64 {
    match get() {
        Some(v) => v.mono(t),
        None => t,
    }
}

/// A CLOCK_REALTIME value (a read or a kernel timestamp) as this process reports it.
#[inline]
pub fn real(t: i64) -> i64 {
    match get() {
        Some(v) if t != 0 => v.real(t),
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_reads_three_fields_and_refuses_others() {
        assert_eq!(parse("1000,2.5,1700000000000000000").unwrap(), (1000, 2.5, 1_700_000_000_000_000_000));
        assert!(parse("1000,2.5").is_err());
        assert!(parse("x,1,2").is_err());
        assert!(parse("1,1e6,2").is_err());
    }

    #[test]
    fn skew_is_offset_plus_drift_from_the_epoch() {
        let v = VClock { offset_ns: 5_000, drift_ppm: 10.0, epoch_realtime_ns: 1_000_000_000, epoch_mono_ns: 0 };
        assert_eq!(v.real(1_000_000_000), 1_000_005_000);
        // one second after the epoch, 10 ppm is 10 µs.
        assert_eq!(v.real(2_000_000_000), 2_000_015_000);
        assert_eq!(v.mono(1_000_000_000), 1_000_015_000);
    }
}
