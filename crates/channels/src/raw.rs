//! Ping-pong across two hosts, through channels and through raw sockets,
//! for `loopscope bench channels`: the client sends an item of `size`
//! bytes, the server sends it back, `rounds` times per size; each round
//! trip is timed on the client.
//!
//! Raw TCP frames each message with an 8-byte length; raw UDP splits it
//! into datagrams of `frag` payload bytes, each with a 16-byte header
//! (round, index, count, total), the least a receiver needs to put an item
//! back together. The channel runs carry the channel header (40 bytes per
//! frame or datagram) and go through put, the hub's pump and get.

use crate::chan::{Full, Which};
use crate::error::{NetError, Result as NetResult};
use crate::hub::{Hub, RemoteProducer, Transport};
use crate::wire;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const RAW_HDR: usize = 16;

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One size's result on the client.
pub struct Rounds {
    pub size: usize,
    pub rtt_ns: Vec<u64>,
    pub elapsed_ns: u64,
    pub timeouts: u64,
}

fn raw_udp_send(fd: i32, round: u32, data: &[u8], frag: usize, to: Option<&SocketAddr>) -> NetResult<()> {
    let count = data.len().div_ceil(frag).max(1);
    let hdrs: Vec<[u8; RAW_HDR]> = (0..count)
        .map(|idx| {
            let mut h = [0u8; RAW_HDR];
            h[0..4].copy_from_slice(&round.to_le_bytes());
            h[4..8].copy_from_slice(&(idx as u32).to_le_bytes());
            h[8..12].copy_from_slice(&(count as u32).to_le_bytes());
            h[12..16].copy_from_slice(&(data.len() as u32).to_le_bytes());
            h
        })
        .collect();
    let heads: Vec<&[u8]> = hdrs.iter().map(|x| &x[..]).collect();
    let dest = to.map(loopscope_os::sockaddr);
    wire::send_fragments(fd, &heads, data, frag, dest.as_ref().map(|(s, _)| s), dest.map_or(0, |(_, l)| l))
}

/// Receive one raw UDP message (all its datagrams); None on timeout.
fn raw_udp_recv(u: &UdpSocket, buf: &mut Vec<u8>, dgram: &mut [u8], deadline: Instant) -> Option<(u32, SocketAddr)> {
    let mut got = 0usize;
    let mut want = usize::MAX;
    let mut round = u32::MAX;
    let mut from = None;
    while got < want {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let _ = u.set_read_timeout(Some(left));
        let (n, f) = u.recv_from(dgram).ok()?;
        if n < RAW_HDR {
            continue;
        }
        let r = u32::from_le_bytes(dgram[0..4].try_into().unwrap());
        let idx = u32::from_le_bytes(dgram[4..8].try_into().unwrap()) as usize;
        let count = u32::from_le_bytes(dgram[8..12].try_into().unwrap()) as usize;
        let total = u32::from_le_bytes(dgram[12..16].try_into().unwrap()) as usize;
        if r != round {
            round = r;
            got = 0;
            want = count;
            buf.resize(total, 0);
        }
        let frag = if count > 1 { (total).div_ceil(count) } else { total };
        let off = idx * frag.max(1);
        let k = n - RAW_HDR;
        if off + k <= buf.len() {
            buf[off..off + k].copy_from_slice(&dgram[RAW_HDR..n]);
        }
        got += 1;
        from = Some(f);
    }
    Some((round, from?))
}

/// The raw echo server: until `stop`.
pub fn raw_serve(bind: SocketAddr, transport: Transport, frag: usize, stop: &AtomicBool) -> NetResult<u64> {
    let mut echoed = 0u64;
    match transport {
        Transport::Tcp => {
            let l = TcpListener::bind(bind).map_err(NetError::os(format!("cannot listen on {bind}")))?;
            l.set_nonblocking(true).map_err(NetError::os("set_nonblocking"))?;
            while !stop.load(Ordering::Relaxed) {
                let (mut s, _) = match l.accept() {
                    Ok(x) => x,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                s.set_nonblocking(false).map_err(NetError::os("set_nonblocking"))?;
                let _ = s.set_nodelay(true);
                let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                let mut buf = Vec::new();
                loop {
                    let mut lb = [0u8; 8];
                    match s.read_exact(&mut lb) {
                        Ok(()) => {}
                        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                            if stop.load(Ordering::Relaxed) {
                                return Ok(echoed);
                            }
                            continue;
                        }
                        Err(_) => break,
                    }
                    let n = u64::from_le_bytes(lb) as usize;
                    buf.resize(n, 0);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                    if s.read_exact(&mut buf).is_err() {
                        break;
                    }
                    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                    wire::send_all(s.as_raw_fd(), &[&lb, &buf], Instant::now() + Duration::from_secs(10))?;
                    echoed += 1;
                }
            }
        }
        Transport::Udp => {
            let u = UdpSocket::bind(bind).map_err(NetError::os(format!("cannot listen on {bind}")))?;
            loopscope_os::set_buffers(u.as_raw_fd(), 8 << 20);
            let mut buf = Vec::new();
            let mut dgram = vec![0u8; 65536];
            while !stop.load(Ordering::Relaxed) {
                if let Some((round, from)) = raw_udp_recv(&u, &mut buf, &mut dgram, Instant::now() + Duration::from_millis(200)) {
                    raw_udp_send(u.as_raw_fd(), round, &buf, frag, Some(&from))?;
                    echoed += 1;
                }
            }
        }
    }
    Ok(echoed)
}

/// The channel echo server: hosts `ping`, puts every item back into the
/// client's `pong`, until `stop`.
pub fn chan_serve(bind: SocketAddr, reply_to: SocketAddr, transport: Transport, frag: usize, stop: &AtomicBool) -> NetResult<u64> {
    let hub = Hub::new(frag);
    hub.listen(bind)?;
    let ping = hub.create("ping", 64, Full::Block, 64 << 20)?;
    let me = ping.attach(false);
    let mut back: Option<RemoteProducer> = None;
    let mut echoed = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let item = match ping.get(me, Which::Next, false, Duration::from_millis(200)) {
            Ok(i) => i,
            Err(crate::ChanError::Timeout) => continue,
            Err(e) => return Err(e.into()),
        };
        if back.is_none() {
            back = Some(RemoteProducer::connect(reply_to, "pong", transport, frag, Duration::from_secs(5))?);
        }
        back.as_mut().unwrap().put(item.ts, &item.data, Duration::from_secs(10))?;
        ping.consume(me, item.ts);
        echoed += 1;
    }
    Ok(echoed)
}

/// One end that times round trips, kept connected between blocks so raw
/// and channel blocks can alternate in one process.
pub enum Client {
    RawTcp { s: TcpStream, back: Vec<u8> },
    RawUdp { u: UdpSocket, buf: Vec<u8>, dgram: Vec<u8>, round: u32, frag: usize },
    Chan { _hub: Hub, pong: std::sync::Arc<crate::Channel>, me: u32, prod: RemoteProducer, ts: u64 },
}

impl Client {
    pub fn raw(dest: SocketAddr, transport: Transport, frag: usize) -> NetResult<Client> {
        Ok(match transport {
            Transport::Tcp => {
                let s = TcpStream::connect_timeout(&dest, Duration::from_secs(5)).map_err(NetError::os(format!("cannot connect to {dest}")))?;
                let _ = s.set_nodelay(true);
                s.set_read_timeout(Some(Duration::from_secs(10))).map_err(NetError::os("SO_RCVTIMEO"))?;
                Client::RawTcp { s, back: Vec::new() }
            }
            Transport::Udp => {
                let u = UdpSocket::bind(if dest.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).map_err(NetError::os("binding the UDP client"))?;
                u.connect(dest).map_err(NetError::os(format!("cannot connect to {dest}")))?;
                loopscope_os::set_buffers(u.as_raw_fd(), 8 << 20);
                Client::RawUdp { u, buf: Vec::new(), dgram: vec![0u8; 65536], round: 0, frag }
            }
        })
    }

    /// Hosts `pong` at `bind`, puts into the server's `ping`.
    pub fn chan(bind: SocketAddr, dest: SocketAddr, transport: Transport, frag: usize) -> NetResult<Client> {
        let hub = Hub::new(frag);
        hub.listen(bind)?;
        let pong = hub.create("pong", 64, Full::Block, 64 << 20)?;
        let me = pong.attach(false);
        let prod = RemoteProducer::connect(dest, "ping", transport, frag, Duration::from_secs(5))?;
        Ok(Client::Chan { _hub: hub, pong, me, prod, ts: 0 })
    }

    fn once(&mut self, data: &[u8]) -> NetResult<bool> {
        match self {
            Client::RawTcp { s, back } => {
                wire::send_all(s.as_raw_fd(), &[&(data.len() as u64).to_le_bytes(), data], Instant::now() + Duration::from_secs(10))?;
                let mut lb = [0u8; 8];
                back.resize(data.len(), 0);
                s.read_exact(&mut lb).and_then(|_| s.read_exact(back)).map_err(NetError::os("raw tcp echo"))?;
                Ok(true)
            }
            Client::RawUdp { u, buf, dgram, round, frag } => {
                *round += 1;
                raw_udp_send(u.as_raw_fd(), *round, data, *frag, None)?;
                Ok(raw_udp_recv(u, buf, dgram, Instant::now() + Duration::from_secs(1)).is_some())
            }
            Client::Chan { pong, me, prod, ts, .. } => {
                *ts += 1;
                prod.put(*ts, data, Duration::from_secs(10))?;
                Ok(pong.get(*me, Which::At(*ts), true, Duration::from_secs(1)).is_ok())
            }
        }
    }

    /// `warmup` untimed and `n` timed round trips of `size` bytes.
    pub fn rounds(&mut self, size: usize, n: usize, warmup: usize) -> NetResult<Rounds> {
        let data = vec![0x5au8; size];
        let mut r = Rounds { size, rtt_ns: Vec::with_capacity(n), elapsed_ns: 0, timeouts: 0 };
        let mut t_start = now_ns();
        for i in 0..warmup + n {
            if i == warmup {
                t_start = now_ns();
            }
            let t0 = now_ns();
            let ok = self.once(&data)?;
            if !ok {
                r.timeouts += 1;
            } else if i >= warmup {
                r.rtt_ns.push(now_ns() - t0);
            }
        }
        r.elapsed_ns = now_ns() - t_start;
        Ok(r)
    }
}
