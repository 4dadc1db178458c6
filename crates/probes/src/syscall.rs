//! System-call cost probe: the calibration method of Carlinet et al. 2000.
//!
//! For each call, independent batches of `batch` calls are timed (one clock
//! read before and after the batch, so the clock's own cost is spread over
//! the batch); each batch gives one sample, the mean cost per call. Batches
//! repeat until the 95 % confidence interval of the mean is within
//! `target_rel` of it (Carlinet et al. 2000's "true mean within 5 % with
//! 95 % confidence"), or a batch or time cap is reached, which the result says.
//! Calls that need set-up (a file to open, a datagram to receive, an fd to
//! close) get it outside the timed batch. Each batch is also an interval in
//! the trace (group `syscall`, named after the call, tag: batch number).
//!
//! A call alone (`read`) is its minimal form: one byte, one short path. The
//! calls that move data also take a size (`read:4096`, `write:65536`,
//! `sendto:256`, `recvfrom:1400`): then they move that many bytes the way
//! programs usually do: `read` walks a 4 MiB file in the page cache
//! sequentially, `write` appends to a file emptied before each batch (pages
//! allocated as a copier does), `sendto`/`recvfrom` carry datagrams of that
//! size over loopback. Apps are priced by the calls at their own sizes.

use crate::error::{ProbeError, Result};
use crate::os::mono_ns;
use loopscope_trace::{register, Entity, Kind};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub const CALLS: &[&str] =
    &["getpid", "clock_gettime", "open", "close", "read", "write", "stat", "link", "unlink", "socket", "sendto", "recvfrom", "mmap", "munmap"];

/// Calls that take a size (`name:bytes`), with the largest size each allows.
pub const SIZED: &[(&str, usize)] = &[("read", 1 << 20), ("write", 1 << 20), ("sendto", 65_000), ("recvfrom", 65_000)];

const READ_FILE: usize = 4 << 20;

/// `read` -> ("read", None); `read:4096` -> ("read", Some(4096)); else why not.
pub fn parse_call(spec: &str) -> Result<(String, Option<usize>)> {
    let (name, size) = match spec.split_once(':') {
        None => (spec, None),
        Some((n, z)) => (n, Some(z)),
    };
    if !CALLS.contains(&name) {
        return Err(ProbeError::Input(format!("unknown system call {name:?}; known: {}", CALLS.join(", "))));
    }
    let Some(z) = size else { return Ok((name.into(), None)) };
    let Some(&(_, max)) = SIZED.iter().find(|(n, _)| *n == name) else {
        return Err(ProbeError::Input(format!(
            "{spec:?}: {name} takes no size; sized calls: {}",
            SIZED.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        )));
    };
    match z.parse::<usize>() {
        Ok(b) if (1..=max).contains(&b) => Ok((name.into(), Some(b))),
        _ => Err(ProbeError::Input(format!("{spec:?}: the size after ':' is a number of bytes, 1..{max}"))),
    }
}

#[derive(Clone, Debug)]
pub struct SyscallConfig {
    pub calls: Vec<String>,
    pub batch: usize,
    pub min_batches: usize,
    pub max_batches: usize,
    /// Stop when the CI half-width is within this fraction of the mean.
    pub target_rel: f64,
    /// Time cap per call, seconds.
    pub max_seconds: f64,
    /// Where the probe's scratch files go.
    pub dir: PathBuf,
}

#[derive(Debug, Default, Clone)]
pub struct CallResult {
    pub name: String,
    /// Mean ns per call of each batch.
    pub batch_ns: Vec<f64>,
    pub mean_ns: f64,
    pub ci_half_ns: f64,
    pub converged: bool,
    pub error: Option<String>,
}

#[derive(Debug, Default)]
pub struct SyscallResult {
    pub calls: Vec<CallResult>,
    pub interrupted: bool,
    pub clock_read_ns: f64,
}

/// Two-sided 95 % Student t quantile for `df` degrees of freedom.
pub fn t95(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080,
        2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    if df == 0 {
        return f64::INFINITY;
    }
    if df <= 30 {
        return T[df - 1];
    }
    // Cornish-Fisher expansion around the normal quantile.
    let z: f64 = 1.959963984540054;
    let d = df as f64;
    z + (z.powi(3) + z) / (4.0 * d) + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * d * d)
}

/// Mean and 95 % CI half-width of samples.
pub fn mean_ci(x: &[f64]) -> (f64, f64) {
    let n = x.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let m = x.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (m, f64::INFINITY);
    }
    let v = x.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / (n - 1) as f64;
    (m, t95(n - 1) * (v / n as f64).sqrt())
}

fn errno_msg(what: &str) -> ProbeError {
    ProbeError::last_os(what)
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap_or_default()
}

/// Scratch resources shared by the calls.
struct Bench {
    dir: PathBuf,
    file: CString,
    fd: i32,
    wfd: i32,
    rx: i32,
    tx: i32,
    rx_addr: libc::sockaddr_in,
    /// Sized calls: a 4 MiB file to read through, a file to append to, a buffer.
    bigfd: i32,
    afd: i32,
    roff: std::cell::Cell<usize>,
    buf: Vec<u8>,
}

impl Bench {
    fn new(dir: &Path) -> Result<Bench> {
        // One directory per probe, even with several in one process (each removes its own at the end).
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = dir.join(format!("ls-syscall-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&dir).map_err(ProbeError::os(format!("{}: cannot create the probe's scratch directory", dir.display())))?;
        let f = dir.join("data");
        std::fs::write(&f, [0u8; 4096]).map_err(ProbeError::os(format!("writing {}", f.display())))?;
        let file = cpath(&f);
        unsafe {
            let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
            if fd < 0 {
                return Err(errno_msg(&format!("open {}", f.display())));
            }
            let wf = cpath(&dir.join("out"));
            let wfd = libc::open(wf.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644);
            if wfd < 0 {
                return Err(errno_msg(&format!("open {}", dir.join("out").display())));
            }
            let rx = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
            let tx = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
            if rx < 0 || tx < 0 {
                return Err(errno_msg("socket"));
            }
            let mut a: libc::sockaddr_in = std::mem::zeroed();
            a.sin_family = libc::AF_INET as u16;
            a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            if libc::bind(rx, &a as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_in>() as u32) != 0 {
                return Err(errno_msg("bind 127.0.0.1"));
            }
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as u32;
            libc::getsockname(rx, &mut a as *mut _ as *mut libc::sockaddr, &mut len);
            // Room for a batch of 64 KB datagrams (root may force it past rmem_max).
            let room: libc::c_int = 64 << 20;
            loopscope_os::force_buffer(rx, loopscope_os::Buf::Recv, room as usize);
            let bf = dir.join("big");
            std::fs::write(&bf, vec![7u8; READ_FILE]).map_err(ProbeError::os(format!("writing {}", bf.display())))?;
            let big = cpath(&bf);
            let bigfd = libc::open(big.as_ptr(), libc::O_RDONLY);
            let af = cpath(&dir.join("append"));
            let afd = libc::open(af.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644);
            if bigfd < 0 || afd < 0 {
                return Err(errno_msg(&format!("open {}", dir.display())));
            }
            Ok(Bench { dir, file, fd, wfd, rx, tx, rx_addr: a, bigfd, afd, roff: std::cell::Cell::new(0), buf: vec![0u8; 1 << 20] })
        }
    }

    fn drain(&self) {
        let mut b = [0u8; 256];
        unsafe { while libc::recv(self.rx, b.as_mut_ptr() as *mut libc::c_void, b.len(), libc::MSG_DONTWAIT) > 0 {} }
    }

    fn send(&self, len: usize) -> isize {
        unsafe {
            libc::sendto(
                self.tx,
                self.buf.as_ptr() as *const libc::c_void,
                len,
                0,
                &self.rx_addr as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        }
    }

    /// Time one batch of `n` calls of `name:size`.
    fn sized_batch(&self, call: &str, size: usize, n: usize) -> Result<(i64, i64)> {
        let mut rbuf = vec![0u8; size];
        unsafe {
            match call {
                "write" => {
                    if libc::ftruncate(self.afd, 0) != 0 || libc::lseek(self.afd, 0, libc::SEEK_SET) != 0 {
                        return Err(errno_msg("ftruncate (set-up for write)"));
                    }
                }
                "recvfrom" => {
                    for _ in 0..n {
                        if self.send(size) < 0 {
                            return Err(errno_msg("sendto (set-up for recvfrom)"));
                        }
                    }
                }
                _ => {}
            }
        }
        let mut failed: Option<ProbeError> = None;
        let t0 = mono_ns();
        unsafe {
            match call {
                "read" => {
                    let mut off = self.roff.get();
                    for _ in 0..n {
                        if off + size > READ_FILE {
                            off = 0;
                        }
                        if libc::pread(self.bigfd, rbuf.as_mut_ptr() as *mut libc::c_void, size, off as libc::off_t) != size as isize {
                            failed = Some(errno_msg(&format!("pread {size}")));
                            break;
                        }
                        off += size;
                    }
                    self.roff.set(off);
                }
                "write" => {
                    for _ in 0..n {
                        if libc::write(self.afd, self.buf.as_ptr() as *const libc::c_void, size) != size as isize {
                            failed = Some(errno_msg(&format!("write {size}")));
                            break;
                        }
                    }
                }
                "sendto" => {
                    for _ in 0..n {
                        if self.send(size) != size as isize {
                            failed = Some(errno_msg(&format!("sendto {size}")));
                            break;
                        }
                    }
                }
                "recvfrom" => {
                    for _ in 0..n {
                        let got = libc::recvfrom(
                            self.rx,
                            rbuf.as_mut_ptr() as *mut libc::c_void,
                            size,
                            libc::MSG_DONTWAIT,
                            std::ptr::null_mut(),
                            std::ptr::null_mut(),
                        );
                        if got != size as isize {
                            failed = Some(if got < 0 {
                                errno_msg(&format!("recvfrom {size}"))
                            } else {
                                ProbeError::Os { what: format!("recvfrom {size}"), source: std::io::Error::other(format!("got {got} bytes")) }
                            });
                            break;
                        }
                    }
                }
                other => failed = Some(ProbeError::Input(format!("{other} takes no size"))),
            }
        }
        let dt = mono_ns() - t0;
        if call == "sendto" {
            self.drain();
        }
        match failed {
            Some(e) => Err(e),
            None => Ok((t0, dt)),
        }
    }

    /// Time one batch of `n` calls: (start, duration) in CLOCK_MONOTONIC ns, or the failure.
    /// What the calls need (files to close, links to unlink, datagrams to
    /// receive, mappings to unmap) is made before the timing and cleaned up
    /// after it.
    fn batch(&self, call: &str, n: usize, k: usize) -> Result<(i64, i64)> {
        let mut h = self.set_up(call, n, k)?;
        let t0 = mono_ns();
        let mut failed = if FILE_CALLS.contains(&call) { self.timed_files(call, &mut h) } else { self.timed_other(call, &mut h) };
        let dt = mono_ns() - t0;
        h.clean_up(call, &mut failed);
        if call == "sendto" {
            self.drain();
        }
        match failed {
            Some(e) => Err(e),
            None => Ok((t0, dt)),
        }
    }

    /// The handles a batch works on, made outside the timing.
    fn set_up(&self, call: &str, n: usize, k: usize) -> Result<Handles> {
        let mut h = Handles {
            n,
            fds: vec![-1i32; n],
            names: if matches!(call, "link" | "unlink") { (0..n).map(|i| cpath(&self.dir.join(format!("l{k}-{i}")))).collect() } else { vec![] },
            maps: vec![std::ptr::null_mut(); n],
            buf: [0u8; 256],
        };
        unsafe {
            match call {
                "close" => {
                    for f in h.fds.iter_mut() {
                        *f = libc::open(self.file.as_ptr(), libc::O_RDONLY);
                        if *f < 0 {
                            return Err(errno_msg("open (set-up for close)"));
                        }
                    }
                }
                "unlink" => {
                    for nm in &h.names {
                        if libc::link(self.file.as_ptr(), nm.as_ptr()) != 0 {
                            return Err(errno_msg("link (set-up for unlink)"));
                        }
                    }
                }
                "recvfrom" => {
                    for _ in 0..n {
                        if self.send(64) < 0 {
                            return Err(errno_msg("sendto (set-up for recvfrom)"));
                        }
                    }
                }
                "munmap" => {
                    for m in h.maps.iter_mut() {
                        *m = map_page();
                        if *m == libc::MAP_FAILED {
                            return Err(errno_msg("mmap (set-up for munmap)"));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(h)
    }

    /// The timed loop of a call on files; the failure, if any.
    fn timed_files(&self, call: &str, h: &mut Handles) -> Option<ProbeError> {
        let n = h.n;
        unsafe {
            match call {
                "open" => h.fds.iter_mut().for_each(|f| *f = libc::open(self.file.as_ptr(), libc::O_RDONLY)),
                "close" => h.fds.iter_mut().for_each(|f| {
                    libc::close(*f);
                    *f = -1;
                }),
                "read" => return repeat(n, "pread", || libc::pread(self.fd, h.buf.as_mut_ptr() as *mut libc::c_void, 1, 0) == 1),
                "write" => return repeat(n, "pwrite", || libc::pwrite(self.wfd, h.buf.as_ptr() as *const libc::c_void, 1, 0) == 1),
                "stat" => {
                    let mut st: libc::stat = std::mem::zeroed();
                    return repeat(n, "stat", || libc::stat(self.file.as_ptr(), &mut st) == 0);
                }
                "link" => {
                    for nm in &h.names {
                        if libc::link(self.file.as_ptr(), nm.as_ptr()) != 0 {
                            return Some(errno_msg("link"));
                        }
                    }
                }
                "unlink" => h.names.iter().for_each(|nm| {
                    libc::unlink(nm.as_ptr());
                }),
                _ => unreachable!("FILE_CALLS lists the calls handled here"),
            }
        }
        None
    }

    /// The timed loop of any other call; the failure, if any.
    fn timed_other(&self, call: &str, h: &mut Handles) -> Option<ProbeError> {
        let n = h.n;
        unsafe {
            match call {
                "getpid" => (0..n).for_each(|_| {
                    std::hint::black_box(libc::syscall(libc::SYS_getpid));
                }),
                "clock_gettime" => {
                    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                    for _ in 0..n {
                        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
                        std::hint::black_box(&ts);
                    }
                }
                "socket" => h.fds.iter_mut().for_each(|f| *f = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0)),
                "sendto" => return repeat(n, "sendto", || self.send(64) >= 0),
                "recvfrom" => {
                    let buf = &mut h.buf;
                    return repeat(n, "recvfrom", || {
                        libc::recvfrom(
                            self.rx,
                            buf.as_mut_ptr() as *mut libc::c_void,
                            buf.len(),
                            libc::MSG_DONTWAIT,
                            std::ptr::null_mut(),
                            std::ptr::null_mut(),
                        ) >= 0
                    });
                }
                "mmap" => h.maps.iter_mut().for_each(|m| *m = map_page()),
                "munmap" => h.maps.iter_mut().for_each(|m| {
                    libc::munmap(*m, 4096);
                    *m = std::ptr::null_mut();
                }),
                other => return Some(ProbeError::Input(format!("unknown system call {other:?}; known: {}", CALLS.join(", ")))),
            }
        }
        None
    }
}

/// The calls `timed_files` times.
const FILE_CALLS: [&str; 7] = ["open", "close", "read", "write", "stat", "link", "unlink"];

/// Run `ok` `n` times, stopping at the first failure (named `what`, with errno).
fn repeat(n: usize, what: &str, mut ok: impl FnMut() -> bool) -> Option<ProbeError> {
    for _ in 0..n {
        if !ok() {
            return Some(errno_msg(what));
        }
    }
    None
}

fn map_page() -> *mut libc::c_void {
    // SAFETY: an anonymous private mapping of one page.
    unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) }
}

/// What one batch opened, linked or mapped.
struct Handles {
    n: usize,
    fds: Vec<i32>,
    names: Vec<CString>,
    maps: Vec<*mut libc::c_void>,
    buf: [u8; 256],
}

impl Handles {
    /// Clean-up outside the timing, and the failures of calls that return
    /// handles (seen only now, so the loop stays a bare loop).
    fn clean_up(self, call: &str, failed: &mut Option<ProbeError>) {
        unsafe {
            for f in self.fds.iter() {
                if *f >= 0 {
                    libc::close(*f);
                } else if matches!(call, "open" | "socket") && failed.is_none() {
                    *failed = Some(ProbeError::last_os(call));
                }
            }
            if call == "link" {
                for nm in &self.names {
                    libc::unlink(nm.as_ptr());
                }
            }
            for m in self.maps.iter() {
                if *m == libc::MAP_FAILED && failed.is_none() {
                    *failed = Some(ProbeError::Os { what: "mmap".into(), source: std::io::Error::other("the mapping failed") });
                } else if !m.is_null() && *m != libc::MAP_FAILED {
                    libc::munmap(*m, 4096);
                }
            }
        }
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        unsafe {
            libc::close(self.fd);
            libc::close(self.wfd);
            libc::close(self.rx);
            libc::close(self.tx);
            libc::close(self.bigfd);
            libc::close(self.afd);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn entity(call: &str) -> Option<&'static Entity> {
    register("syscall", call, Kind::Interval, "one timed batch of this system call (tag: batch number)", None).ok()
}

pub fn run(cfg: &SyscallConfig, stop: Arc<AtomicBool>) -> Result<SyscallResult> {
    let specs = cfg.calls.iter().map(|c| parse_call(c)).collect::<Result<Vec<_>>>()?;
    loopscope_trace::prepare_thread();
    let b = Bench::new(&cfg.dir)?;
    let mut res = SyscallResult { clock_read_ns: crate::timer::clock_read_ns(), ..Default::default() };
    for (call, (base, size)) in cfg.calls.iter().zip(specs) {
        let ent = entity(call);
        let one = |n: usize, k: usize| match size {
            Some(z) => b.sized_batch(&base, z, n),
            None => b.batch(&base, n, k),
        };
        let mut r = CallResult { name: call.clone(), ..Default::default() };
        let t_start = mono_ns();
        // One untimed batch warms caches and the dentry/socket paths.
        if let Err(e) = one(cfg.batch, usize::MAX) {
            r.error = Some(e.to_string());
            res.calls.push(r);
            continue;
        }
        loop {
            if stop.load(Ordering::Relaxed) {
                res.interrupted = true;
                break;
            }
            let k = r.batch_ns.len();
            match one(cfg.batch, k) {
                Ok((t0, dt)) => {
                    r.batch_ns.push(dt as f64 / cfg.batch as f64);
                    if let Some(e) = ent {
                        // Only the timed part: set-up and clean-up are outside it.
                        e.interval_mono(k as u32, t0 as u64, dt as u64);
                    }
                }
                Err(e) => {
                    r.error = Some(e.to_string());
                    break;
                }
            }
            let n = r.batch_ns.len();
            if n >= cfg.min_batches {
                let (m, h) = mean_ci(&r.batch_ns);
                if h <= cfg.target_rel * m {
                    r.converged = true;
                    break;
                }
            }
            if n >= cfg.max_batches || (mono_ns() - t_start) as f64 > cfg.max_seconds * 1e9 {
                break;
            }
        }
        let (m, h) = mean_ci(&r.batch_ns);
        r.mean_ns = m;
        r.ci_half_ns = h;
        res.calls.push(r);
        if res.interrupted {
            break;
        }
    }
    Ok(res)
}

#[cfg(test)]
mod tests;
