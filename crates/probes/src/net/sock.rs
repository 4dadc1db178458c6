//! Sockets with kernel timestamps, and reading them back.
//!
//! RX: `SOF_TIMESTAMPING_RX_SOFTWARE` (and `RX_HARDWARE` where the NIC
//! offers it) makes the kernel attach to each received datagram the time it
//! entered the network stack, delivered as an `SCM_TIMESTAMPING` control
//! message (three timespecs: software, -, hardware). TX: `TX_SCHED` (entering
//! the queueing discipline) and `TX_SOFTWARE` (handed to the driver) come
//! back on the socket's error queue, each with the packet's per-socket index
//! (`OPT_ID`) in the extended error. All kernel timestamps are
//! CLOCK_REALTIME.

use crate::error::{ProbeError, Result};
use loopscope_trace::vclock;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub const SO_TIMESTAMPING: libc::c_int = 37;
pub const SCM_TIMESTAMPING: libc::c_int = 37;
pub const SCM_TSTAMP_SND: u32 = 0;
pub const SCM_TSTAMP_SCHED: u32 = 1;

/// CLOCK_REALTIME now, as this process reports it (see `loopscope_trace::vclock`).
pub fn realtime_ns() -> i64 {
    vclock::real(loopscope_os::realtime_ns())
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC, read in the narrowest of a few windows.
pub fn realtime_offset_ns() -> i64 {
    let mut best = (i64::MAX, 0i64);
    for _ in 0..20 {
        let a = crate::os::mono_ns();
        let r = realtime_ns();
        let b = crate::os::mono_ns();
        if b - a < best.0 {
            best = (b - a, r - (a + (b - a) / 2));
        }
    }
    best.1
}

/// Resolve `host:port`; the error names it and says what is wrong.
pub fn resolve(addr: &str) -> Result<SocketAddr> {
    if !addr.contains(':') {
        return Err(ProbeError::address(format!("{addr:?}"), "needs a port: write HOST:PORT, e.g. 127.0.0.1:9000"));
    }
    match addr.to_socket_addrs() {
        Ok(mut it) => it.next().ok_or_else(|| ProbeError::address(addr, "the name resolves to no address")),
        Err(e) => Err(ProbeError::address(addr, format!("cannot resolve: {e}"))),
    }
}

use loopscope_os::sockaddr;

fn family(a: &SocketAddr) -> libc::c_int {
    if a.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    }
}

fn check(r: libc::c_int, what: &str) -> Result<()> {
    if r < 0 {
        Err(ProbeError::last_os(what))
    } else {
        Ok(())
    }
}

fn setopt(fd: i32, level: i32, name: i32, v: libc::c_int) -> libc::c_int {
    unsafe { libc::setsockopt(fd, level, name, &v as *const _ as *const libc::c_void, std::mem::size_of::<libc::c_int>() as u32) }
}

/// Ask for kernel RX timestamps on any socket (a TCP stream's come with the
/// read that returns the newest segment's bytes).
pub fn enable_rx_timestamps_fd(fd: i32) -> Result<()> {
    let flags = libc::SOF_TIMESTAMPING_RX_SOFTWARE | libc::SOF_TIMESTAMPING_RX_HARDWARE | libc::SOF_TIMESTAMPING_SOFTWARE | libc::SOF_TIMESTAMPING_RAW_HARDWARE;
    check(setopt(fd, libc::SOL_SOCKET, SO_TIMESTAMPING, flags as i32), "SO_TIMESTAMPING (receive)")
}

/// A UDP socket: bound (receiver) or connected (sender).
pub struct Udp {
    pub fd: OwnedFd,
    pub local: SocketAddr,
}

impl Udp {
    pub fn bind(addr: &SocketAddr, rcvbuf: usize) -> Result<Udp> {
        let fd = unsafe { libc::socket(family(addr), libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        check(fd, "socket")?;
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        if rcvbuf > 0 {
            loopscope_os::force_buffer(raw, loopscope_os::Buf::Recv, rcvbuf);
        }
        let (ss, len) = sockaddr(addr);
        if unsafe { libc::bind(raw, &ss as *const _ as *const libc::sockaddr, len) } < 0 {
            let e = io::Error::last_os_error();
            return Err(ProbeError::address(
                addr,
                match e.raw_os_error() {
                    Some(libc::EADDRINUSE) => "the port is in use; choose another or stop what holds it".to_string(),
                    Some(libc::EADDRNOTAVAIL) => "no interface of this host has that address".to_string(),
                    Some(libc::EACCES) => "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)".to_string(),
                    _ => format!("cannot bind: {e}"),
                },
            ));
        }
        let local = local_addr(raw).unwrap_or(*addr);
        Ok(Udp { fd, local })
    }

    pub fn connect(dest: &SocketAddr, sndbuf: usize) -> Result<Udp> {
        let fd = unsafe { libc::socket(family(dest), libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        check(fd, "socket")?;
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        if sndbuf > 0 {
            loopscope_os::force_buffer(raw, loopscope_os::Buf::Send, sndbuf);
        }
        let (ss, len) = sockaddr(dest);
        if unsafe { libc::connect(raw, &ss as *const _ as *const libc::sockaddr, len) } < 0 {
            let e = io::Error::last_os_error();
            return Err(ProbeError::address(
                dest,
                match e.raw_os_error() {
                    Some(libc::ENETUNREACH) => "the network is unreachable from this host (no route)".to_string(),
                    Some(libc::EHOSTUNREACH) => "the host is unreachable".to_string(),
                    _ => format!("cannot connect: {e}"),
                },
            ));
        }
        let local = local_addr(raw).unwrap_or(*dest);
        Ok(Udp { fd, local })
    }

    pub fn raw(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Ask for RX software (and hardware) timestamps.
    pub fn enable_rx_timestamps(&self) -> Result<()> {
        enable_rx_timestamps_fd(self.raw())
    }

    /// Ask for TX SCHED and SOFTWARE timestamps with per-packet ids. The
    /// stamps wait on the error queue, which is charged to the receive
    /// buffer: with the default one a sender that stalls a few milliseconds
    /// and then catches up in batches overflows it and the kernel drops
    /// stamps, so the buffer is made room for thousands.
    pub fn enable_tx_timestamps(&self) -> Result<()> {
        loopscope_os::force_buffer(self.raw(), loopscope_os::Buf::Recv, 4 << 20);
        let flags = libc::SOF_TIMESTAMPING_TX_SCHED
            | libc::SOF_TIMESTAMPING_TX_SOFTWARE
            | libc::SOF_TIMESTAMPING_SOFTWARE
            | libc::SOF_TIMESTAMPING_OPT_ID
            | libc::SOF_TIMESTAMPING_OPT_TSONLY;
        check(setopt(self.raw(), libc::SOL_SOCKET, SO_TIMESTAMPING, flags as i32), "SO_TIMESTAMPING (transmit)")
    }

    /// Both at once (each SO_TIMESTAMPING call replaces the flags of the last).
    pub fn enable_rx_tx_timestamps(&self) -> Result<()> {
        let flags = libc::SOF_TIMESTAMPING_RX_SOFTWARE
            | libc::SOF_TIMESTAMPING_RX_HARDWARE
            | libc::SOF_TIMESTAMPING_RAW_HARDWARE
            | libc::SOF_TIMESTAMPING_TX_SOFTWARE
            | libc::SOF_TIMESTAMPING_SOFTWARE
            | libc::SOF_TIMESTAMPING_OPT_ID
            | libc::SOF_TIMESTAMPING_OPT_TSONLY;
        check(setopt(self.raw(), libc::SOL_SOCKET, SO_TIMESTAMPING, flags as i32), "SO_TIMESTAMPING (receive and transmit)")
    }

    pub fn set_read_timeout_ms(&self, ms: i64) {
        let tv = libc::timeval { tv_sec: ms / 1000, tv_usec: (ms % 1000) * 1000 };
        unsafe {
            libc::setsockopt(
                self.raw(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            );
        }
    }
}

fn local_addr(fd: i32) -> Option<SocketAddr> {
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    if unsafe { libc::getsockname(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) } < 0 {
        return None;
    }
    match ss.ss_family as i32 {
        libc::AF_INET => {
            let s = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::from((u32::from_be(s.sin_addr.s_addr).to_be_bytes(), u16::from_be(s.sin_port))))
        }
        libc::AF_INET6 => {
            let s = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::from((s.sin6_addr.s6_addr, u16::from_be(s.sin6_port))))
        }
        _ => None,
    }
}

fn ts_ns(t: &libc::timespec) -> i64 {
    t.tv_sec as i64 * 1_000_000_000 + t.tv_nsec as i64
}

/// The software (and hardware) RX timestamps in a message's control data.
/// Returns (software ns, hardware ns), 0 for absent.
///
/// # Safety
/// `msg` must be a message header filled by recvmsg/recvmmsg.
pub unsafe fn rx_timestamps(msg: &libc::msghdr) -> (i64, i64) {
    let mut c = libc::CMSG_FIRSTHDR(msg);
    while !c.is_null() {
        if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == SCM_TIMESTAMPING {
            let ts = libc::CMSG_DATA(c) as *const libc::timespec;
            let sw = std::ptr::read_unaligned(ts);
            let hw = std::ptr::read_unaligned(ts.add(2));
            return (vclock::real(ts_ns(&sw)), vclock::real(ts_ns(&hw)));
        }
        c = libc::CMSG_NXTHDR(msg, c);
    }
    (0, 0)
}

/// One datagram received with `recv_stamped`.
pub struct Received {
    pub len: usize,
    /// Kernel RX time: the hardware stamp when the NIC made one, else software (0: none).
    pub krx: i64,
    pub truncated: bool,
    pub from: libc::sockaddr_storage,
    pub from_len: libc::socklen_t,
}

/// Receive one datagram with its kernel RX timestamp and source address;
/// None on timeout or error. `ctrl` holds the control messages (256 bytes do).
pub fn recv_stamped(fd: i32, buf: &mut [u8], ctrl: &mut [u8]) -> Option<Received> {
    let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = &mut from as *mut _ as *mut libc::c_void;
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = ctrl.len();
    let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
    if n < 0 {
        return None;
    }
    let (sw, hw) = unsafe { rx_timestamps(&msg) };
    Some(Received { len: n as usize, krx: if hw != 0 { hw } else { sw }, truncated: msg.msg_flags & libc::MSG_TRUNC != 0, from, from_len: msg.msg_namelen })
}

/// One TX timestamp from the error queue: (kind, packet index on the socket, ns).
pub struct TxStamp {
    pub kind: u32,
    pub key: u32,
    pub ns: i64,
}

/// Drain the socket's error queue of TX timestamps (non-blocking).
pub fn drain_tx_stamps(fd: i32, out: &mut Vec<TxStamp>) {
    let mut control = [0u8; 512];
    let mut data = [0u8; 64];
    loop {
        let mut iov = libc::iovec { iov_base: data.as_mut_ptr() as *mut libc::c_void, iov_len: data.len() };
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = control.len();
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if n < 0 {
            return;
        }
        let (mut ns, mut kind, mut key, mut ok) = (0i64, 0u32, 0u32, false);
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                let (lvl, ty) = ((*c).cmsg_level, (*c).cmsg_type);
                if lvl == libc::SOL_SOCKET && ty == SCM_TIMESTAMPING {
                    let ts = libc::CMSG_DATA(c) as *const libc::timespec;
                    ns = ts_ns(&std::ptr::read_unaligned(ts));
                } else if (lvl == libc::SOL_IP && ty == libc::IP_RECVERR) || (lvl == libc::SOL_IPV6 && ty == libc::IPV6_RECVERR) {
                    let e = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::sock_extended_err);
                    if e.ee_origin == libc::SO_EE_ORIGIN_TIMESTAMPING && e.ee_errno == libc::ENOMSG as u32 {
                        kind = e.ee_info;
                        key = e.ee_data;
                        ok = true;
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if ok && ns != 0 {
            out.push(TxStamp { kind, key, ns: vclock::real(ns) });
        }
    }
}
