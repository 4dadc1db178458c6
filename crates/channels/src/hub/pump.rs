//! The pump: one thread at a time reads the hub's sockets and moves what
//! arrives into its channels (TCP framing, UDP reassembly and sequence
//! checks, replies, pushing items to remote subscribers).

use super::*;

impl HubInner {
    pub(super) fn chan(&self, id: u32) -> Option<Arc<Channel>> {
        if id == 0 {
            return None;
        }
        self.chans.lock().unwrap_or_else(|e| e.into_inner()).get(id as usize - 1).cloned()
    }

    pub(super) fn count(&self, f: impl FnOnce(&mut NetStats)) {
        f(&mut self.net.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub(super) fn try_pump(&self, max: Duration) -> Option<bool> {
        let mut p = self.pump.try_lock().ok()?;
        self.holder.store(tid(), Ordering::Relaxed);
        let r = self.pump_locked(&mut p, max);
        self.holder.store(0, Ordering::Relaxed);
        Some(r)
    }

    pub(super) fn pump_locked(&self, p: &mut Pump, max: Duration) -> bool {
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

    pub(super) fn accept(&self, p: &mut Pump) {
        let Some(l) = p.listener.as_ref() else { return };
        while let Ok((s, _)) = l.accept() {
            let _ = s.set_nodelay(true);
            let _ = conn_mode(&s);
            let tok = p.next_token;
            p.next_token += 1;
            if ep_add(self.epfd, s.as_raw_fd(), tok).is_ok() {
                p.conns.insert(
                    tok,
                    Conn { stream: s, sink: Sink::Owner, buf: vec![0u8; 65536].into_boxed_slice(), start: 0, end: 0, body: None, subs: Vec::new() },
                );
                self.count(|n| n.conns_accepted += 1);
            }
        }
    }

    /// Read what a connection has; frames complete go where they belong.
    /// Reads stop once a frame is complete and nothing is half-read (the
    /// epoll is level-triggered: what is left comes back at once), so an
    /// item costs one read, not one more that finds nothing.
    /// Read what a connection has (without blocking) and handle the whole
    /// frames in it; a connection that closed or sent garbage is dropped.
    pub(super) fn read_conn(&self, p: &mut Pump, tok: u64) -> bool {
        let Some(c) = p.conns.get_mut(&tok) else {
            return false;
        };
        let mut frames: Vec<(Header, Vec<u8>)> = Vec::new();
        let closed = loop {
            let got = if c.body.is_some() {
                c.fill_body(&mut frames)
            } else if c.end - c.start >= HDR {
                self.start_body(c)
            } else if !frames.is_empty() && c.end == c.start {
                Got::Wait
            } else {
                c.read_header_bytes()
            };
            match got {
                Got::More => continue,
                Got::Wait => break false,
                Got::Closed => break true,
            }
        };
        let sink = c.sink.clone();
        let fd = c.stream.as_raw_fd();
        let mut any = false;
        for (h, body) in frames {
            any |= self.frame(p, Some(tok), fd, &sink, h, body, None);
        }
        if closed {
            self.close_conn(p, tok);
        }
        any
    }

    /// A frame's header at the front of the buffer: its body is read next
    /// (garbage closes the connection).
    fn start_body(&self, c: &mut Conn) -> Got {
        let Some(h) = Header::read(&c.buf[c.start..c.start + HDR]) else {
            self.count(|n| n.malformed += 1);
            return Got::Closed;
        };
        c.start += HDR;
        let t0 = loopscope_trace::now();
        let body = crate::pool::take(h.len as usize);
        inst::alloc(t0);
        c.body = Some((h, body, 0));
        Got::More
    }

    /// A connection that closed: out of the poll set, its subscriptions
    /// dropped (counted as lost when it had any, or mirrored a channel).
    fn close_conn(&self, p: &mut Pump, tok: u64) {
        let Some(c) = p.conns.remove(&tok) else {
            return;
        };
        unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, c.stream.as_raw_fd(), std::ptr::null_mut()) };
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
    }

    /// Read the UDP socket's datagrams, up to 16 per recvmmsg, and put items
    /// back together.
    pub(super) fn read_udp(&self, p: &mut Pump) -> bool {
        let mut any = false;
        let mut datagrams = 0u64;
        let mut malformed = 0u64;
        if p.dgram.len() < UDP_BATCH * DG {
            p.dgram.resize(UDP_BATCH * DG, 0);
        }
        loop {
            let Some((u, sink)) = p.udp.as_ref() else {
                break;
            };
            let sink = sink.clone();
            let fd = u.as_raw_fd();
            let mut from: [libc::sockaddr_storage; UDP_BATCH] = unsafe { std::mem::zeroed() };
            let mut lens = [(0usize, 0u32); UDP_BATCH];
            let t0 = loopscope_trace::now();
            let n = recv_batch(&mut p.dgram, fd, &mut from, &mut lens);
            if n == 0 {
                break;
            }
            datagrams += n as u64;
            let mut t_seg = t0;
            for i in 0..n {
                let (len, flen) = lens[i];
                let Some(h) = Header::read(&p.dgram[i * DG..i * DG + len]) else {
                    malformed += 1;
                    continue;
                };
                let (got, t) = self.datagram(p, i, len, h, fd, &sink, (from[i], flen), t_seg);
                any |= got;
                t_seg = t;
            }
            inst::recv(t_seg);
            if n < UDP_BATCH {
                break;
            }
        }
        self.count(|s| {
            s.datagrams_in += datagrams;
            s.malformed += malformed;
        });
        any
    }

    /// One datagram (slot `i` of the batch): a whole item at once, or a
    /// fragment put into its item's reassembly, which is handled when its
    /// last fragment comes. Whether an item went into a channel, and the
    /// time the next segment of receiving starts.
    #[allow(clippy::too_many_arguments)]
    fn datagram(&self, p: &mut Pump, i: usize, len: usize, h: Header, fd: RawFd, sink: &Sink, from: (libc::sockaddr_storage, u32), t_seg: u64) -> (bool, u64) {
        let src = src_of(&from.0);
        if h.frag_count <= 1 {
            let body = p.dgram[i * DG + HDR..i * DG + len].to_vec();
            // messaging up to here; the put that follows is the runtime's
            inst::recv(t_seg);
            self.note_seq(p, src, h);
            let got = self.frame(p, None, fd, sink, h, body, Some(from));
            return (got, loopscope_trace::now());
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
        if part.got as usize != part.seen.len() {
            return (false, t_seg);
        }
        inst::recv(t_seg);
        let part = p.reasm.remove(&key).unwrap();
        self.note_seq(p, src, part.h);
        let got = self.frame(p, None, fd, sink, part.h, part.data, Some(from));
        (got, loopscope_trace::now())
    }

    /// Count items a sender numbered but that never arrived (and partial
    /// ones older than a newer complete item).
    pub(super) fn note_seq(&self, p: &mut Pump, src: Src, h: Header) {
        if !matches!(Kind::of(h.kind), Some(Kind::Put) | Some(Kind::Item)) {
            return;
        }
        let last = p.last_seq.insert(src, h.seq);
        if let Some(l) = last {
            if h.seq > l + 1 {
                let gap = (h.seq - l - 1) as u64;
                // those partly received are counted as incomplete, the rest as missing
                let partial: Vec<(Src, u32)> = p.reasm.keys().filter(|(k, s)| *k == src && *s < h.seq).cloned().collect();
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

    pub(super) fn expire(&self, p: &mut Pump) {
        let old: Vec<(Src, u32)> = p.reasm.iter().filter(|(_, v)| v.first.elapsed() > Duration::from_secs(1)).map(|(k, _)| *k).collect();
        if !old.is_empty() {
            let n = old.len() as u64;
            for k in old {
                p.reasm.remove(&k);
            }
            self.count(|s| s.incomplete += n);
        }
    }

    pub(super) fn reply(&self, fd: RawFd, to: Option<(libc::sockaddr_storage, u32)>, h: Header, payload: &[u8]) {
        let hb = h.bytes();
        let r = match to {
            None => wire::send_all(fd, &[&hb, payload], Instant::now() + Duration::from_secs(1)),
            Some((a, l)) => wire::send_udp(fd, h, payload, self.frag, Some(&a), l),
        };
        if r.is_err() {
            self.count(|n| n.send_errors += 1);
        }
    }

    /// One whole frame from a connection (`tok`) or a datagram's sender
    /// (`from`): an item into its channel, an open or attach answered, a
    /// remote consumer's progress. True when an item went into a channel.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn frame(
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
            (Kind::Put, Sink::Owner) | (Kind::Item, Sink::Mirror(_)) => self.put_item(sink, h, body),
            (Kind::Open, Sink::Owner) | (Kind::Attach, Sink::Owner) => {
                self.open_or_attach(p, tok, fd, kind, h, &body, from);
                false
            }
            (Kind::Consumed, Sink::Owner) => {
                let cid = tok.and_then(|t| p.conns.get(&t)).and_then(|c| c.subs.iter().find(|(ch, _)| *ch == h.chan).map(|(_, cid)| *cid));
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

    /// An item into its channel (the owner's, by id, or a mirror's), never
    /// blocking the pumping thread: a full channel refuses it (counted).
    fn put_item(&self, sink: &Sink, h: Header, body: Vec<u8>) -> bool {
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

    /// A channel asked for by name: `open` gets its id; `attach` makes the
    /// asker a subscriber (a consumer over TCP, a peer over UDP) and says so.
    #[allow(clippy::too_many_arguments)]
    fn open_or_attach(&self, p: &mut Pump, tok: Option<u64>, fd: RawFd, kind: Kind, h: Header, body: &[u8], from: Option<(libc::sockaddr_storage, u32)>) {
        let name = String::from_utf8_lossy(body).to_string();
        let id = self.names.lock().unwrap_or_else(|e| e.into_inner()).get(&name).copied();
        let Some(id) = id else {
            let msg = format!("no channel named {name:?} on this hub");
            self.reply(fd, from, Header::new(Kind::Error, 0, h.ts, msg.len()), msg.as_bytes());
            return;
        };
        if kind == Kind::Open {
            self.reply(fd, from, Header::new(Kind::Opened, id, h.ts, 0), &[]);
            return;
        }
        let c = self.chan(id).unwrap();
        let Some((consumer, dest)) = self.subscriber(p, tok, fd, id, &c, h, from) else {
            return;
        };
        let sub = Arc::new(Sub { consumer, dest, dead: AtomicBool::new(false), seq: AtomicU32::new(0) });
        self.subs.lock().unwrap_or_else(|e| e.into_inner()).entry(id).or_default().push(sub);
        c.has_remote.store(true, Ordering::Relaxed);
        let mut r = Header::new(Kind::Attached, id, h.ts, 0);
        r.frag_idx = consumer.unwrap_or(0);
        self.reply(fd, from, r, &[]);
    }

    /// Where an attaching subscriber's items go: a consumer of the channel
    /// writing to its TCP connection, or its UDP address. None when there is
    /// nothing to add (the connection is gone, or a retried UDP attach,
    /// which is answered again).
    #[allow(clippy::too_many_arguments)]
    fn subscriber(
        &self,
        p: &mut Pump,
        tok: Option<u64>,
        fd: RawFd,
        id: u32,
        c: &Arc<Channel>,
        h: Header,
        from: Option<(libc::sockaddr_storage, u32)>,
    ) -> Option<(Option<u32>, SubDest)> {
        match from {
            None => {
                let cid = c.attach(false);
                let conn = tok.and_then(|t| p.conns.get_mut(&t))?;
                conn.subs.push((id, cid));
                let dup = conn.stream.try_clone().ok()?;
                Some((Some(cid), SubDest::Tcp { fd: Mutex::new(dup) }))
            }
            Some((a, l)) => {
                let peer = peer_of(&a).unwrap_or_else(|| "0.0.0.0:0".parse().unwrap());
                let subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
                if subs
                    .get(&id)
                    .is_some_and(|v| v.iter().any(|s| matches!(&s.dest, SubDest::Udp { peer: q, .. } if *q == peer) && !s.dead.load(Ordering::Relaxed)))
                {
                    drop(subs);
                    // a retried attach: answer again
                    let mut r = Header::new(Kind::Attached, id, h.ts, 0);
                    r.frag_idx = 0;
                    self.reply(fd, from, r, &[]);
                    return None;
                }
                Some((None, SubDest::Udp { fd, to: a, len: l, peer }))
            }
        }
    }

    pub(super) fn drop_sub(&self, chan: u32, consumer: Option<u32>) {
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
    pub(super) fn send_to_subs(&self, chan: u32, item: &Arc<crate::chan::Item>) {
        let subs: Vec<Arc<Sub>> = self.subs.lock().unwrap_or_else(|e| e.into_inner()).get(&chan).cloned().unwrap_or_default();
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
                    wire::send_all(g.as_raw_fd(), &[&h.bytes(), &item.data], Instant::now() + Duration::from_secs(5))
                }
                SubDest::Udp { fd, to, len, .. } => wire::send_udp(*fd, h, &item.data, self.frag, Some(to), *len),
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

/// What a step of reading a connection came to.
enum Got {
    /// there may be more to do now
    More,
    /// nothing more until the socket is readable again
    Wait,
    /// the connection closed (or failed)
    Closed,
}

/// A read that would block (or timed out) waits; one interrupted is tried
/// again; any other error closes the connection.
fn read_outcome(r: std::io::Result<usize>) -> Result<usize, Got> {
    match r {
        Ok(0) => Err(Got::Closed),
        Ok(k) => Ok(k),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Err(Got::Wait),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Err(Got::More),
        Err(_) => Err(Got::Closed),
    }
}

impl Conn {
    /// Move buffered bytes into the frame body being read, then read the
    /// rest of it from the socket; a complete body joins `frames`.
    fn fill_body(&mut self, frames: &mut Vec<(Header, Vec<u8>)>) -> Got {
        let Some((_, body, filled)) = self.body.as_mut() else {
            return Got::More;
        };
        let take = (self.end - self.start).min(body.len() - *filled);
        body[*filled..*filled + take].copy_from_slice(&self.buf[self.start..self.start + take]);
        self.start += take;
        *filled += take;
        if *filled < body.len() {
            let t0 = loopscope_trace::now();
            match read_outcome(self.stream.read(&mut body[*filled..])) {
                Ok(k) => {
                    *filled += k;
                    inst::recv(t0);
                }
                Err(g) => return g,
            }
        }
        if *filled == body.len() {
            let (h, body, _) = self.body.take().unwrap();
            frames.push((h, body));
        }
        Got::More
    }

    /// More bytes for a header: the partial one moved to the front first.
    fn read_header_bytes(&mut self) -> Got {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let end = self.end;
        match read_outcome(self.stream.read(&mut self.buf[end..])) {
            Ok(k) => {
                self.end += k;
                Got::More
            }
            Err(g) => g,
        }
    }
}

/// Datagrams read at once, and the room each gets.
const UDP_BATCH: usize = 16;
const DG: usize = 65536;

/// One `recvmmsg` (not blocking) into `buf`'s slots: how many came, each
/// one's length and sender's address length in `lens`.
fn recv_batch(buf: &mut [u8], fd: RawFd, from: &mut [libc::sockaddr_storage; UDP_BATCH], lens: &mut [(usize, u32); UDP_BATCH]) -> usize {
    let mut iov: Vec<libc::iovec> = (0..UDP_BATCH).map(|i| libc::iovec { iov_base: buf[i * DG..].as_mut_ptr() as *mut libc::c_void, iov_len: DG }).collect();
    let mut msgs: Vec<libc::mmsghdr> = (0..UDP_BATCH)
        .map(|i| {
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = &mut iov[i];
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_name = &mut from[i] as *mut _ as *mut libc::c_void;
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            m
        })
        .collect();
    let n = unsafe { libc::recvmmsg(fd, msgs.as_mut_ptr(), UDP_BATCH as u32, libc::MSG_DONTWAIT, std::ptr::null_mut()) };
    let n = n.max(0) as usize;
    for (i, m) in msgs.iter().take(n).enumerate() {
        lens[i] = (m.msg_len as usize, m.msg_hdr.msg_namelen);
    }
    n
}
