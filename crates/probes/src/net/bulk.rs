//! Bulk transfer (the role ettcp played in Boie & Niehaus 2007): a TCP stream at a set
//! rate or as fast as the path allows, used as competing network load, and
//! the TCP sink that absorbs it. (Bulk UDP is the paced sender without
//! per-packet records.)

use crate::error::{ProbeError, Result};
use crate::os::{mono_ns, sleep_until};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Default)]
pub struct BulkResult {
    pub bytes: u64,
    pub elapsed_ns: u64,
    pub error: Option<String>,
    pub interrupted: bool,
}

/// Write to `dest` over TCP: `rate_bps` bits/s (None: unlimited) for `duration_ns`.
pub fn tcp_send(dest: &SocketAddr, rate_bps: Option<f64>, size: usize, duration_ns: u64, stop: Arc<AtomicBool>) -> Result<BulkResult> {
    let mut s = TcpStream::connect_timeout(dest, Duration::from_secs(5)).map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => {
            ProbeError::address(dest, format!("connection refused (is a TCP sink listening? loopscope probe recv --tcp --bind {dest})"))
        }
        _ => ProbeError::address(dest, format!("cannot connect: {e}")),
    })?;
    s.set_write_timeout(Some(Duration::from_millis(200))).ok();
    let buf = vec![0x42u8; size.max(1)];
    let t0 = mono_ns();
    let end = t0 + duration_ns as i64;
    let mut r = BulkResult::default();
    let mut next = t0;
    while mono_ns() < end && !stop.load(Ordering::Relaxed) {
        if let Some(rate) = rate_bps {
            sleep_until(next);
            next += ((size * 8) as f64 / rate * 1e9) as i64;
        }
        match s.write(&buf) {
            Ok(n) => r.bytes += n as u64,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {}
            Err(e) => {
                r.error = Some(format!("{dest}: {e}"));
                break;
            }
        }
    }
    r.elapsed_ns = (mono_ns() - t0) as u64;
    r.interrupted = stop.load(Ordering::Relaxed);
    Ok(r)
}

/// Accept TCP connections on `bind` and read everything sent, until `stop`
/// or `duration_ns`. Returns (bytes, connections).
pub fn tcp_sink(listener: TcpListener, duration_ns: Option<u64>, stop: Arc<AtomicBool>) -> (u64, u64) {
    listener.set_nonblocking(true).ok();
    let bytes = Arc::new(AtomicU64::new(0));
    let mut conns = 0u64;
    let mut hs = Vec::new();
    let t0 = mono_ns();
    while !stop.load(Ordering::Relaxed) && !duration_ns.is_some_and(|d| mono_ns() - t0 >= d as i64) {
        match listener.accept() {
            Ok((mut c, _)) => {
                conns += 1;
                let (b, st) = (bytes.clone(), stop.clone());
                c.set_read_timeout(Some(Duration::from_millis(100))).ok();
                hs.push(std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    while !st.load(Ordering::Relaxed) {
                        match c.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => {
                                b.fetch_add(n as u64, Ordering::Relaxed);
                            }
                            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {}
                            Err(_) => break,
                        }
                    }
                }));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        let _ = h.join();
    }
    (bytes.load(Ordering::Relaxed), conns)
}

pub fn tcp_listen(bind: &SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(bind).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => ProbeError::address(bind, "the port is in use; choose another or stop what holds it"),
        _ => ProbeError::address(bind, format!("cannot listen: {e}")),
    })
}
