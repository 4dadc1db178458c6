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

//!
//! The module is split by what each part does: this file holds the hub's
//! state and its public face; `pump.rs` reads the sockets and moves what
//! arrives into the channels (framing, UDP reassembly, subscriptions);
//! `sockets.rs` sets sockets up and does the handshakes; `remote.rs` holds
//! the remote producers and consumers.

mod pump;
mod remote;
mod sockets;

use crate::error::{NetError, Result as NetResult};
pub use remote::{RemoteConsumer, RemoteProducer};
use sockets::{conn_mode, ep_add, peer_of, set_bufs, src_of, tid};

/// Where a datagram came from: address and port.
type Src = (u128, u16);

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
    pub fn parse(s: &str) -> NetResult<Transport> {
        match s {
            "tcp" => Ok(Transport::Tcp),
            "udp" => Ok(Transport::Udp),
            _ => Err(NetError::Input(format!("transport {s:?}: expected tcp or udp"))),
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
    Tcp { fd: Mutex<TcpStream> },
    Udp { fd: RawFd, to: libc::sockaddr_storage, len: u32, peer: SocketAddr },
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
    pub fn listen(&self, bind: SocketAddr) -> NetResult<SocketAddr> {
        let l = TcpListener::bind(bind).map_err(|e| NetError::Input(format!("cannot listen on {bind} (tcp): {e}")))?;
        let addr = l.local_addr().map_err(NetError::os("local_addr"))?;
        let u = UdpSocket::bind(addr).map_err(|e| NetError::Input(format!("cannot listen on {addr} (udp): {e}")))?;
        l.set_nonblocking(true).map_err(NetError::os("set_nonblocking"))?;
        u.set_nonblocking(true).map_err(NetError::os("set_nonblocking"))?;
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
    pub fn create(&self, name: &str, capacity: usize, full: Full, max_item: usize) -> NetResult<Arc<Channel>> {
        let mut names = self.inner.names.lock().unwrap_or_else(|e| e.into_inner());
        if names.contains_key(name) {
            return Err(NetError::Input(format!("a channel named {name:?} already exists on this hub")));
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
        let id = *self.inner.names.lock().unwrap_or_else(|e| e.into_inner()).get(name)?;
        self.inner.chans.lock().unwrap_or_else(|e| e.into_inner()).get(id as usize - 1).cloned()
    }

    pub fn net_stats(&self) -> NetStats {
        self.inner.net.lock().unwrap_or_else(|e| e.into_inner()).clone()
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
        for c in self.inner.chans.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            c.close();
        }
    }

    /// A mirror for a remote consumer: items arriving on `fd` go to `mirror`.
    fn adopt(&self, stream: Option<TcpStream>, udp: Option<UdpSocket>, mirror: Arc<Channel>) -> NetResult<()> {
        *mirror.waiter.lock().unwrap() = Some(Arc::new(HubWaiter(Arc::downgrade(&self.inner))));
        let mut p = self.inner.pump.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = stream {
            conn_mode(&s).map_err(NetError::os("the connection's socket options"))?;
            let tok = p.next_token;
            p.next_token += 1;
            ep_add(self.inner.epfd, s.as_raw_fd(), tok)?;
            p.conns.insert(
                tok,
                Conn { stream: s, sink: Sink::Mirror(mirror), buf: vec![0u8; 65536].into_boxed_slice(), start: 0, end: 0, body: None, subs: Vec::new() },
            );
        } else if let Some(u) = udp {
            u.set_nonblocking(true).map_err(NetError::os("set_nonblocking"))?;
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
