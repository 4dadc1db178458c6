//! One router interface: an AF_PACKET socket bound to it.
//!
//! The socket sees every frame arriving on the interface with the kernel's
//! receive timestamp (SO_TIMESTAMPNS, CLOCK_REALTIME), skips the frames it
//! sends itself (PACKET_IGNORE_OUTGOING) and is non-blocking: the emulator
//! polls all its ports and its departure queue from one thread.
//!
//! Where the router's kernel forwards some paths itself (links that ask for
//! no emulation), a classic BPF filter on the socket keeps only the IPv4
//! frames whose destination is a subnet the emulator carries from this
//! port, so the kernel's paths never wake the emulator. The filter is
//! attached before the socket is bound: no frame slips in unfiltered.

use crate::error::{NetemError, Result};
use crate::ring::{Rings, RxFrame};
use std::ffi::CString;

const SOL_PACKET: i32 = 263;
const PACKET_IGNORE_OUTGOING: i32 = 23;
const SO_TIMESTAMPNS: i32 = 35;
const PACKET_HOST: u8 = 0;

pub struct Port {
    pub fd: i32,
    pub name: String,
    pub ifindex: i32,
    pub mac: [u8; 6],
    /// PACKET_MMAP rings, when asked for and the kernel gave them.
    pub rings: Option<Rings>,
    /// Why the rings could not be set up (the port then uses plain calls).
    pub ring_error: Option<String>,
    /// Frames the kernel refused from the TX ring as malformed.
    pub tx_refused: u64,
    /// Frames longer than a ring slot (dropped).
    pub truncated: u64,
}

impl Port {
    /// Open, keeping every frame.
    pub fn open(name: &str, bufsize: usize) -> Result<Port> {
        Self::open_filtered(name, bufsize, None, false).map(|(p, _)| p)
    }

    /// Open, keeping only IPv4 frames to `only`'s (net, prefix) subnets when
    /// given (an empty list keeps nothing: a port that only sends). The
    /// second value is why the filter could not be attached; that is not
    /// fatal, the caller then skips the kernel's frames itself.
    /// With `rings`, frames come and go through PACKET_MMAP rings of about
    /// `bufsize` bytes each way (`ring_error` says why not, if not).
    pub fn open_filtered(name: &str, bufsize: usize, only: Option<&[(u32, u8)]>, rings: bool) -> Result<(Port, Option<String>)> {
        let cname = CString::new(name).map_err(|_| NetemError::Config(format!("bad interface name {name:?}")))?;
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) } as i32;
        if ifindex == 0 {
            return Err(NetemError::NoInterface(name.into()));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, proto) };
        if fd < 0 {
            return Err(NetemError::os("cannot open a packet socket for", name));
        }
        let mut port = Port { fd, name: name.to_string(), ifindex, mac: [0; 6], rings: None, ring_error: None, tx_refused: 0, truncated: 0 };
        let filter_error = match only {
            Some(nets) => attach_filter(fd, nets).err().map(|e| format!("{name}: {e}")),
            None => None,
        };
        if rings {
            // Room for bursts: a 2 KiB slot per frame, however small the
            // frame, so the RX ring takes at least 16 MiB (8192 frames).
            match Rings::setup(fd, bufsize.max(16 << 20), (bufsize / 2).max(4 << 20)) {
                Ok(r) => port.rings = Some(r),
                Err(e) => port.ring_error = Some(format!("{name}: {e}")),
            }
        }
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto as u16;
        sll.sll_ifindex = ifindex;
        if unsafe { libc::bind(fd, &sll as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_ll>() as u32) } < 0 {
            return Err(NetemError::os("cannot bind a packet socket to", name));
        }
        let one: i32 = 1;
        let set = |level: i32, opt: i32, v: i32| unsafe { libc::setsockopt(fd, level, opt, &v as *const i32 as *const libc::c_void, 4) };
        if set(SOL_PACKET, PACKET_IGNORE_OUTGOING, one) < 0 {
            return Err(NetemError::os("PACKET_IGNORE_OUTGOING (kernel 4.20+) failed on", name));
        }
        if set(libc::SOL_SOCKET, SO_TIMESTAMPNS, one) < 0 {
            return Err(NetemError::os("SO_TIMESTAMPNS failed on", name));
        }
        loopscope_os::force_buffer(fd, loopscope_os::Buf::Recv, bufsize);
        loopscope_os::force_buffer(fd, loopscope_os::Buf::Send, bufsize);
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (i, c) in name.bytes().take(libc::IFNAMSIZ - 1).enumerate() {
            req.ifr_name[i] = c as libc::c_char;
        }
        if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req) } < 0 {
            return Err(NetemError::os("cannot read the MAC address of", name));
        }
        let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
        for i in 0..6 {
            port.mac[i] = sa.sa_data[i] as u8;
        }
        Ok((port, filter_error))
    }

    /// One frame addressed to this interface, if any is waiting:
    /// (length, kernel RX time in CLOCK_REALTIME ns, 0 if absent).
    /// Frames for other hosts, broadcasts and multicasts are skipped
    /// (`skipped` counts them); the kernel answers ARP itself.
    pub fn recv(&mut self, buf: &mut [u8], skipped: &mut u64) -> Option<(usize, i64)> {
        if let Some(r) = self.rings.as_mut() {
            loop {
                match r.recv(buf)? {
                    RxFrame::Frame(n, ts) => return Some((n, ts)),
                    RxFrame::Skipped => *skipped += 1,
                    RxFrame::Truncated => self.truncated += 1,
                }
            }
        }
        let mut ctrl = [0u8; 128];
        loop {
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_name = &mut sll as *mut _ as *mut libc::c_void;
            msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = ctrl.len();
            let n = unsafe { libc::recvmsg(self.fd, &mut msg, libc::MSG_DONTWAIT) };
            if n < 0 {
                return None;
            }
            if sll.sll_pkttype != PACKET_HOST {
                *skipped += 1;
                continue;
            }
            let mut krx = 0i64;
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == SO_TIMESTAMPNS {
                        let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                        krx = ts.tv_sec * 1_000_000_000 + ts.tv_nsec;
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            return Some((n as usize, krx));
        }
    }

    /// Is a received frame waiting? Only rings can tell without a system
    /// call; without them this says true (the caller then tries `recv`).
    pub fn ready(&self) -> bool {
        self.rings.as_ref().is_none_or(|r| r.rx_ready())
    }

    /// Send a frame: with rings it is queued and leaves at the next `flush`
    /// (at once when the ring is full); without, it leaves now.
    pub fn send(&mut self, frame: &[u8]) -> bool {
        if let Some(r) = self.rings.as_mut() {
            if r.queue(frame, &mut self.tx_refused) {
                return true;
            }
            r.flush(self.fd);
            if r.queue(frame, &mut self.tx_refused) {
                return true;
            }
        }
        unsafe { libc::send(self.fd, frame.as_ptr() as *const libc::c_void, frame.len(), libc::MSG_DONTWAIT) == frame.len() as isize }
    }

    /// Send what the TX ring holds (one system call; nothing without rings).
    pub fn flush(&mut self) -> bool {
        match self.rings.as_mut() {
            Some(r) => r.flush(self.fd),
            None => true,
        }
    }

    /// Frames the kernel dropped on this socket since the last call (its
    /// receive queue or ring was full): PACKET_STATISTICS.
    pub fn drops(&self) -> u64 {
        let mut st = [0u32; 2];
        let mut n = 8u32;
        let r = unsafe { libc::getsockopt(self.fd, SOL_PACKET, 6, st.as_mut_ptr() as *mut libc::c_void, &mut n) };
        if r < 0 {
            0
        } else {
            st[1] as u64
        }
    }
}

/// A classic BPF program accepting IPv4 frames whose destination lies in
/// one of `nets` (network, prefix), rejecting everything else.
pub fn dest_filter(nets: &[(u32, u8)]) -> Vec<libc::sock_filter> {
    const LD_H_ABS: u16 = 0x28;
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const AND_K: u16 = 0x54;
    const RET_K: u16 = 0x06;
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let mut p = vec![op(LD_H_ABS, 0, 0, 12), op(JEQ_K, 1, 0, 0x0800), op(RET_K, 0, 0, 0)];
    let k = nets.len();
    for (j, &(net, prefix)) in nets.iter().enumerate() {
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix as u32) };
        // to the accepting return: past the remaining blocks and the reject
        let jt = (3 * (k - j - 1) + 1) as u8;
        p.push(op(LD_W_ABS, 0, 0, 30));
        p.push(op(AND_K, 0, 0, mask));
        p.push(op(JEQ_K, jt, 0, net & mask));
    }
    p.push(op(RET_K, 0, 0, 0));
    p.push(op(RET_K, 0, 0, 0x0004_0000));
    p
}

fn attach_filter(fd: i32, nets: &[(u32, u8)]) -> Result<()> {
    if nets.len() > 80 {
        return Err(NetemError::Refused {
            what: "SO_ATTACH_FILTER".into(),
            source: std::io::Error::other(format!("{} destinations are more than one socket filter holds (80)", nets.len())),
        });
    }
    let prog = dest_filter(nets);
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut libc::sock_filter };
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &fprog as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as u32,
        )
    };
    if r < 0 {
        return Err(NetemError::refused("SO_ATTACH_FILTER"));
    }
    Ok(())
}

impl Drop for Port {
    fn drop(&mut self) {
        self.rings = None;
        unsafe { libc::close(self.fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_match_in_the_destination_filter_jumps_to_the_accepting_return() {
        for k in 0..6 {
            let nets: Vec<(u32, u8)> = (0..k).map(|i| (0x0a4d_0000 | (i << 8), 24)).collect();
            let p = dest_filter(&nets);
            let accept = p.len() - 1;
            assert_eq!(p[accept].k, 0x0004_0000);
            assert_eq!(p[accept - 1].k, 0);
            for (i, ins) in p.iter().enumerate().skip(3) {
                if ins.code == 0x15 {
                    assert_eq!(i + 1 + ins.jt as usize, accept, "block at {i} of {k}");
                    assert_eq!(ins.jf, 0);
                }
            }
        }
    }
}
