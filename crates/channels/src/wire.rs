//! The frames channels exchange, over TCP (a stream of frames) and UDP (an
//! item split into datagrams of at most `frag` payload bytes, reassembled by
//! the receiver; a missing fragment loses the item, counted).
//!
//! Header, 40 bytes, little-endian: magic "LSCH", kind u8, pad u8,
//! frag_count u16, chan u32, frag_idx u32 (UDP; for ATTACHED the consumer
//! id), ts u64, len u32 (the whole item), seq u32 (per sender, numbering its
//! items), sent_ns u64 (the sender's CLOCK_REALTIME when it sent the item:
//! with the hosts' clock alignment it places the network part of a hop).

use crate::error::{NetError, Result as NetResult};

pub const MAGIC: u32 = 0x4843_534c; // "LSCH"
pub const HDR: usize = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// producer → owner: name in the payload; answered by Opened(chan)
    Open = 1,
    Opened = 2,
    /// an item for channel `chan`
    Put = 3,
    /// consumer → owner: name in the payload; answered by Attached
    Attach = 4,
    Attached = 5,
    /// owner → remote consumer: an item of the channel it attached to
    Item = 6,
    /// remote consumer → owner: it consumed item `ts`
    Consumed = 7,
    /// a refusal, the reason in the payload
    Error = 8,
}

impl Kind {
    pub fn of(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Open,
            2 => Kind::Opened,
            3 => Kind::Put,
            4 => Kind::Attach,
            5 => Kind::Attached,
            6 => Kind::Item,
            7 => Kind::Consumed,
            8 => Kind::Error,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Header {
    pub kind: u8,
    pub frag_count: u16,
    pub chan: u32,
    pub frag_idx: u32,
    pub ts: u64,
    pub len: u32,
    pub seq: u32,
    pub sent_ns: u64,
}

impl Header {
    pub fn new(kind: Kind, chan: u32, ts: u64, len: usize) -> Header {
        Header { kind: kind as u8, frag_count: 1, chan, frag_idx: 0, ts, len: len as u32, seq: 0, sent_ns: 0 }
    }

    pub fn write(&self, b: &mut [u8; HDR]) {
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind;
        b[5] = 0;
        b[6..8].copy_from_slice(&self.frag_count.to_le_bytes());
        b[8..12].copy_from_slice(&self.chan.to_le_bytes());
        b[12..16].copy_from_slice(&self.frag_idx.to_le_bytes());
        b[16..24].copy_from_slice(&self.ts.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.sent_ns.to_le_bytes());
    }

    pub fn bytes(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        self.write(&mut b);
        b
    }

    pub fn read(b: &[u8]) -> Option<Header> {
        if b.len() < HDR || u32::from_le_bytes(b[0..4].try_into().ok()?) != MAGIC {
            return None;
        }
        Some(Header {
            kind: b[4],
            frag_count: u16::from_le_bytes(b[6..8].try_into().ok()?),
            chan: u32::from_le_bytes(b[8..12].try_into().ok()?),
            frag_idx: u32::from_le_bytes(b[12..16].try_into().ok()?),
            ts: u64::from_le_bytes(b[16..24].try_into().ok()?),
            len: u32::from_le_bytes(b[24..28].try_into().ok()?),
            seq: u32::from_le_bytes(b[28..32].try_into().ok()?),
            sent_ns: u64::from_le_bytes(b[32..40].try_into().ok()?),
        })
    }
}

pub fn realtime_ns() -> u64 {
    loopscope_os::realtime_ns() as u64
}

/// Write all of `parts` to the socket `fd` (blocking or not) by the
/// deadline: writev, and poll for room when the socket is full.
pub fn send_all(fd: i32, parts: &[&[u8]], deadline: std::time::Instant) -> NetResult<()> {
    let mut idx = 0;
    let mut off = 0;
    while idx < parts.len() {
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(parts.len() - idx);
        for (i, p) in parts[idx..].iter().enumerate() {
            let p = if i == 0 { &p[off..] } else { p };
            iov.push(libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() });
        }
        let n = unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as i32) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => {
                    let now = std::time::Instant::now();
                    if now >= deadline {
                        return Err(NetError::Peer("the peer did not take the data in time (its receive buffer stayed full)".into()));
                    }
                    let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
                    let ms = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as i32;
                    unsafe { libc::poll(&mut pfd, 1, ms) };
                    continue;
                }
                _ => return Err(NetError::Os { what: "send".into(), source: e }),
            }
        }
        let mut n = n as usize;
        while idx < parts.len() && n > 0 {
            let left = parts[idx].len() - off;
            if n >= left {
                n -= left;
                idx += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
        while idx < parts.len() && parts[idx].len() == off {
            idx += 1;
            off = 0;
        }
    }
    Ok(())
}

/// An item as UDP datagrams: header + at most `frag` bytes each, sent with
/// sendmmsg in batches (to `to` when the socket is not connected).
pub fn send_udp(fd: i32, mut h: Header, data: &[u8], frag: usize, to: Option<&libc::sockaddr_storage>, tolen: u32) -> NetResult<()> {
    let count = data.len().div_ceil(frag).max(1);
    if count > u16::MAX as usize {
        return Err(NetError::Input(format!("an item of {} bytes needs {count} datagrams of {frag} bytes: more than 65535", data.len())));
    }
    h.frag_count = count as u16;
    let hdrs: Vec<[u8; HDR]> = (0..count)
        .map(|i| {
            h.frag_idx = i as u32;
            h.bytes()
        })
        .collect();
    let heads: Vec<&[u8]> = hdrs.iter().map(|x| &x[..]).collect();
    send_fragments(fd, &heads, data, frag, to, tolen)
}

/// Datagram i = `heads[i]` + the i-th `frag`-byte slice of `data`, sent
/// with sendmmsg 64 at a time; a full socket buffer is waited out (poll),
/// not counted as an error. Raw senders (the bench's baseline) use it too.
pub fn send_fragments(fd: i32, heads: &[&[u8]], data: &[u8], frag: usize, to: Option<&libc::sockaddr_storage>, tolen: u32) -> NetResult<()> {
    let count = heads.len();
    let mut sent = 0;
    while sent < count {
        let batch = (count - sent).min(64);
        let mut iovs: Vec<[libc::iovec; 2]> = (sent..sent + batch)
            .map(|i| {
                let a = (i * frag).min(data.len());
                let b = (a + frag).min(data.len());
                [
                    libc::iovec { iov_base: heads[i].as_ptr() as *mut libc::c_void, iov_len: heads[i].len() },
                    libc::iovec { iov_base: data[a..b].as_ptr() as *mut libc::c_void, iov_len: b - a },
                ]
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .map(|iov| {
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_iov = iov.as_mut_ptr();
                m.msg_hdr.msg_iovlen = 2;
                if let Some(t) = to {
                    m.msg_hdr.msg_name = t as *const _ as *mut libc::c_void;
                    m.msg_hdr.msg_namelen = tolen;
                }
                m
            })
            .collect();
        let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), batch as u32, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                    let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
                    unsafe { libc::poll(&mut pfd, 1, 100) };
                    continue;
                }
                _ => return Err(NetError::Os { what: "sendmmsg".into(), source: e }),
            }
        }
        sent += n as usize;
    }
    Ok(())
}
