//! Sockets and handshakes: setting sockets up for the pump (epoll, buffers,
//! modes), addresses, and the TCP and UDP handshakes a remote end opens a
//! channel with.

use super::*;

pub(super) fn tid() -> i32 {
    thread_local! {
        static TID: i32 = unsafe { libc::syscall(libc::SYS_gettid) as i32 };
    }
    TID.with(|t| *t)
}

/// A TCP connection's socket stays blocking, with timeouts: epoll says
/// when a frame has begun to arrive, and reading the rest of it then waits
/// in `read` as a raw receiver would (one system call per chunk, not a
/// read that finds nothing, an epoll_wait and a read again).
pub(super) fn conn_mode(s: &TcpStream) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))
}

pub(super) fn ep_add(epfd: RawFd, fd: RawFd, tok: u64) -> NetResult<()> {
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: tok };
    if unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        return Err(NetError::Os { what: "epoll_ctl".into(), source: std::io::Error::last_os_error() });
    }
    Ok(())
}

/// A datagram's sender, as a map key.

pub(super) fn src_of(a: &libc::sockaddr_storage) -> Src {
    if a.ss_family as i32 == libc::AF_INET6 {
        let s6 = unsafe { &*(a as *const _ as *const libc::sockaddr_in6) };
        (u128::from_be_bytes(s6.sin6_addr.s6_addr), u16::from_be(s6.sin6_port))
    } else {
        let s4 = unsafe { &*(a as *const _ as *const libc::sockaddr_in) };
        (u32::from_be(s4.sin_addr.s_addr) as u128, u16::from_be(s4.sin_port))
    }
}

pub(super) fn set_bufs(fd: RawFd, bytes: i32) {
    loopscope_os::set_buffers(fd, bytes as usize)
}

pub(super) fn peer_of(a: &libc::sockaddr_storage) -> Option<SocketAddr> {
    if a.ss_family as i32 == libc::AF_INET {
        let sin = unsafe { &*(a as *const _ as *const libc::sockaddr_in) };
        Some(SocketAddr::from((u32::from_be(sin.sin_addr.s_addr).to_be_bytes(), u16::from_be(sin.sin_port))))
    } else {
        None
    }
}

pub(super) fn handshake_tcp(addr: SocketAddr, kind: Kind, name: &str, timeout: Duration) -> NetResult<(TcpStream, Header)> {
    // A hub that is still starting refuses the connection: try again until
    // the timeout (a lab starts hubs and their users at about the same time).
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && Instant::now() + Duration::from_millis(50) < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(NetError::Peer(format!("cannot connect to the hub at {addr}: {e}"))),
        }
    };
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(timeout)).map_err(NetError::os("set_read_timeout"))?;
    let h = Header::new(kind, 0, 0, name.len());
    s.write_all(&h.bytes()).and_then(|_| s.write_all(name.as_bytes())).map_err(|e| NetError::Peer(format!("hub at {addr}: {e}")))?;
    let mut hb = [0u8; HDR];
    s.read_exact(&mut hb).map_err(|e| NetError::Peer(format!("the hub at {addr} did not answer within {timeout:?}: {e}")))?;
    let r = Header::read(&hb).ok_or_else(|| NetError::Peer(format!("the hub at {addr} answered with something that is not a loopscope channel frame")))?;
    if r.kind == Kind::Error as u8 {
        let mut msg = vec![0u8; r.len as usize];
        let _ = s.read_exact(&mut msg);
        return Err(NetError::Peer(format!("hub at {addr}: {}", String::from_utf8_lossy(&msg))));
    }
    s.set_read_timeout(None).map_err(NetError::os("set_read_timeout"))?;
    Ok((s, r))
}

pub(super) fn handshake_udp(addr: SocketAddr, kind: Kind, name: &str, timeout: Duration) -> NetResult<(UdpSocket, Header)> {
    let bind: SocketAddr = if addr.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
    let u = UdpSocket::bind(bind).map_err(NetError::os("binding the UDP client"))?;
    u.connect(addr).map_err(|e| NetError::Peer(format!("cannot reach the hub at {addr}: {e}")))?;
    set_bufs(u.as_raw_fd(), 8 << 20);
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 65536];
    loop {
        let h = Header::new(kind, 0, 0, name.len());
        let mut msg = h.bytes().to_vec();
        msg.extend_from_slice(name.as_bytes());
        u.send(&msg).map_err(|e| NetError::Peer(format!("hub at {addr}: {e}")))?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NetError::Peer(format!("the hub at {addr} did not answer within {timeout:?} (udp)")));
        }
        u.set_read_timeout(Some(left.min(Duration::from_millis(200)))).map_err(NetError::os("SO_RCVTIMEO"))?;
        match u.recv(&mut buf) {
            Ok(n) => {
                let r = Header::read(&buf[..n])
                    .ok_or_else(|| NetError::Peer(format!("the hub at {addr} answered with something that is not a loopscope channel frame")))?;
                if r.kind == Kind::Error as u8 {
                    return Err(NetError::Peer(format!("hub at {addr}: {}", String::from_utf8_lossy(&buf[HDR..n]))));
                }
                if r.kind == Kind::Opened as u8 || r.kind == Kind::Attached as u8 {
                    u.set_read_timeout(None).map_err(NetError::os("set_read_timeout"))?;
                    return Ok((u, r));
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                if Instant::now() >= deadline {
                    return Err(NetError::Peer(format!("nothing listens at {addr} (udp)")));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(NetError::Peer(format!("hub at {addr}: {e}"))),
        }
    }
}
