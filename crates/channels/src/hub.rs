//! A hub: the channels a process hosts, and the network that reaches them.
//!
//! A hub listens on TCP and UDP (one port number for both). Remote
//! producers open a channel by name and send items; remote consumers attach
//! by name and are sent every item put from then on (pushed: the item
//! crosses the network once, when it is put). Over TCP the owner keeps the
//! item until the remote consumer says it consumed it (the consumer's
//! mirror reports every item that leaves it), so the reclaim rule holds
//! across hosts; over UDP it is fire-and-forget (reclaimed once sent) and a
//! lost fragment loses the item, counted on the receiving side.
//!
//! There is no receiving thread. Whoever waits on a channel of the hub (a
//! `get`, a `put` into a full channel) pumps the network itself: one
//! thread at a time reads the sockets, puts what arrived into its channels
//! and returns as soon as the item it waits for is there. So an item goes
//! from the socket to the consumer with no hand-off between threads, the
//! cost a raw `recv` loop has. A hub nobody waits on (a relay) runs
//! `pump_forever` on a thread of its own. A remote put into a full channel
//! never blocks the pumping thread: it is refused and counted.

use crate::chan::{Channel, Full, Waiter};
use crate::inst;
use crate::wire::{self, Header, Kind, HDR};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Udp,
}

impl Transport {
    pub fn parse(s: &str) -> Result<Transport, String> {
        match s {
            "tcp" => Ok(Transport::Tcp),
            "udp" => Ok(Transport::Udp),
            _ => Err(format!("transport {s:?}: expected tcp or udp")),
        }
    }
}

/// What the network side of a hub counted.
#[derive(Default, Clone, Debug)]
pub struct NetStats {
    pub items_in: u64,
    pub bytes_in: u64,
    pub datagrams_in: u64,
    /// UDP items a fragment of which never came
    pub incomplete: u64,
    /// items whose sender's sequence shows a gap (never seen at all)
    pub missing: u64,
    /// remote puts refused: full channel, duplicate timestamp, too large
    pub refused: u64,
    pub malformed: u64,
    pub conns_accepted: u64,
    pub conns_lost: u64,
    pub send_errors: u64,
}

const TOK_LISTEN: u64 = 1;
const TOK_UDP: u64 = 2;
const TOK_EVENT: u64 = 3;
const TOK_FIRST: u64 = 16;

/// Where a source's items go: the hub's channels by id (an owner), or one
/// mirror channel (a remote consumer's end).
#[derive(Clone)]
enum Sink {
    Owner,
    Mirror(Arc<Channel>),
}

struct Conn {
    stream: TcpStream,
    sink: Sink,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    body: Option<(Header, Vec<u8>, usize)>,
    /// (channel id, consumer id) of the consumers this connection attached
    subs: Vec<(u32, u32)>,
    peer: String,
}

struct Partial {
    h: Header,
    data: Vec<u8>,
    got: u32,
    seen: Vec<bool>,
    first: Instant,
}

struct Pump {
    listener: Option<TcpListener>,
    udp: Option<(UdpSocket, Sink)>,
    conns: HashMap<u64, Conn>,
    next_token: u64,
    reasm: HashMap<(Src, u32), Partial>,
    last_seq: HashMap<Src, u32>,
    dgram: Vec<u8>,
}

enum SubDest {
    Tcp {
        fd: Mutex<TcpStream>,
    },
    Udp {
        fd: RawFd,
        to: libc::sockaddr_storage,
        len: u32,
        peer: SocketAddr,
    },
}

struct Sub {
    consumer: Option<u32>,
    dest: SubDest,
    dead: AtomicBool,
    seq: AtomicU32,
}

pub struct HubInner {
    chans: Mutex<Vec<Arc<Channel>>>,
    names: Mutex<HashMap<String, u32>>,
    subs: Mutex<HashMap<u32, Vec<Arc<Sub>>>>,
    pump: Mutex<Pump>,
    holder: AtomicI32,
    efd: RawFd,
    epfd: RawFd,
    pub frag: usize,
    net: Mutex<NetStats>,
    stop: AtomicBool,
    pub addr: Mutex<Option<SocketAddr>>,
}

impl Drop for HubInner {
    fn drop(&mut self) {
        unsafe {
            libc::close(self.efd);
            libc::close(self.epfd);
        }
    }
}

#[derive(Clone)]
pub struct Hub {
    pub(crate) inner: Arc<HubInner>,
}

fn tid() -> i32 {
    thread_local! {
        static TID: i32 = unsafe { libc::syscall(libc::SYS_gettid) as i32 };
    }
    TID.with(|t| *t)
}

/// A TCP connection's socket stays blocking, with timeouts: epoll says
/// when a frame has begun to arrive, and reading the rest of it then waits
/// in `read` as a raw receiver would (one system call per chunk, not a
/// read that finds nothing, an epoll_wait and a read again).
fn conn_mode(s: &TcpStream) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))
}

fn ep_add(epfd: RawFd, fd: RawFd, tok: u64) -> Result<(), String> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: tok,
    };
    if unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        return Err(format!("epoll_ctl: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// A datagram's sender, as a map key.
type Src = (u128, u16);

fn src_of(a: &libc::sockaddr_storage) -> Src {
    if a.ss_family as i32 == libc::AF_INET6 {
        let s6 = unsafe { &*(a as *const _ as *const libc::sockaddr_in6) };
        (
            u128::from_be_bytes(s6.sin6_addr.s6_addr),
            u16::from_be(s6.sin6_port),
        )
    } else {
        let s4 = unsafe { &*(a as *const _ as *const libc::sockaddr_in) };
        (
            u32::from_be(s4.sin_addr.s_addr) as u128,
            u16::from_be(s4.sin_port),
        )
    }
}

fn set_bufs(fd: RawFd, bytes: i32) {
    loopscope_os::set_buffers(fd, bytes as usize)
}

impl Default for Hub {
    fn default() -> Self {
        Self::new(1400)
    }
}

impl Hub {
    /// `frag`: UDP payload bytes per datagram (1400 fits a 1500-byte MTU).
    pub fn new(frag: usize) -> Hub {
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        let _ = ep_add(epfd, efd, TOK_EVENT);
        Hub {
            inner: Arc::new(HubInner {
                chans: Mutex::new(Vec::new()),
                names: Mutex::new(HashMap::new()),
                subs: Mutex::new(HashMap::new()),
                pump: Mutex::new(Pump {
                    listener: None,
                    udp: None,
                    conns: HashMap::new(),
                    next_token: TOK_FIRST,
                    reasm: HashMap::new(),
                    last_seq: HashMap::new(),
                    dgram: vec![0u8; 65536],
                }),
                holder: AtomicI32::new(0),
                efd,
                epfd,
                frag: frag.clamp(64, 65000),
                net: Mutex::new(NetStats::default()),
                stop: AtomicBool::new(false),
                addr: Mutex::new(None),
            }),
        }
    }

    /// Listen on TCP and UDP at `bind` (port 0: any free port, the same for both).
    pub fn listen(&self, bind: SocketAddr) -> Result<SocketAddr, String> {
        let l =
            TcpListener::bind(bind).map_err(|e| format!("cannot listen on {bind} (tcp): {e}"))?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        let u = UdpSocket::bind(addr).map_err(|e| format!("cannot listen on {addr} (udp): {e}"))?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        u.set_nonblocking(true).map_err(|e| e.to_string())?;
        set_bufs(u.as_raw_fd(), 8 << 20);
        ep_add(self.inner.epfd, l.as_raw_fd(), TOK_LISTEN)?;
        ep_add(self.inner.epfd, u.as_raw_fd(), TOK_UDP)?;
        let mut p = self.inner.pump.lock().unwrap_or_else(|e| e.into_inner());
        p.listener = Some(l);
        p.udp = Some((u, Sink::Owner));
        *self.inner.addr.lock().unwrap() = Some(addr);
        Ok(addr)
    }

    /// Host a channel named `name` on this hub.
    pub fn create(
        &self,
        name: &str,
        capacity: usize,
        full: Full,
        max_item: usize,
    ) -> Result<Arc<Channel>, String> {
        let mut names = self.inner.names.lock().unwrap_or_else(|e| e.into_inner());
        if names.contains_key(name) {
            return Err(format!(
                "a channel named {name:?} already exists on this hub"
            ));
        }
        let c = Channel::new(name, capacity, full, max_item);
        let mut chans = self.inner.chans.lock().unwrap_or_else(|e| e.into_inner());
        chans.push(c.clone());
        let id = chans.len() as u32;
        names.insert(name.into(), id);
        *c.waiter.lock().unwrap() = Some(Arc::new(HubWaiter(Arc::downgrade(&self.inner))));
        let weak = Arc::downgrade(&self.inner);
        *c.on_put.lock().unwrap() = Some(Arc::new(move |item: &Arc<crate::chan::Item>| {
            if let Some(h) = weak.upgrade() {
                h.send_to_subs(id, item);
            }
        }));
        Ok(c)
    }

    pub fn channel(&self, name: &str) -> Option<Arc<Channel>> {
        let id = *self
            .inner
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)?;
        self.inner
            .chans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id as usize - 1)
            .cloned()
    }

    pub fn net_stats(&self) -> NetStats {
        self.inner
            .net
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Pump until `stop` is set (for a hub nobody waits on: a relay).
    pub fn pump_forever(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) && !self.inner.stop.load(Ordering::Relaxed) {
            if self.inner.try_pump(Duration::from_millis(20)).is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Pump once for at most `max` (callers that wait on the hub itself,
    /// like a camera waiting for its next frame time while commands come
    /// in); logged as blocking (`chan/block`).
    pub fn pump(&self, max: Duration) -> Option<bool> {
        let t0 = loopscope_trace::now();
        let r = self.inner.try_pump(max);
        inst::block(t0);
        r
    }

    pub fn close(&self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        for c in self
            .inner
            .chans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            c.close();
        }
    }

    /// A mirror for a remote consumer: items arriving on `fd` go to `mirror`.
    fn adopt(
        &self,
        stream: Option<TcpStream>,
        udp: Option<UdpSocket>,
        mirror: Arc<Channel>,
    ) -> Result<(), String> {
        *mirror.waiter.lock().unwrap() = Some(Arc::new(HubWaiter(Arc::downgrade(&self.inner))));
        let mut p = self.inner.pump.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = stream {
            conn_mode(&s).map_err(|e| e.to_string())?;
            let tok = p.next_token;
            p.next_token += 1;
            ep_add(self.inner.epfd, s.as_raw_fd(), tok)?;
            let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            p.conns.insert(
                tok,
                Conn {
                    stream: s,
                    sink: Sink::Mirror(mirror),
                    buf: vec![0u8; 65536].into_boxed_slice(),
                    start: 0,
                    end: 0,
                    body: None,
                    subs: Vec::new(),
                    peer,
                },
            );
        } else if let Some(u) = udp {
            u.set_nonblocking(true).map_err(|e| e.to_string())?;
            ep_add(self.inner.epfd, u.as_raw_fd(), TOK_UDP)?;
            p.udp = Some((u, Sink::Mirror(mirror)));
        }
        Ok(())
    }
}

struct HubWaiter(Weak<HubInner>);

impl Waiter for HubWaiter {
    fn try_pump(&self, max: Duration) -> Option<bool> {
        self.0.upgrade()?.try_pump(max)
    }

    fn wake(&self) {
        if let Some(h) = self.0.upgrade() {
            let who = h.holder.load(Ordering::Relaxed);
            if who != 0 && who != tid() {
                let one: u64 = 1;
                unsafe { libc::write(h.efd, &one as *const u64 as *const libc::c_void, 8) };
            }
        }
    }
}

impl HubInner {
    fn chan(&self, id: u32) -> Option<Arc<Channel>> {
        if id == 0 {
            return None;
        }
        self.chans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id as usize - 1)
            .cloned()
    }

    fn count(&self, f: impl FnOnce(&mut NetStats)) {
        f(&mut self.net.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn try_pump(&self, max: Duration) -> Option<bool> {
        let mut p = self.pump.try_lock().ok()?;
        self.holder.store(tid(), Ordering::Relaxed);
        let r = self.pump_locked(&mut p, max);
        self.holder.store(0, Ordering::Relaxed);
        Some(r)
    }

    fn pump_locked(&self, p: &mut Pump, max: Duration) -> bool {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 32];
        let ms = max.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let n = unsafe { libc::epoll_wait(self.epfd, evs.as_mut_ptr(), 32, ms) };
        if n <= 0 {
            return false;
        }
        let mut any = false;
        for ev in &evs[..n as usize] {
            match ev.u64 {
                TOK_EVENT => {
                    let mut v: u64 = 0;
                    unsafe { libc::read(self.efd, &mut v as *mut u64 as *mut libc::c_void, 8) };
                }
                TOK_LISTEN => self.accept(p),
                TOK_UDP => any |= self.read_udp(p),
                tok => any |= self.read_conn(p, tok),
            }
        }
        if !p.reasm.is_empty() {
            self.expire(p);
        }
        any
    }

    fn accept(&self, p: &mut Pump) {
        let Some(l) = p.listener.as_ref() else { return };
        while let Ok((s, peer)) = l.accept() {
            let _ = s.set_nodelay(true);
            let _ = conn_mode(&s);
            let tok = p.next_token;
            p.next_token += 1;
            if ep_add(self.epfd, s.as_raw_fd(), tok).is_ok() {
                p.conns.insert(
                    tok,
                    Conn {
                        stream: s,
                        sink: Sink::Owner,
                        buf: vec![0u8; 65536].into_boxed_slice(),
                        start: 0,
                        end: 0,
                        body: None,
                        subs: Vec::new(),
                        peer: peer.to_string(),
                    },
                );
                self.count(|n| n.conns_accepted += 1);
            }
        }
    }

    /// Read what a connection has; frames complete go where they belong.
    /// Reads stop once a frame is complete and nothing is half-read (the
    /// epoll is level-triggered: what is left comes back at once), so an
    /// item costs one read, not one more that finds nothing.
    fn read_conn(&self, p: &mut Pump, tok: u64) -> bool {
        let Some(c) = p.conns.get_mut(&tok) else {
            return false;
        };
        let mut any = false;
        let mut closed = false;
        let mut frames: Vec<(Header, Vec<u8>)> = Vec::new();
        loop {
            if let Some((_, body, filled)) = c.body.as_mut() {
                let take = (c.end - c.start).min(body.len() - *filled);
                body[*filled..*filled + take].copy_from_slice(&c.buf[c.start..c.start + take]);
                c.start += take;
                *filled += take;
                if *filled < body.len() {
                    let t0 = loopscope_trace::now();
                    match c.stream.read(&mut body[*filled..]) {
                        Ok(0) => {
                            closed = true;
                            break;
                        }
                        Ok(k) => {
                            *filled += k;
                            inst::recv(t0);
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) =>
                        {
                            break
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => {
                            closed = true;
                            break;
                        }
                    }
                }
                if *filled == body.len() {
                    let (h, body, _) = c.body.take().unwrap();
                    frames.push((h, body));
                }
                continue;
            }
            if c.end - c.start >= HDR {
                let Some(h) = Header::read(&c.buf[c.start..c.start + HDR]) else {
                    self.count(|n| n.malformed += 1);
                    closed = true;
                    break;
                };
                c.start += HDR;
                let t0 = loopscope_trace::now();
                let body = crate::pool::take(h.len as usize);
                inst::alloc(t0);
                c.body = Some((h, body, 0));
                continue;
            }
            if !frames.is_empty() && c.end == c.start {
                break;
            }
            // need more header bytes: keep the partial one at the front
            if c.start > 0 {
                c.buf.copy_within(c.start..c.end, 0);
                c.end -= c.start;
                c.start = 0;
            }
            let end = c.end;
            match c.stream.read(&mut c.buf[end..]) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(k) => c.end += k,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        let sink = c.sink.clone();
        let fd = c.stream.as_raw_fd();
        for (h, body) in frames {
            any |= self.frame(p, Some(tok), fd, &sink, h, body, None);
        }
        if closed {
            if let Some(c) = p.conns.remove(&tok) {
                unsafe {
                    libc::epoll_ctl(
                        self.epfd,
                        libc::EPOLL_CTL_DEL,
                        c.stream.as_raw_fd(),
                        std::ptr::null_mut(),
                    )
                };
                let lost = !c.subs.is_empty() || matches!(c.sink, Sink::Mirror(_));
                for (chan, consumer) in &c.subs {
                    self.drop_sub(*chan, Some(*consumer));
                }
                if let Sink::Mirror(m) = &c.sink {
                    m.close();
                }
                if lost {
                    self.count(|n| n.conns_lost += 1);
                }
                let _ = c.peer;
            }
        }
        any
    }

    /// Read the UDP socket's datagrams, up to 16 per recvmmsg, and put items
    /// back together.
    fn read_udp(&self, p: &mut Pump) -> bool {
        const BATCH: usize = 16;
        const DG: usize = 65536;
        let mut any = false;
        let mut datagrams = 0u64;
        let mut malformed = 0u64;
        if p.dgram.len() < BATCH * DG {
            p.dgram.resize(BATCH * DG, 0);
        }
        loop {
            let Some((u, sink)) = p.udp.as_ref() else {
                break;
            };
            let sink = sink.clone();
            let fd = u.as_raw_fd();
            let mut from: [libc::sockaddr_storage; BATCH] = unsafe { std::mem::zeroed() };
            let mut iov: Vec<libc::iovec> = (0..BATCH)
                .map(|i| libc::iovec {
                    iov_base: p.dgram[i * DG..].as_mut_ptr() as *mut libc::c_void,
                    iov_len: DG,
                })
                .collect();
            let mut msgs: Vec<libc::mmsghdr> = (0..BATCH)
                .map(|i| {
                    let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                    m.msg_hdr.msg_iov = &mut iov[i];
                    m.msg_hdr.msg_iovlen = 1;
                    m.msg_hdr.msg_name = &mut from[i] as *mut _ as *mut libc::c_void;
                    m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
                    m
                })
                .collect();
            let t0 = loopscope_trace::now();
            let n = unsafe {
                libc::recvmmsg(
                    fd,
                    msgs.as_mut_ptr(),
                    BATCH as u32,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n <= 0 {
                break;
            }
            datagrams += n as u64;
            let mut t_seg = t0;
            for i in 0..n as usize {
                let len = msgs[i].msg_len as usize;
                let flen = msgs[i].msg_hdr.msg_namelen;
                let dg = &p.dgram[i * DG..i * DG + len];
                let Some(h) = Header::read(dg) else {
                    malformed += 1;
                    continue;
                };
                let src = src_of(&from[i]);
                if h.frag_count <= 1 {
                    let body = dg[HDR..].to_vec();
                    // messaging up to here; the put that follows is the runtime's
                    inst::recv(t_seg);
                    self.note_seq(p, src, h);
                    any |= self.frame(p, None, fd, &sink, h, body, Some((from[i], flen)));
                    t_seg = loopscope_trace::now();
                    continue;
                }
                let key = (src, h.seq);
                let frag = self.frag;
                let part = p.reasm.entry(key).or_insert_with(|| Partial {
                    h,
                    data: crate::pool::take(h.len as usize),
                    got: 0,
                    seen: vec![false; h.frag_count as usize],
                    first: Instant::now(),
                });
                let k = h.frag_idx as usize;
                let off = k * frag;
                let payload = &p.dgram[i * DG + HDR..i * DG + len];
                if k < part.seen.len() && !part.seen[k] && off + payload.len() <= part.data.len() {
                    part.seen[k] = true;
                    part.got += 1;
                    part.data[off..off + payload.len()].copy_from_slice(payload);
                }
                if part.got as usize == part.seen.len() {
                    inst::recv(t_seg);
                    let part = p.reasm.remove(&key).unwrap();
                    self.note_seq(p, src, part.h);
                    any |= self.frame(p, None, fd, &sink, part.h, part.data, Some((from[i], flen)));
                    t_seg = loopscope_trace::now();
                }
            }
            inst::recv(t_seg);
            if (n as usize) < BATCH {
                break;
            }
        }
        self.count(|s| {
            s.datagrams_in += datagrams;
            s.malformed += malformed;
        });
        any
    }

    /// Count items a sender numbered but that never arrived (and partial
    /// ones older than a newer complete item).
    fn note_seq(&self, p: &mut Pump, src: Src, h: Header) {
        if !matches!(Kind::of(h.kind), Some(Kind::Put) | Some(Kind::Item)) {
            return;
        }
        let last = p.last_seq.insert(src, h.seq);
        if let Some(l) = last {
            if h.seq > l + 1 {
                let gap = (h.seq - l - 1) as u64;
                // those partly received are counted as incomplete, the rest as missing
                let partial: Vec<(Src, u32)> = p
                    .reasm
                    .keys()
                    .filter(|(k, s)| *k == src && *s < h.seq)
                    .cloned()
                    .collect();
                let np = partial.len() as u64;
                for k in partial {
                    p.reasm.remove(&k);
                }
                self.count(|n| {
                    n.incomplete += np;
                    n.missing += gap.saturating_sub(np);
                });
            }
        }
    }

    fn expire(&self, p: &mut Pump) {
        let old: Vec<(Src, u32)> = p
            .reasm
            .iter()
            .filter(|(_, v)| v.first.elapsed() > Duration::from_secs(1))
            .map(|(k, _)| *k)
            .collect();
        if !old.is_empty() {
            let n = old.len() as u64;
            for k in old {
                p.reasm.remove(&k);
            }
            self.count(|s| s.incomplete += n);
        }
    }

    fn reply(
        &self,
        fd: RawFd,
        to: Option<(libc::sockaddr_storage, u32)>,
        h: Header,
        payload: &[u8],
    ) {
        let hb = h.bytes();
        let r = match to {
            None => wire::send_all(fd, &[&hb, payload], Instant::now() + Duration::from_secs(1)),
            Some((a, l)) => wire::send_udp(fd, h, payload, self.frag, Some(&a), l),
        };
        if r.is_err() {
            self.count(|n| n.send_errors += 1);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn frame(
        &self,
        p: &mut Pump,
        tok: Option<u64>,
        fd: RawFd,
        sink: &Sink,
        h: Header,
        body: Vec<u8>,
        from: Option<(libc::sockaddr_storage, u32)>,
    ) -> bool {
        let Some(kind) = Kind::of(h.kind) else {
            self.count(|n| n.malformed += 1);
            return false;
        };
        match (kind, sink) {
            (Kind::Put, Sink::Owner) | (Kind::Item, Sink::Mirror(_)) => {
                let ch = match sink {
                    Sink::Mirror(m) => Some(m.clone()),
                    Sink::Owner => self.chan(h.chan),
                };
                let len = body.len() as u64;
                self.count(|n| {
                    n.items_in += 1;
                    n.bytes_in += len;
                });
                inst::arrived(ch.as_ref().and_then(|c| c.ents), h.ts, h.sent_ns);
                match ch {
                    Some(c) => {
                        // never block the pumping thread: a full channel refuses (counted)
                        if c.put(h.ts, body, Duration::ZERO).is_err() {
                            self.count(|n| n.refused += 1);
                        }
                        true
                    }
                    None => {
                        self.count(|n| n.malformed += 1);
                        false
                    }
                }
            }
            (Kind::Open, Sink::Owner) | (Kind::Attach, Sink::Owner) => {
                let name = String::from_utf8_lossy(&body).to_string();
                let id = self
                    .names
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&name)
                    .copied();
                let Some(id) = id else {
                    let msg = format!("no channel named {name:?} on this hub");
                    self.reply(
                        fd,
                        from,
                        Header::new(Kind::Error, 0, h.ts, msg.len()),
                        msg.as_bytes(),
                    );
                    return false;
                };
                if kind == Kind::Open {
                    self.reply(fd, from, Header::new(Kind::Opened, id, h.ts, 0), &[]);
                    return false;
                }
                let c = self.chan(id).unwrap();
                let (consumer, dest) = match from {
                    None => {
                        let cid = c.attach(false);
                        let Some(conn) = tok.and_then(|t| p.conns.get_mut(&t)) else {
                            return false;
                        };
                        conn.subs.push((id, cid));
                        let dup = conn.stream.try_clone();
                        let Ok(dup) = dup else { return false };
                        (
                            Some(cid),
                            SubDest::Tcp {
                                fd: Mutex::new(dup),
                            },
                        )
                    }
                    Some((a, l)) => {
                        let peer = peer_of(&a).unwrap_or_else(|| "0.0.0.0:0".parse().unwrap());
                        let subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
                        if subs.get(&id).is_some_and(|v| {
                            v.iter().any(|s| {
                                matches!(&s.dest, SubDest::Udp { peer: q, .. } if *q == peer)
                                    && !s.dead.load(Ordering::Relaxed)
                            })
                        }) {
                            drop(subs);
                            // a retried attach: answer again
                            let mut r = Header::new(Kind::Attached, id, h.ts, 0);
                            r.frag_idx = 0;
                            self.reply(fd, from, r, &[]);
                            return false;
                        }
                        (
                            None,
                            SubDest::Udp {
                                fd,
                                to: a,
                                len: l,
                                peer,
                            },
                        )
                    }
                };
                let sub = Arc::new(Sub {
                    consumer,
                    dest,
                    dead: AtomicBool::new(false),
                    seq: AtomicU32::new(0),
                });
                self.subs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(id)
                    .or_default()
                    .push(sub);
                c.has_remote.store(true, Ordering::Relaxed);
                let mut r = Header::new(Kind::Attached, id, h.ts, 0);
                r.frag_idx = consumer.unwrap_or(0);
                self.reply(fd, from, r, &[]);
                false
            }
            (Kind::Consumed, Sink::Owner) => {
                let cid = tok.and_then(|t| p.conns.get(&t)).and_then(|c| {
                    c.subs
                        .iter()
                        .find(|(ch, _)| *ch == h.chan)
                        .map(|(_, cid)| *cid)
                });
                if let (Some(c), Some(cid)) = (self.chan(h.chan), cid) {
                    c.consume(cid, h.ts);
                }
                false
            }
            _ => {
                self.count(|n| n.malformed += 1);
                false
            }
        }
    }

    fn drop_sub(&self, chan: u32, consumer: Option<u32>) {
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = subs.get_mut(&chan) {
            v.retain(|s| !(s.consumer == consumer && consumer.is_some()));
            if v.is_empty() {
                if let Some(c) = self.chan(chan) {
                    c.has_remote.store(false, Ordering::Relaxed);
                }
            }
        }
        drop(subs);
        if let (Some(c), Some(cid)) = (self.chan(chan), consumer) {
            c.detach(cid, true);
        }
    }

    /// Push an item just put to every remote consumer of its channel.
    fn send_to_subs(&self, chan: u32, item: &Arc<crate::chan::Item>) {
        let subs: Vec<Arc<Sub>> = self
            .subs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&chan)
            .cloned()
            .unwrap_or_default();
        for s in subs {
            if s.dead.load(Ordering::Relaxed) {
                continue;
            }
            let t0 = loopscope_trace::now();
            let mut h = Header::new(Kind::Item, chan, item.ts, item.data.len());
            h.seq = s.seq.fetch_add(1, Ordering::Relaxed) + 1;
            h.sent_ns = wire::realtime_ns();
            let r = match &s.dest {
                SubDest::Tcp { fd } => {
                    let g = fd.lock().unwrap_or_else(|e| e.into_inner());
                    wire::send_all(
                        g.as_raw_fd(),
                        &[&h.bytes(), &item.data],
                        Instant::now() + Duration::from_secs(5),
                    )
                }
                SubDest::Udp { fd, to, len, .. } => {
                    wire::send_udp(*fd, h, &item.data, self.frag, Some(to), *len)
                }
            };
            inst::send(self.chan(chan).and_then(|c| c.ents), t0, item.ts);
            if r.is_err() {
                s.dead.store(true, Ordering::Relaxed);
                self.count(|n| {
                    n.send_errors += 1;
                    n.conns_lost += 1;
                });
                if let Some(c) = self.chan(chan) {
                    if let Some(cid) = s.consumer {
                        c.detach(cid, true);
                    } else {
                        c.count_consumer_lost();
                    }
                }
            }
        }
    }
}

fn peer_of(a: &libc::sockaddr_storage) -> Option<SocketAddr> {
    if a.ss_family as i32 == libc::AF_INET {
        let sin = unsafe { &*(a as *const _ as *const libc::sockaddr_in) };
        Some(SocketAddr::from((
            u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
            u16::from_be(sin.sin_port),
        )))
    } else {
        None
    }
}

// ---- the remote ends ---------------------------------------------------------------

fn handshake_tcp(
    addr: SocketAddr,
    kind: Kind,
    name: &str,
    timeout: Duration,
) -> Result<(TcpStream, Header), String> {
    // A hub that is still starting refuses the connection: try again until
    // the timeout (a lab starts hubs and their users at about the same time).
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => break s,
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() + Duration::from_millis(50) < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("cannot connect to the hub at {addr}: {e}")),
        }
    };
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let h = Header::new(kind, 0, 0, name.len());
    s.write_all(&h.bytes())
        .and_then(|_| s.write_all(name.as_bytes()))
        .map_err(|e| format!("hub at {addr}: {e}"))?;
    let mut hb = [0u8; HDR];
    s.read_exact(&mut hb)
        .map_err(|e| format!("the hub at {addr} did not answer within {timeout:?}: {e}"))?;
    let r = Header::read(&hb).ok_or_else(|| {
        format!("the hub at {addr} answered with something that is not a loopscope channel frame")
    })?;
    if r.kind == Kind::Error as u8 {
        let mut msg = vec![0u8; r.len as usize];
        let _ = s.read_exact(&mut msg);
        return Err(format!("hub at {addr}: {}", String::from_utf8_lossy(&msg)));
    }
    s.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok((s, r))
}

fn handshake_udp(
    addr: SocketAddr,
    kind: Kind,
    name: &str,
    timeout: Duration,
) -> Result<(UdpSocket, Header), String> {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let u = UdpSocket::bind(bind).map_err(|e| e.to_string())?;
    u.connect(addr)
        .map_err(|e| format!("cannot reach the hub at {addr}: {e}"))?;
    set_bufs(u.as_raw_fd(), 8 << 20);
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 65536];
    loop {
        let h = Header::new(kind, 0, 0, name.len());
        let mut msg = h.bytes().to_vec();
        msg.extend_from_slice(name.as_bytes());
        u.send(&msg).map_err(|e| format!("hub at {addr}: {e}"))?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "the hub at {addr} did not answer within {timeout:?} (udp)"
            ));
        }
        u.set_read_timeout(Some(left.min(Duration::from_millis(200))))
            .map_err(|e| e.to_string())?;
        match u.recv(&mut buf) {
            Ok(n) => {
                let r = Header::read(&buf[..n]).ok_or_else(|| format!("the hub at {addr} answered with something that is not a loopscope channel frame"))?;
                if r.kind == Kind::Error as u8 {
                    return Err(format!(
                        "hub at {addr}: {}",
                        String::from_utf8_lossy(&buf[HDR..n])
                    ));
                }
                if r.kind == Kind::Opened as u8 || r.kind == Kind::Attached as u8 {
                    u.set_read_timeout(None).map_err(|e| e.to_string())?;
                    return Ok((u, r));
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                if Instant::now() >= deadline {
                    return Err(format!("nothing listens at {addr} (udp)"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("hub at {addr}: {e}")),
        }
    }
}

/// A producer of a channel hosted by another hub.
pub struct RemoteProducer {
    transport: Transport,
    tcp: Option<TcpStream>,
    udp: Option<UdpSocket>,
    chan: u32,
    seq: u32,
    frag: usize,
    pub sent: u64,
    pub bytes: u64,
    ents: Option<&'static inst::ChanEnts>,
}

impl RemoteProducer {
    pub fn connect(
        addr: SocketAddr,
        name: &str,
        transport: Transport,
        frag: usize,
        timeout: Duration,
    ) -> Result<RemoteProducer, String> {
        let (tcp, udp, r) = match transport {
            Transport::Tcp => {
                let (s, r) = handshake_tcp(addr, Kind::Open, name, timeout)?;
                (Some(s), None, r)
            }
            Transport::Udp => {
                let (u, r) = handshake_udp(addr, Kind::Open, name, timeout)?;
                (None, Some(u), r)
            }
        };
        Ok(RemoteProducer {
            transport,
            tcp,
            udp,
            chan: r.chan,
            seq: 0,
            frag: frag.clamp(64, 65000),
            sent: 0,
            bytes: 0,
            ents: inst::channel(name),
        })
    }

    /// Hand the item to the network (the owner counts what its channel refuses).
    pub fn put(&mut self, ts: u64, data: &[u8], timeout: Duration) -> Result<(), String> {
        let t0 = loopscope_trace::now();
        self.seq += 1;
        let mut h = Header::new(Kind::Put, self.chan, ts, data.len());
        h.seq = self.seq;
        h.sent_ns = wire::realtime_ns();
        let r = match self.transport {
            Transport::Tcp => wire::send_all(
                self.tcp.as_ref().unwrap().as_raw_fd(),
                &[&h.bytes(), data],
                Instant::now() + timeout,
            ),
            Transport::Udp => wire::send_udp(
                self.udp.as_ref().unwrap().as_raw_fd(),
                h,
                data,
                self.frag,
                None,
                0,
            ),
        };
        inst::send(self.ents, t0, ts);
        inst::put(self.ents, t0, ts);
        inst::bytes(self.ents, ts, data.len());
        r?;
        self.sent += 1;
        self.bytes += data.len() as u64;
        Ok(())
    }
}

/// A consumer of a channel hosted by another hub: the owner pushes every
/// item to it; they wait in a local mirror until got.
pub struct RemoteConsumer {
    pub hub: Hub,
    pub mirror: Arc<Channel>,
    pub cid: u32,
}

impl RemoteConsumer {
    pub fn attach(
        addr: SocketAddr,
        name: &str,
        transport: Transport,
        capacity: usize,
        max_item: usize,
        frag: usize,
        timeout: Duration,
    ) -> Result<RemoteConsumer, String> {
        let hub = Hub::new(frag);
        let mirror = Channel::new(name, capacity, Full::DropOldest, max_item);
        let cid = mirror.attach(true);
        match transport {
            Transport::Tcp => {
                let (s, r) = handshake_tcp(addr, Kind::Attach, name, timeout)?;
                let back = s.try_clone().map_err(|e| e.to_string())?;
                let chan = r.chan;
                let back = Mutex::new(back);
                // every item that leaves the mirror is consumed, as far as the owner is concerned
                *mirror.on_reclaim.lock().unwrap() = Some(Arc::new(move |ts: u64| {
                    let h = Header::new(Kind::Consumed, chan, ts, 0);
                    let g = back.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = wire::send_all(
                        g.as_raw_fd(),
                        &[&h.bytes()],
                        Instant::now() + Duration::from_secs(1),
                    );
                }));
                hub.adopt(Some(s), None, mirror.clone())?;
            }
            Transport::Udp => {
                let (u, _) = handshake_udp(addr, Kind::Attach, name, timeout)?;
                hub.adopt(None, Some(u), mirror.clone())?;
            }
        }
        Ok(RemoteConsumer { hub, mirror, cid })
    }
}


