//! One router interface: an AF_PACKET socket bound to it.
//!
//! The socket sees every frame arriving on the interface with the kernel's
//! receive timestamp (SO_TIMESTAMPNS, CLOCK_REALTIME), skips the frames it
//! sends itself (PACKET_IGNORE_OUTGOING) and is non-blocking: the emulator
//! polls all its ports and its departure queue from one thread.

use std::ffi::CString;

const SOL_PACKET: i32 = 263;
const PACKET_IGNORE_OUTGOING: i32 = 23;
const SO_TIMESTAMPNS: i32 = 35;
const SO_RCVBUFFORCE: i32 = 33;
const SO_SNDBUFFORCE: i32 = 32;
const PACKET_HOST: u8 = 0;

pub struct Port {
    pub fd: i32,
    pub name: String,
    pub ifindex: i32,
    pub mac: [u8; 6],
}

fn errno_text(what: &str, name: &str) -> String {
    format!("{what} {name}: {}", std::io::Error::last_os_error())
}

impl Port {
    pub fn open(name: &str, bufsize: usize) -> Result<Port, String> {
        let cname = CString::new(name).map_err(|_| format!("bad interface name {name:?}"))?;
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) } as i32;
        if ifindex == 0 {
            return Err(format!("no interface {name} in this network namespace"));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, proto) };
        if fd < 0 {
            return Err(errno_text("cannot open a packet socket for", name));
        }
        let port = Port { fd, name: name.to_string(), ifindex, mac: [0; 6] };
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto as u16;
        sll.sll_ifindex = ifindex;
        if unsafe { libc::bind(fd, &sll as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_ll>() as u32) } < 0 {
            return Err(errno_text("cannot bind a packet socket to", name));
        }
        let one: i32 = 1;
        let set = |level: i32, opt: i32, v: i32| unsafe { libc::setsockopt(fd, level, opt, &v as *const i32 as *const libc::c_void, 4) };
        if set(SOL_PACKET, PACKET_IGNORE_OUTGOING, one) < 0 {
            return Err(errno_text("PACKET_IGNORE_OUTGOING (kernel 4.20+) failed on", name));
        }
        if set(libc::SOL_SOCKET, SO_TIMESTAMPNS, one) < 0 {
            return Err(errno_text("SO_TIMESTAMPNS failed on", name));
        }
        let b = bufsize.min(i32::MAX as usize) as i32;
        if set(libc::SOL_SOCKET, SO_RCVBUFFORCE, b) < 0 {
            set(libc::SOL_SOCKET, libc::SO_RCVBUF, b);
        }
        if set(libc::SOL_SOCKET, SO_SNDBUFFORCE, b) < 0 {
            set(libc::SOL_SOCKET, libc::SO_SNDBUF, b);
        }
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (i, c) in name.bytes().take(libc::IFNAMSIZ - 1).enumerate() {
            req.ifr_name[i] = c as libc::c_char;
        }
        if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req) } < 0 {
            return Err(errno_text("cannot read the MAC address of", name));
        }
        let mut port = port;
        let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
        for i in 0..6 {
            port.mac[i] = sa.sa_data[i] as u8;
        }
        Ok(port)
    }

    /// One frame addressed to this interface, if any is waiting:
    /// (length, kernel RX time in CLOCK_REALTIME ns, 0 if absent).
    /// Frames for other hosts, broadcasts and multicasts are skipped
    /// (`skipped` counts them); the kernel answers ARP itself.
    pub fn recv(&self, buf: &mut [u8], skipped: &mut u64) -> Option<(usize, i64)> {
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

    pub fn send(&self, frame: &[u8]) -> bool {
        unsafe { libc::send(self.fd, frame.as_ptr() as *const libc::c_void, frame.len(), libc::MSG_DONTWAIT) == frame.len() as isize }
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}
