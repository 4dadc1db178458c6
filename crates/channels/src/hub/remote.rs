//! The remote ends: a producer that puts into a channel of another
//! process's hub, and a consumer that attaches to one.

use super::sockets::{handshake_tcp, handshake_udp};
use super::*;

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
    pub fn connect(addr: SocketAddr, name: &str, transport: Transport, frag: usize, timeout: Duration) -> NetResult<RemoteProducer> {
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
        Ok(RemoteProducer { transport, tcp, udp, chan: r.chan, seq: 0, frag: frag.clamp(64, 65000), sent: 0, bytes: 0, ents: inst::channel(name) })
    }

    /// Hand the item to the network (the owner counts what its channel refuses).
    pub fn put(&mut self, ts: u64, data: &[u8], timeout: Duration) -> NetResult<()> {
        let t0 = loopscope_trace::now();
        self.seq += 1;
        let mut h = Header::new(Kind::Put, self.chan, ts, data.len());
        h.seq = self.seq;
        h.sent_ns = wire::realtime_ns();
        let r = match self.transport {
            Transport::Tcp => wire::send_all(self.tcp.as_ref().unwrap().as_raw_fd(), &[&h.bytes(), data], Instant::now() + timeout),
            Transport::Udp => wire::send_udp(self.udp.as_ref().unwrap().as_raw_fd(), h, data, self.frag, None, 0),
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
    ) -> NetResult<RemoteConsumer> {
        let hub = Hub::new(frag);
        let mirror = Channel::new(name, capacity, Full::DropOldest, max_item);
        let cid = mirror.attach(true);
        match transport {
            Transport::Tcp => {
                let (s, r) = handshake_tcp(addr, Kind::Attach, name, timeout)?;
                let back = s.try_clone().map_err(NetError::os("try_clone"))?;
                let chan = r.chan;
                let back = Mutex::new(back);
                // every item that leaves the mirror is consumed, as far as the owner is concerned
                *mirror.on_reclaim.lock().unwrap() = Some(Arc::new(move |ts: u64| {
                    let h = Header::new(Kind::Consumed, chan, ts, 0);
                    let g = back.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = wire::send_all(g.as_raw_fd(), &[&h.bytes()], Instant::now() + Duration::from_secs(1));
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
