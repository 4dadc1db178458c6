//! Background loads: the work a machine does next to the measured task.
//!
//! Each load kind is a *unit of work* repeated by a worker process: `cpu`
//! Huffman-codes a 5000-byte buffer and `memory` fills 10 M random integers
//! and sorts them (the computation and memory loads of the node-calibration
//! study, Carlinet et al. 2000), `io` copies a 1 MiB file in 100-byte blocks (with or
//! without fsync), `net` sends paced UDP datagrams to a sink on loopback, and
//! `mix` alternates compiler-like CPU bursts with small file writes and
//! reads. A worker runs flat out, or at a duty cycle: after each unit it
//! sleeps until its busy time is the requested fraction of the time elapsed,
//! so the average is exact and the granularity is one unit. It counts the
//! units it completed, so a report can say how much work a load really did.
//!
//! Workers stop on SIGTERM/SIGINT (a flag checked between units) and die
//! with their parent (PR_SET_PDEATHSIG), so no load outlives the run.

mod cpu;
pub mod error;
mod io;
mod memory;
pub mod net;

pub use error::{LoadError, Result};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use cpu::Huffman;

/// What one worker does.
#[derive(Clone, Debug)]
pub enum Kind {
    Cpu,
    Memory {
        count: usize,
    },
    Io {
        dir: PathBuf,
        fsync: bool,
    },
    /// Rate in payload bits per second (None: unlimited), `dest` None: a sink of its own.
    Net {
        protocol: net::Protocol,
        rate_bps: Option<f64>,
        size: usize,
        dest: Option<std::net::SocketAddr>,
    },
    Mix {
        dir: PathBuf,
    },
}

impl Kind {
    pub fn name(&self) -> &'static str {
        match self {
            Kind::Cpu => "cpu",
            Kind::Memory { .. } => "memory",
            Kind::Io { .. } => "io",
            Kind::Net { .. } => "net",
            Kind::Mix { .. } => "mix",
        }
    }
    /// What one unit of work is, for reports.
    pub fn unit(&self) -> &'static str {
        match self {
            Kind::Cpu => "5000-byte buffers Huffman-coded",
            Kind::Memory { .. } => "arrays filled and sorted",
            Kind::Io { .. } => "1 MiB files copied in 100-byte blocks",
            Kind::Net { protocol: net::Protocol::Udp, .. } => "UDP datagrams sent",
            Kind::Net { protocol: net::Protocol::Tcp, .. } => "TCP writes",
            Kind::Mix { .. } => "compile-like steps",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub kind: Kind,
    /// Fraction of the time to be busy (0 < duty <= 1); None: flat out.
    pub duty: Option<f64>,
    /// Stop after this long; None: until stopped.
    pub seconds: Option<f64>,
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub kind: String,
    pub unit: String,
    pub ops: u64,
    pub busy_ns: u64,
    pub elapsed_ns: u64,
    pub error: Option<String>,
}

/// One kind's unit of work and its state.
trait Work {
    /// Do one unit; returns how many units it counted (usually 1).
    fn step(&mut self) -> Result<u64>;
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Make this process a load worker: stop on SIGTERM/SIGINT, die with the parent.
pub fn install_worker_signals() -> Result<()> {
    // The parent that started this worker (the lab names it: the worker has
    // been importing for a while, and its parent may have died meanwhile).
    let started_by = std::env::var("LOOPSCOPE_PDEATHSIG").ok().and_then(|v| v.parse::<libc::pid_t>().ok()).filter(|&p| p > 0);
    unsafe {
        let ppid = started_by.unwrap_or_else(|| libc::getppid());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        // The parent may have died before the request took effect.
        if libc::getppid() != ppid {
            return Err(LoadError::Orphaned);
        }
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    Ok(())
}

/// Whether SIGTERM/SIGINT has been received by a worker.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

fn make(kind: &Kind) -> Result<Box<dyn Work>> {
    Ok(match kind {
        Kind::Cpu => Box::new(cpu::CpuWork::new()),
        Kind::Memory { count } => Box::new(memory::MemoryWork::new(*count)),
        Kind::Io { dir, fsync } => Box::new(io::IoWork::new(dir, *fsync)?),
        Kind::Net { protocol, rate_bps, size, dest } => Box::new(net::NetWork::new(*protocol, *rate_bps, *size, *dest)?),
        Kind::Mix { dir } => Box::new(io::MixWork::new(dir)?),
    })
}

/// Run a worker until `stop` (or the process's stop signal, or `seconds`).
pub fn run(cfg: &Config, stop: &AtomicBool) -> Report {
    let mut rep = Report { kind: cfg.kind.name().into(), unit: cfg.kind.unit().into(), ..Default::default() };
    let mut w = match make(&cfg.kind) {
        Ok(w) => w,
        Err(e) => {
            rep.error = Some(e.to_string());
            return rep;
        }
    };
    let t0 = Instant::now();
    let limit = cfg.seconds.map(Duration::from_secs_f64);
    let mut busy = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) && !stop_requested() {
        if limit.is_some_and(|l| t0.elapsed() >= l) {
            break;
        }
        let s = Instant::now();
        match w.step() {
            Ok(n) => rep.ops += n,
            Err(e) => {
                rep.error = Some(e.to_string());
                break;
            }
        }
        busy += s.elapsed();
        if let Some(d) = cfg.duty {
            // Sleep until busy / elapsed == duty, in slices so a stop is prompt.
            let target = busy.as_secs_f64() / d;
            loop {
                let el = t0.elapsed().as_secs_f64();
                if el >= target || stop.load(Ordering::Relaxed) || stop_requested() {
                    break;
                }
                std::thread::sleep(Duration::from_secs_f64((target - el).min(0.05)));
            }
        }
    }
    rep.busy_ns = busy.as_nanos() as u64;
    rep.elapsed_ns = t0.elapsed().as_nanos() as u64;
    rep
}

/// A small fast generator for the loads' random data (xorshift64*).
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    #[inline]
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick(kind: Kind, duty: Option<f64>, s: f64) -> Report {
        run(&Config { kind, duty, seconds: Some(s) }, &AtomicBool::new(false))
    }

    #[test]
    fn a_cpu_worker_counts_its_units() {
        let r = quick(Kind::Cpu, None, 0.2);
        assert!(r.error.is_none());
        assert!(r.ops > 100, "{r:?}");
        assert!(r.busy_ns as f64 > 0.9 * r.elapsed_ns as f64);
    }

    #[test]
    fn a_duty_cycle_keeps_the_busy_fraction() {
        let r = quick(Kind::Cpu, Some(0.3), 1.0);
        let f = r.busy_ns as f64 / r.elapsed_ns as f64;
        assert!((0.2..0.4).contains(&f), "busy fraction {f}");
    }

    #[test]
    fn io_and_mix_workers_use_their_directory() {
        let d = std::env::temp_dir().join(format!("ls-loads-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let r = quick(Kind::Io { dir: d.clone(), fsync: false }, None, 0.3);
        assert!(r.error.is_none() && r.ops >= 1, "{r:?}");
        let r = quick(Kind::Mix { dir: d.clone() }, None, 0.3);
        assert!(r.error.is_none() && r.ops >= 1, "{r:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_unwritable_directory_is_reported_not_ignored() {
        let r = quick(Kind::Io { dir: "/proc/nonexistent".into(), fsync: false }, None, 0.1);
        assert!(r.error.unwrap().contains("/proc/nonexistent"));
    }

    #[test]
    fn a_net_worker_sends_at_its_rate() {
        // 2000 datagrams of 200 bytes a second: 3.2 Mbit/s.
        let r = quick(Kind::Net { protocol: net::Protocol::Udp, rate_bps: Some(3.2e6), size: 200, dest: None }, None, 0.5);
        assert!(r.error.is_none(), "{r:?}");
        assert!((800..1200).contains(&r.ops), "{}", r.ops);
    }

    #[test]
    fn a_tcp_net_worker_streams_to_its_own_sink() {
        let r = quick(Kind::Net { protocol: net::Protocol::Tcp, rate_bps: Some(8e6), size: 10_000, dest: None }, None, 0.5);
        assert!(r.error.is_none(), "{r:?}");
        assert!((40..60).contains(&r.ops), "{}", r.ops);
        let r = quick(Kind::Net { protocol: net::Protocol::Tcp, rate_bps: None, size: 65536, dest: None }, None, 0.2);
        assert!(r.error.is_none() && r.ops > 100, "{r:?}");
    }

    #[test]
    fn a_memory_worker_sorts() {
        let r = quick(Kind::Memory { count: 100_000 }, None, 0.2);
        assert!(r.error.is_none() && r.ops > 1, "{r:?}");
    }
}
