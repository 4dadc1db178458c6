//! Stimulus-response (Boie & Niehaus 2007 §3.2): a client sends small requests on a
//! schedule, a server answers each at once.
//!
//! The server (`echo`) reads requests in batches with their kernel RX
//! timestamps and sends each back with three times appended: when its kernel
//! received the request, when the server read it, and when it sent the
//! answer. The client records, for every exchange, its own send time, the
//! kernel RX time and application time of the answer, and the server's
//! three times. So the round trip is measured on one clock (the client's),
//! the server's turnaround on another (the server's), and when both ends
//! share a clock (one host, or after the clock-sync issue's alignment) the
//! two one-way legs follow.

use super::packet::{reply_times, write_reply_times, Header, HEADER, REPLY, REQUEST, RESPONSE};
use super::schedule::{Pattern, Schedule};
use super::sock::{realtime_ns, realtime_offset_ns, recv_stamped, rx_timestamps, Udp};
use crate::error::{ProbeError, Result};
use crate::os::{mono_ns, sleep_until};
use loopscope_trace::{register, Kind};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const BATCH: usize = 32;

#[derive(Debug, Default)]
pub struct EchoResult {
    pub requests: u64,
    pub malformed: u64,
    pub send_errors: u64,
    pub elapsed_ns: u64,
    /// The threads that served (their kernel ids: explain attributes the
    /// server's kernel-to-application waits to them).
    pub tids: Vec<i64>,
}

/// Serve requests until `stop` or `duration_ns`.
pub fn echo(sock: Udp, duration_ns: Option<u64>, stop: Arc<AtomicBool>) -> EchoResult {
    let mut r = EchoResult { tids: vec![unsafe { libc::gettid() } as i64], ..Default::default() };
    let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; 2048]).collect();
    let mut names: Vec<libc::sockaddr_storage> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut ctrl: Vec<[u8; 256]> = vec![[0u8; 256]; BATCH];
    let mut iov: Vec<libc::iovec> = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH];
    let mut msgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut out_iov: Vec<libc::iovec> = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH];
    let mut out: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let t0 = mono_ns();
    while !stop.load(Ordering::Relaxed) && !duration_ns.is_some_and(|d| mono_ns() - t0 >= d as i64) {
        for i in 0..BATCH {
            iov[i] = libc::iovec { iov_base: bufs[i].as_mut_ptr() as *mut libc::c_void, iov_len: bufs[i].len() };
            msgs[i] = unsafe { std::mem::zeroed() };
            msgs[i].msg_hdr.msg_name = &mut names[i] as *mut _ as *mut libc::c_void;
            msgs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_control = ctrl[i].as_mut_ptr() as *mut libc::c_void;
            msgs[i].msg_hdr.msg_controllen = ctrl[i].len();
        }
        let n = unsafe { libc::recvmmsg(sock.raw(), msgs.as_mut_ptr(), BATCH as u32, libc::MSG_WAITFORONE, std::ptr::null_mut()) };
        if n <= 0 {
            continue;
        }
        let urx = realtime_ns();
        let mut k = 0;
        for i in 0..n as usize {
            let len = msgs[i].msg_len as usize;
            let Some(h) = Header::read(&bufs[i][..len]).filter(|h| h.kind == REQUEST) else {
                r.malformed += 1;
                continue;
            };
            let (sw, hw) = unsafe { rx_timestamps(&msgs[i].msg_hdr) };
            Header { kind: REPLY, ..h }.write(&mut bufs[i][..HEADER]);
            write_reply_times(&mut bufs[i][..RESPONSE], if hw != 0 { hw } else { sw }, urx, 0);
            out_iov[k] = libc::iovec { iov_base: bufs[i].as_mut_ptr() as *mut libc::c_void, iov_len: RESPONSE };
            out[k] = unsafe { std::mem::zeroed() };
            out[k].msg_hdr.msg_name = &mut names[i] as *mut _ as *mut libc::c_void;
            out[k].msg_hdr.msg_namelen = msgs[i].msg_hdr.msg_namelen;
            out[k].msg_hdr.msg_iov = &mut out_iov[k];
            out[k].msg_hdr.msg_iovlen = 1;
            k += 1;
        }
        if k == 0 {
            continue;
        }
        let utx = realtime_ns();
        for m in out.iter().take(k) {
            let b = unsafe { std::slice::from_raw_parts_mut((*m.msg_hdr.msg_iov).iov_base as *mut u8, RESPONSE) };
            b[HEADER + 16..HEADER + 24].copy_from_slice(&utx.to_le_bytes());
        }
        let s = unsafe { libc::sendmmsg(sock.raw(), out.as_mut_ptr(), k as u32, 0) };
        if s < 0 {
            r.send_errors += k as u64;
        } else {
            r.requests += s as u64;
            r.send_errors += (k - s as usize) as u64;
        }
    }
    r.elapsed_ns = (mono_ns() - t0) as u64;
    r
}

#[derive(Clone, Debug)]
pub struct RrConfig {
    pub dest: SocketAddr,
    pub pps_num: u128,
    pub pps_den: u128,
    pub pattern: Pattern,
    pub duration_ns: u64,
    pub size: usize,
    pub flow: u32,
    /// How long to wait for the last answers after the last request.
    pub grace_ns: u64,
    pub records: bool,
}

/// One exchange, all CLOCK_REALTIME ns (client times on the client, server times on the server).
#[derive(Clone, Copy, Debug, Default)]
pub struct Exchange {
    pub seq: u64,
    pub sent: i64,
    pub srv_krx: i64,
    pub srv_urx: i64,
    pub srv_utx: i64,
    pub krx: i64,
    pub urx: i64,
}

#[derive(Debug, Default)]
pub struct RrResult {
    pub sent: u64,
    pub send_errors: u64,
    pub exchanges: Vec<Exchange>,
    pub malformed: u64,
    pub duplicates: u64,
    pub elapsed_ns: u64,
    pub interrupted: bool,
}

/// Whether a client's reader stops: when asked to, or `grace` after the
/// last request went out (the answers still on their way get that long).
pub(crate) fn reader_done(stop: &AtomicBool, done_sending: &AtomicBool, finish_by: &mut Option<i64>, grace: i64) -> bool {
    if stop.load(Ordering::Relaxed) {
        return true;
    }
    done_sending.load(Ordering::Relaxed) && mono_ns() >= *finish_by.get_or_insert(mono_ns() + grace)
}

/// The trace entity every client logs its exchanges to (UDP and TCP alike).
pub(crate) fn entity() -> &'static loopscope_trace::Entity {
    register(
        "net",
        "rr",
        Kind::Event,
        "a request/response exchange; payload: seq u64, sent, server kernel RX, server RX, server TX, kernel RX, RX (i64 CLOCK_REALTIME ns)",
        None,
    )
    .expect("entity")
}

impl Exchange {
    /// One `net/rr` event with the exchange's seven numbers as its payload.
    pub(crate) fn log(&self, ent: &loopscope_trace::Entity) {
        let mut payload = [0u8; 56];
        for (i, v) in [self.seq as i64, self.sent, self.srv_krx, self.srv_urx, self.srv_utx, self.krx, self.urx].iter().enumerate() {
            payload[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        ent.event_payload(self.seq as u32, &payload);
    }
}

pub fn client(cfg: &RrConfig, stop: Arc<AtomicBool>) -> Result<RrResult> {
    let sock = Arc::new(Udp::connect(&cfg.dest, 1 << 20)?);
    sock.enable_rx_timestamps()?;
    sock.set_read_timeout_ms(20);
    let rt_off = realtime_offset_ns();
    let size = cfg.size.max(HEADER);
    let ent = entity();
    let done_sending = Arc::new(AtomicBool::new(false));
    let sent_count = Arc::new(AtomicU64::new(0));
    let got: Arc<Mutex<Vec<Exchange>>> = Arc::new(Mutex::new(Vec::new()));
    let (rs, rd, rg, rst, records) = (sock.clone(), done_sending.clone(), got.clone(), stop.clone(), cfg.records);
    let grace = cfg.grace_ns as i64;
    let reader = std::thread::Builder::new()
        .name("ls-rr-recv".into())
        .spawn(move || {
            loopscope_trace::prepare_thread();
            let mut buf = vec![0u8; 2048];
            let mut ctrl = [0u8; 256];
            let (mut malformed, mut dups) = (0u64, 0u64);
            let mut seen = std::collections::HashSet::new();
            let mut finish_by: Option<i64> = None;
            loop {
                if reader_done(&rst, &rd, &mut finish_by, grace) {
                    break;
                }
                let Some(got) = recv_stamped(rs.raw(), &mut buf, &mut ctrl).filter(|r| r.len > 0) else {
                    continue;
                };
                let urx = realtime_ns();
                let n = got.len;
                let Some(h) = Header::read(&buf[..n]).filter(|h| h.kind == REPLY) else {
                    malformed += 1;
                    continue;
                };
                if !seen.insert(h.seq) {
                    dups += 1;
                    continue;
                }
                let (skrx, surx, sutx) = reply_times(&buf[..n]);
                let x = Exchange { seq: h.seq, sent: h.sent_ns, srv_krx: skrx, srv_urx: surx, srv_utx: sutx, krx: got.krx, urx };
                if records {
                    x.log(ent);
                }
                rg.lock().unwrap_or_else(|e| e.into_inner()).push(x);
            }
            (malformed, dups)
        })
        .map_err(ProbeError::os("cannot start the receiving thread"))?;
    let mut buf = vec![0u8; size];
    let t0 = mono_ns() + 2_000_000;
    let mut errors = 0u64;
    for (k, off) in Schedule::new(cfg.pattern.clone(), cfg.pps_num, cfg.pps_den, None, Some(cfg.duration_ns)).enumerate() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let d = t0 + off as i64;
        sleep_until(d);
        let now = mono_ns();
        Header { kind: REQUEST, flow: cfg.flow, worker: 0, seq: k as u64, sched_ns: d + rt_off, sent_ns: now + rt_off }.write(&mut buf[..HEADER]);
        if unsafe { libc::send(sock.raw(), buf.as_ptr() as *const libc::c_void, size, 0) } < 0 {
            errors += 1;
        } else {
            sent_count.fetch_add(1, Ordering::Relaxed);
        }
    }
    let elapsed = (mono_ns() - t0) as u64;
    done_sending.store(true, Ordering::Relaxed);
    let (malformed, duplicates) = reader.join().unwrap_or((0, 0));
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
