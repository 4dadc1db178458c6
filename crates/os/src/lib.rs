//! The operating-system calls several of loopscope's crates make, in one
//! place: reading the clocks, turning a `SocketAddr` into the C structure
//! the socket calls take, and sizing socket buffers past the sysctl caps.
//!
//! The clock reads are raw: no virtual clock (the test-only skew of
//! `loopscope_trace::vclock`) is applied here, so code that reports times a
//! host's processes produce goes through `loopscope_trace::clock` instead,
//! which builds on these. Everything here is a thin wrapper over one or two
//! system calls; it allocates nothing and never panics.

use std::net::SocketAddr;
use std::os::fd::RawFd;

fn clock_ns(id: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as i64 * 1_000_000_000 + ts.tv_nsec as i64
}

/// CLOCK_MONOTONIC in nanoseconds.
#[inline]
pub fn mono_ns() -> i64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in nanoseconds since the epoch (the clock of the kernel's
/// packet timestamps).
#[inline]
pub fn realtime_ns() -> i64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// `a` as the `sockaddr_storage` and length that bind/connect/sendto take.
pub fn sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let s = &mut ss as *mut _ as *mut libc::sockaddr_in;
            unsafe {
                (*s).sin_family = libc::AF_INET as libc::sa_family_t;
                (*s).sin_port = v4.port().to_be();
                (*s).sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
            }
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let s = &mut ss as *mut _ as *mut libc::sockaddr_in6;
            unsafe {
                (*s).sin6_family = libc::AF_INET6 as libc::sa_family_t;
                (*s).sin6_port = v6.port().to_be();
                (*s).sin6_addr.s6_addr = v6.ip().octets();
                (*s).sin6_flowinfo = v6.flowinfo();
                (*s).sin6_scope_id = v6.scope_id();
            }
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Which socket buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    Recv,
    Send,
}

fn setopt(fd: RawFd, opt: libc::c_int, v: libc::c_int) -> bool {
    unsafe {
        libc::setsockopt(fd, libc::SOL_SOCKET, opt, &v as *const libc::c_int as *const libc::c_void, std::mem::size_of::<libc::c_int>() as libc::socklen_t) == 0
    }
}

/// Ask for a socket buffer of `bytes`: SO_RCVBUFFORCE/SO_SNDBUFFORCE first
/// (CAP_NET_ADMIN may go past net.core.rmem_max/wmem_max), else the capped
/// SO_RCVBUF/SO_SNDBUF. True when the forced size was granted.
pub fn force_buffer(fd: RawFd, which: Buf, bytes: usize) -> bool {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    let (force, plain) = match which {
        Buf::Recv => (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        Buf::Send => (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    };
    if setopt(fd, force, v) {
        return true;
    }
    setopt(fd, plain, v);
    false
}

/// The plain, capped SO_RCVBUF and SO_SNDBUF both set to `bytes`.
pub fn set_buffers(fd: RawFd, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    setopt(fd, libc::SO_RCVBUF, v);
    setopt(fd, libc::SO_SNDBUF, v);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_never_goes_back() {
        let a = mono_ns();
        let b = mono_ns();
        assert!(a > 0 && b >= a);
    }

    #[test]
    fn an_ipv4_address_round_trips_through_bind_and_getsockname() {
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
        assert!(fd >= 0);
        let (ss, len) = sockaddr(&"127.0.0.1:0".parse().unwrap());
        assert_eq!(unsafe { libc::bind(fd, &ss as *const _ as *const libc::sockaddr, len) }, 0);
        let mut out: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut olen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        unsafe { libc::getsockname(fd, &mut out as *mut _ as *mut libc::sockaddr, &mut olen) };
        assert_eq!(u32::from_be(out.sin_addr.s_addr), 0x7f00_0001);
        assert_ne!(out.sin_port, 0);
        // The plain size is always granted, doubled by the kernel, up to its cap.
        set_buffers(fd, 64 << 10);
        let mut got: libc::c_int = 0;
        let mut glen = 4 as libc::socklen_t;
        unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &mut got as *mut _ as *mut libc::c_void, &mut glen) };
        assert!(got >= 64 << 10, "{got}");
        unsafe { libc::close(fd) };
    }
}
