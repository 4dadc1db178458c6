//! Stimulus-response over TCP: the same exchange as [`super::rr`] (a request
//! carrying the client's send time, an answer carrying the server's kernel RX,
//! read and send times), on one connection.
//!
//! A stream has no datagrams, so every message is framed: a little-endian
//! u32 length, then the message (a request of the configured size, an
//! answer of `RESPONSE` bytes). Kernel RX stamps come with the read that
//! completed a message: on a stream the kernel stamps the newest segment a
//! read returned, which for one message in flight is the message's own.
//! Nagle is off on both ends, so a request leaves when it is written.

use super::packet::{reply_times, write_reply_times, Header, HEADER, REPLY, REQUEST, RESPONSE};
use super::rr::{reader_done, EchoResult, Exchange, RrConfig, RrResult};
use super::schedule::Schedule;
use super::sock::{enable_rx_timestamps_fd, realtime_ns, realtime_offset_ns, recv_stamped};
use crate::error::{ProbeError, Result};
use crate::os::{mono_ns, sleep_until};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MAX_MESSAGE: usize = 1 << 20;

/// Bytes of a stream cut into length-prefixed messages, each with the
/// kernel RX stamp of the read that completed it.
struct Framer {
    buf: Vec<u8>,
    ctrl: [u8; 256],
    pending: Vec<u8>,
}

impl Framer {
    fn new() -> Framer {
        Framer { buf: vec![0u8; 1 << 16], ctrl: [0u8; 256], pending: Vec::new() }
    }

    /// Read once (with the socket's timeout); append the complete messages
    /// to `out`. Err on end of stream or a malformed length.
    fn read(&mut self, fd: i32, out: &mut Vec<(Vec<u8>, i64)>) -> std::result::Result<(), ()> {
        let Some(got) = recv_stamped(fd, &mut self.buf, &mut self.ctrl) else {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted => Ok(()),
                _ => Err(()),
            };
        };
        if got.len == 0 {
            return Err(());
        }
        self.pending.extend_from_slice(&self.buf[..got.len]);
        let mut at = 0;
        while self.pending.len() - at >= 4 {
            let n = u32::from_le_bytes(self.pending[at..at + 4].try_into().unwrap()) as usize;
            if n > MAX_MESSAGE {
                return Err(());
            }
            if self.pending.len() - at - 4 < n {
                break;
            }
            out.push((self.pending[at + 4..at + 4 + n].to_vec(), got.krx));
            at += 4 + n;
        }
        self.pending.drain(..at);
        Ok(())
    }
}

fn frame(msg: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + msg.len());
    v.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    v.extend_from_slice(msg);
    v
}

fn prepare(s: &TcpStream) -> Result<()> {
    s.set_nodelay(true).map_err(ProbeError::os("TCP_NODELAY"))?;
    s.set_read_timeout(Some(Duration::from_millis(20))).map_err(ProbeError::os("SO_RCVTIMEO"))?;
    enable_rx_timestamps_fd(s.as_raw_fd())
}

/// Serve one connection: answer each request at once.
fn serve(mut c: TcpStream, stop: Arc<AtomicBool>, r: Arc<Mutex<EchoResult>>) {
    if prepare(&c).is_err() {
        return;
    }
    if let Ok(mut g) = r.lock() {
        g.tids.push(unsafe { libc::gettid() } as i64);
    }
    let fd = c.as_raw_fd();
    let mut fr = Framer::new();
    let mut msgs = Vec::new();
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        msgs.clear();
        if fr.read(fd, &mut msgs).is_err() {
            break;
        }
        if msgs.is_empty() {
            continue;
        }
        let urx = realtime_ns();
        out.clear();
        let (mut ok, mut bad) = (0u64, 0u64);
        for (m, krx) in &msgs {
            let Some(h) = Header::read(m).filter(|h| h.kind == REQUEST) else {
                bad += 1;
                continue;
            };
            let mut a = [0u8; RESPONSE];
            Header { kind: REPLY, ..h }.write(&mut a[..HEADER]);
            write_reply_times(&mut a, *krx, urx, realtime_ns());
            out.extend_from_slice(&frame(&a));
            ok += 1;
        }
        let sent = c.write_all(&out).is_ok();
        let mut g = r.lock().unwrap_or_else(|e| e.into_inner());
        g.malformed += bad;
        if sent {
            g.requests += ok;
        } else {
            g.send_errors += ok;
            break;
        }
    }
}

/// Accept connections and answer their requests until `stop` or `duration_ns`.
pub fn echo(listener: TcpListener, duration_ns: Option<u64>, stop: Arc<AtomicBool>) -> EchoResult {
    let t0 = mono_ns();
    let r = Arc::new(Mutex::new(EchoResult::default()));
    let mut hs = Vec::new();
    let lfd = listener.as_raw_fd();
    while !stop.load(Ordering::Relaxed) && !duration_ns.is_some_and(|d| mono_ns() - t0 >= d as i64) {
        let mut p = libc::pollfd { fd: lfd, events: libc::POLLIN, revents: 0 };
        if unsafe { libc::poll(&mut p, 1, 50) } <= 0 {
            continue;
        }
        if let Ok((c, _)) = listener.accept() {
            let (st, rr) = (stop.clone(), r.clone());
            if let Ok(h) = std::thread::Builder::new().name("ls-echo-tcp".into()).spawn(move || serve(c, st, rr)) {
                hs.push(h);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        let _ = h.join();
    }
    let mut out = std::mem::take(&mut *r.lock().unwrap_or_else(|e| e.into_inner()));
    out.elapsed_ns = (mono_ns() - t0) as u64;
    out
}

/// The receiving thread of a client: each reply framed, checked and stamped
/// until the stop or the grace after the last send; (malformed, duplicates).
fn receive(rsock: &TcpStream, rst: &AtomicBool, rd: &AtomicBool, rg: &Mutex<Vec<Exchange>>, grace: i64, log: Option<&loopscope_trace::Entity>) -> (u64, u64) {
    loopscope_trace::prepare_thread();
    let fd = rsock.as_raw_fd();
    let mut fr = Framer::new();
    let mut msgs = Vec::new();
    let (mut malformed, mut dups) = (0u64, 0u64);
    let mut seen = std::collections::HashSet::new();
    let mut finish_by: Option<i64> = None;
    loop {
        if reader_done(rst, rd, &mut finish_by, grace) {
            break;
        }
        msgs.clear();
        if fr.read(fd, &mut msgs).is_err() {
            break;
        }
        let urx = realtime_ns();
        for (m, krx) in &msgs {
            let Some(h) = Header::read(m).filter(|h| h.kind == REPLY && m.len() >= RESPONSE) else {
                malformed += 1;
                continue;
            };
            if !seen.insert(h.seq) {
                dups += 1;
                continue;
            }
            let (skrx, surx, sutx) = reply_times(m);
            let x = Exchange { seq: h.seq, sent: h.sent_ns, srv_krx: skrx, srv_urx: surx, srv_utx: sutx, krx: *krx, urx };
            if let Some(ent) = log {
                x.log(ent);
            }
            rg.lock().unwrap_or_else(|e| e.into_inner()).push(x);
        }
    }
    (malformed, dups)
}

/// The client: requests on the configured schedule over one connection, a
/// reader thread matching the answers.
pub fn client(cfg: &RrConfig, stop: Arc<AtomicBool>) -> Result<RrResult> {
    let sock = TcpStream::connect_timeout(&cfg.dest, Duration::from_secs(5)).map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => {
            ProbeError::address(cfg.dest, format!("connection refused (is an echo server listening? loopscope probe echo --tcp --bind {})", cfg.dest))
        }
        _ => ProbeError::address(cfg.dest, format!("cannot connect: {e}")),
    })?;
    prepare(&sock)?;
    let rt_off = realtime_offset_ns();
    let size = cfg.size.max(HEADER);
    let ent = super::rr::entity();
    let done_sending = Arc::new(AtomicBool::new(false));
    let sent_count = Arc::new(AtomicU64::new(0));
    let got: Arc<Mutex<Vec<Exchange>>> = Arc::new(Mutex::new(Vec::new()));
    let rsock = sock.try_clone().map_err(ProbeError::os("cannot share the connection"))?;
    let (rd, rg, rst, records) = (done_sending.clone(), got.clone(), stop.clone(), cfg.records);
    let grace = cfg.grace_ns as i64;
    let reader = std::thread::Builder::new()
        .name("ls-rr-recv".into())
        .spawn(move || receive(&rsock, &rst, &rd, &rg, grace, records.then_some(ent)))
        .map_err(ProbeError::os("cannot start the receiving thread"))?;
    let mut w = sock;
    let mut buf = vec![0u8; 4 + size];
    buf[..4].copy_from_slice(&(size as u32).to_le_bytes());
    let t0 = mono_ns() + 2_000_000;
    let mut errors = 0u64;
    for (k, off) in Schedule::new(cfg.pattern.clone(), cfg.pps_num, cfg.pps_den, None, Some(cfg.duration_ns)).enumerate() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let d = t0 + off as i64;
        sleep_until(d);
        let now = mono_ns();
        Header { kind: REQUEST, flow: cfg.flow, worker: 0, seq: k as u64, sched_ns: d + rt_off, sent_ns: now + rt_off }.write(&mut buf[4..4 + HEADER]);
        if w.write_all(&buf).is_err() {
            errors += 1;
            break; // a stream that failed once does not recover
        }
        sent_count.fetch_add(1, Ordering::Relaxed);
    }
    let elapsed = (mono_ns() - t0) as u64;
    done_sending.store(true, Ordering::Relaxed);
    let (malformed, duplicates) = reader.join().unwrap_or((0, 0));
    let _ = w.shutdown(std::net::Shutdown::Both);
    let mut ex = std::mem::take(&mut *got.lock().unwrap_or_else(|e| e.into_inner()));
    ex.sort_by_key(|x| x.seq);
    Ok(RrResult {
        sent: sent_count.load(Ordering::Relaxed),
        send_errors: errors,
        exchanges: ex,
        malformed,
        duplicates,
        elapsed_ns: elapsed,
        interrupted: stop.load(Ordering::Relaxed),
    })
}
