//! The network load: paced UDP datagrams to a sink on loopback.
//!
//! Each worker binds a sink socket on 127.0.0.1 drained by a thread of its
//! own and sends `size`-byte datagrams to it at `rate` per second, in bursts
//! of up to 32 on absolute deadlines (so the rate holds on average without
//! drift). The kernel's loopback path, softirq processing and socket
//! buffers are what this load exercises.

use crate::Work;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) struct NetWork {
    tx: UdpSocket,
    buf: Vec<u8>,
    gap: Duration,
    next: Instant,
    done: Arc<AtomicBool>,
    sink: Option<std::thread::JoinHandle<()>>,
}

impl NetWork {
    pub fn new(rate: f64, size: usize) -> Result<NetWork, String> {
        if !(rate > 0.0) {
            return Err(format!("net load rate must be positive [got {rate}]"));
        }
        let rx = UdpSocket::bind("127.0.0.1:0").map_err(|e| format!("cannot bind the UDP sink on 127.0.0.1: {e}"))?;
        rx.set_read_timeout(Some(Duration::from_millis(100))).map_err(|e| e.to_string())?;
        let addr = rx.local_addr().map_err(|e| e.to_string())?;
        let tx = UdpSocket::bind("127.0.0.1:0").map_err(|e| format!("cannot bind the UDP sender: {e}"))?;
        tx.connect(addr).map_err(|e| e.to_string())?;
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let sink = std::thread::spawn(move || {
            let mut b = vec![0u8; 65536];
            while !d2.load(Ordering::Relaxed) {
                let _ = rx.recv(&mut b);
            }
        });
        Ok(NetWork { tx, buf: vec![0x5a; size.clamp(1, 65507)], gap: Duration::from_secs_f64(1.0 / rate), next: Instant::now(), done, sink: Some(sink) })
    }
}

impl Work for NetWork {
    fn step(&mut self) -> Result<u64, String> {
        let now = Instant::now();
        if now < self.next {
            std::thread::sleep(self.next - now);
        }
        let mut n = 0;
        while n < 32 && Instant::now() >= self.next {
            // A full socket buffer drops the datagram: that is loopback's behaviour, not an error.
            let _ = self.tx.send(&self.buf);
            self.next += self.gap;
            n += 1;
        }
        Ok(n)
    }
}

impl Drop for NetWork {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(h) = self.sink.take() {
            let _ = h.join();
        }
    }
}
