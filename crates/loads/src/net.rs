//! The network load: a UDP or TCP stream, paced or as fast as it goes.
//!
//! Each worker sends to `dest`, or, without one, to a sink of its own on
//! loopback drained by a thread of its own (so a load needs nothing else
//! running). UDP sends `size`-byte datagrams and TCP writes `size`-byte
//! chunks, at `rate_bps` on absolute deadlines (bursts of up to 32 when
//! behind, so the average holds without drift) or unlimited. The kernel's
//! loopback path, softirq processing, socket buffers and, for TCP, its
//! congestion control are what this load exercises (the role of ettcp in
//! Boie & Niehaus 2007).

use crate::error::{LoadError, Result};
use crate::Work;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Udp,
    Tcp,
}

enum Tx {
    Udp(UdpSocket),
    Tcp(TcpStream),
}

pub(crate) struct NetWork {
    tx: Tx,
    buf: Vec<u8>,
    gap: Option<Duration>,
    next: Instant,
    done: Arc<AtomicBool>,
    sink: Option<std::thread::JoinHandle<()>>,
}

fn udp_sink(done: Arc<AtomicBool>) -> Result<(SocketAddr, std::thread::JoinHandle<()>)> {
    let rx = UdpSocket::bind("127.0.0.1:0").map_err(LoadError::socket("cannot bind the UDP sink on 127.0.0.1"))?;
    rx.set_read_timeout(Some(Duration::from_millis(100))).map_err(LoadError::socket("SO_RCVTIMEO of the UDP sink"))?;
    let addr = rx.local_addr().map_err(LoadError::socket("the UDP sink's address"))?;
    let h = std::thread::spawn(move || {
        let mut b = vec![0u8; 65536];
        while !done.load(Ordering::Relaxed) {
            let _ = rx.recv(&mut b);
        }
    });
    Ok((addr, h))
}

fn tcp_sink(done: Arc<AtomicBool>) -> Result<(SocketAddr, std::thread::JoinHandle<()>)> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(LoadError::socket("cannot listen on 127.0.0.1 for the TCP sink"))?;
    let addr = l.local_addr().map_err(LoadError::socket("the TCP sink's address"))?;
    let h = std::thread::spawn(move || {
        if let Ok((mut c, _)) = l.accept() {
            c.set_read_timeout(Some(Duration::from_millis(100))).ok();
            let mut b = vec![0u8; 1 << 16];
            while !done.load(Ordering::Relaxed) {
                match c.read(&mut b) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(_) => break,
                }
            }
        }
    });
    Ok((addr, h))
}

impl NetWork {
    pub fn new(protocol: Protocol, rate_bps: Option<f64>, size: usize, dest: Option<SocketAddr>) -> Result<NetWork> {
        if let Some(r) = rate_bps {
            if !(r > 0.0) {
                return Err(LoadError::Input(format!("net load rate must be positive [got {r}]")));
            }
        }
        let size = match protocol {
            Protocol::Udp => size.clamp(1, 65507),
            Protocol::Tcp => size.max(1),
        };
        let done = Arc::new(AtomicBool::new(false));
        let (to, sink) = match dest {
            Some(d) => (d, None),
            None => {
                let (a, h) = if protocol == Protocol::Udp { udp_sink(done.clone())? } else { tcp_sink(done.clone())? };
                (a, Some(h))
            }
        };
        let tx = match protocol {
            Protocol::Udp => {
                let s = UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).map_err(LoadError::socket("cannot bind the UDP sender"))?;
                s.connect(to).map_err(LoadError::socket(format!("{to}: cannot connect")))?;
                Tx::Udp(s)
            }
            Protocol::Tcp => {
                let s = TcpStream::connect_timeout(&to, Duration::from_secs(5)).map_err(LoadError::socket(format!("{to}: cannot connect")))?;
                s.set_write_timeout(Some(Duration::from_millis(200))).ok();
                Tx::Tcp(s)
            }
        };
        let gap = rate_bps.map(|r| Duration::from_secs_f64((size * 8) as f64 / r));
        Ok(NetWork { tx, buf: vec![0x5a; size], gap, next: Instant::now(), done, sink })
    }
}

impl Work for NetWork {
    fn step(&mut self) -> Result<u64> {
        if self.gap.is_some() {
            let now = Instant::now();
            if now < self.next {
                std::thread::sleep(self.next - now);
            }
        }
        let mut n = 0;
        loop {
            match &mut self.tx {
                // A full socket buffer drops a datagram: that is loopback's behaviour, not an error.
                Tx::Udp(s) => {
                    let _ = s.send(&self.buf);
                }
                Tx::Tcp(s) => match s.write_all(&self.buf) {
                    Ok(()) => {}
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(e) => return Err(LoadError::Socket { what: "the TCP stream broke".into(), source: e }),
                },
            }
            n += 1;
            match self.gap {
                Some(gap) => {
                    self.next += gap;
                    if n >= 32 || Instant::now() < self.next {
                        break;
                    }
                }
                None => {
                    if n >= 32 {
                        break;
                    }
                }
            }
        }
        Ok(n)
    }
}

impl Drop for NetWork {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Tx::Tcp(s) = &self.tx {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(h) = self.sink.take() {
            let _ = h.join();
        }
    }
}
