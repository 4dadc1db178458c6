//! PACKET_MMAP rings for a router port: frames in and out without a system
//! call per frame.
//!
//! RX: the kernel writes each arriving frame into the next slot of a ring
//! shared with this process and flips the slot's status to "user"; the
//! emulator reads frames straight from memory (the kernel's receive stamp
//! is in the slot's header) and hands the slot back. A poll(2) on the
//! socket still wakes it when the ring goes from empty to not.
//!
//! TX: the emulator writes every frame that is due into the TX ring and
//! then asks the kernel to send the whole batch with one `send(fd, NULL,
//! 0)`. A slot comes back once the kernel is done with its frame (a veth
//! peer may hold it until the receiving socket consumes it); when no slot
//! is free the caller sends that frame the ordinary way, so a slow
//! receiver costs speed, never frames.
//!
//! Version 2 of the ring format, not 3: a version-3 RX ring hands frames
//! over a block at a time, when the block fills or its retire timer (1 ms
//! at the least) expires, which would add up to a millisecond to a link at
//! low rates. Version 2 hands over each frame as it lands.

use crate::error::NetemError;
use std::sync::atomic::{fence, Ordering};

const SOL_PACKET: i32 = 263;
const PACKET_RX_RING: i32 = 5;
const PACKET_VERSION: i32 = 10;
const PACKET_TX_RING: i32 = 13;
const TPACKET_V2: i32 = 1;

pub const TP_STATUS_KERNEL: u32 = 0;
pub const TP_STATUS_USER: u32 = 1;
pub const TP_STATUS_COPY: u32 = 2;
pub const TP_STATUS_AVAILABLE: u32 = 0;
pub const TP_STATUS_SEND_REQUEST: u32 = 1;
pub const TP_STATUS_SENDING: u32 = 2;
pub const TP_STATUS_WRONG_FORMAT: u32 = 4;
pub const TP_STATUS_TS_SOFTWARE: u32 = 1 << 29;

/// `struct tpacket2_hdr` (linux/if_packet.h).
#[repr(C)]
struct Tpacket2Hdr {
    tp_status: u32,
    tp_len: u32,
    tp_snaplen: u32,
    tp_mac: u16,
    tp_net: u16,
    tp_sec: u32,
    tp_nsec: u32,
    tp_vlan_tci: u16,
    tp_vlan_tpid: u16,
    tp_padding: [u8; 4],
}

#[repr(C)]
struct TpacketReq {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
}

/// Header (32 bytes, aligned to 16) then a sockaddr_ll: where TX data starts
/// is the header length minus the address (linux/if_packet.h, TPACKET2_HDRLEN).
const HDR: usize = 32;
const SLL_PKTTYPE: usize = HDR + 10;
pub const FRAME_SIZE: usize = 2048;
const BLOCK_SIZE: usize = 1 << 20;

pub struct Ring {
    base: *mut u8,
    frames: usize,
    head: usize,
}

// The ring is only touched by the one forwarding thread.
unsafe impl Send for Ring {}

impl Ring {
    fn slot(&self, i: usize) -> *mut Tpacket2Hdr {
        unsafe { self.base.add(i * FRAME_SIZE) as *mut Tpacket2Hdr }
    }

    fn status(&self, i: usize) -> u32 {
        let s = unsafe { std::ptr::read_volatile(&(*self.slot(i)).tp_status) };
        fence(Ordering::Acquire);
        s
    }

    fn set_status(&self, i: usize, v: u32) {
        fence(Ordering::Release);
        unsafe { std::ptr::write_volatile(&mut (*self.slot(i)).tp_status, v) };
    }
}

/// A port's two rings and their one mapping.
pub struct Rings {
    map: *mut libc::c_void,
    len: usize,
    pub rx: Ring,
    pub tx: Ring,
    /// Frames written to the TX ring since the last flush.
    pub tx_queued: usize,
}

unsafe impl Send for Rings {}

/// What came out of the RX ring.
pub enum RxFrame {
    /// A frame for this host: its length (copied into the buffer) and the
    /// kernel's receive stamp (CLOCK_REALTIME ns, 0 if it had none).
    Frame(usize, i64),
    /// A frame not addressed to this interface (broadcast, another host's).
    Skipped,
    /// A frame longer than a ring slot holds: dropped, and counted.
    Truncated,
}

fn frames_for(bytes: usize) -> (usize, usize) {
    let blocks = (bytes / BLOCK_SIZE).max(1);
    (blocks, blocks * (BLOCK_SIZE / FRAME_SIZE))
}

impl Rings {
    /// Set a fresh (unbound) packet socket up with an RX ring of about
    /// `rx_bytes` and a TX ring of about `tx_bytes`, and map both.
    pub fn setup(fd: i32, rx_bytes: usize, tx_bytes: usize) -> crate::error::Result<Rings> {
        let set = |opt: i32, v: *const libc::c_void, n: usize| unsafe { libc::setsockopt(fd, SOL_PACKET, opt, v, n as u32) };
        let v = TPACKET_V2;
        if set(PACKET_VERSION, &v as *const i32 as *const libc::c_void, 4) < 0 {
            return Err(NetemError::refused("PACKET_VERSION 2"));
        }
        let (rb, rf) = frames_for(rx_bytes);
        let (tb, tf) = frames_for(tx_bytes);
        for (opt, blocks, frames, what) in [(PACKET_RX_RING, rb, rf, "RX"), (PACKET_TX_RING, tb, tf, "TX")] {
            let req = TpacketReq { block_size: BLOCK_SIZE as u32, block_nr: blocks as u32, frame_size: FRAME_SIZE as u32, frame_nr: frames as u32 };
            if set(opt, &req as *const TpacketReq as *const libc::c_void, std::mem::size_of::<TpacketReq>()) < 0 {
                return Err(NetemError::refused(format!("PACKET_{what}_RING of {frames} frames")));
            }
        }
        let len = (rb + tb) * BLOCK_SIZE;
        let map = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_LOCKED, fd, 0) };
        let map = if map == libc::MAP_FAILED {
            // MAP_LOCKED needs RLIMIT_MEMLOCK room; unlocked rings still work.
            let m = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
            if m == libc::MAP_FAILED {
                return Err(NetemError::refused(format!("mapping the rings ({} MiB)", len >> 20)));
            }
            m
        } else {
            map
        };
        let base = map as *mut u8;
        Ok(Rings {
            map,
            len,
            rx: Ring { base, frames: rf, head: 0 },
            tx: Ring { base: unsafe { base.add(rb * BLOCK_SIZE) }, frames: tf, head: 0 },
            tx_queued: 0,
        })
    }

    /// Is a frame waiting in the RX ring? (No system call.)
    pub fn rx_ready(&self) -> bool {
        self.rx.status(self.rx.head) & TP_STATUS_USER != 0
    }

    /// The next received frame, copied into `buf`, its slot handed back.
    pub fn recv(&mut self, buf: &mut [u8]) -> Option<RxFrame> {
        let i = self.rx.head;
        let st = self.rx.status(i);
        if st & TP_STATUS_USER == 0 {
            return None;
        }
        let h = self.rx.slot(i);
        let out = unsafe {
            let pkttype = *(h as *const u8).add(SLL_PKTTYPE);
            let snap = (*h).tp_snaplen as usize;
            if pkttype != 0 {
                RxFrame::Skipped
            } else if st & TP_STATUS_COPY != 0 || snap < (*h).tp_len as usize || snap > buf.len() {
                RxFrame::Truncated
            } else {
                let data = (h as *const u8).add((*h).tp_mac as usize);
                std::ptr::copy_nonoverlapping(data, buf.as_mut_ptr(), snap);
                let ts = if st & TP_STATUS_TS_SOFTWARE != 0 { (*h).tp_sec as i64 * 1_000_000_000 + (*h).tp_nsec as i64 } else { 0 };
                RxFrame::Frame(snap, ts)
            }
        };
        self.rx.set_status(i, TP_STATUS_KERNEL);
        self.rx.head = (i + 1) % self.rx.frames;
        Some(out)
    }

    /// Write a frame into the next TX slot; false when the slot is still the
    /// kernel's (the caller flushes and retries, then sends it directly).
    /// A slot the kernel marked malformed is counted in `refused`.
    pub fn queue(&mut self, frame: &[u8], refused: &mut u64) -> bool {
        let i = self.tx.head;
        let st = self.tx.status(i);
        if st == TP_STATUS_WRONG_FORMAT {
            *refused += 1;
        } else if st != TP_STATUS_AVAILABLE {
            return false;
        }
        if HDR + frame.len() > FRAME_SIZE {
            return false;
        }
        let h = self.tx.slot(i);
        unsafe {
            std::ptr::copy_nonoverlapping(frame.as_ptr(), (h as *mut u8).add(HDR), frame.len());
            (*h).tp_len = frame.len() as u32;
        }
        self.tx.set_status(i, TP_STATUS_SEND_REQUEST);
        self.tx.head = (i + 1) % self.tx.frames;
        self.tx_queued += 1;
        true
    }

    /// Send everything queued with one system call.
    pub fn flush(&mut self, fd: i32) -> bool {
        if self.tx_queued == 0 {
            return true;
        }
        self.tx_queued = 0;
        let r = unsafe { libc::send(fd, std::ptr::null(), 0, libc::MSG_DONTWAIT) };
        r >= 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN)
    }
}

impl Drop for Rings {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.map, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_header_has_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<Tpacket2Hdr>(), HDR);
        assert_eq!(std::mem::size_of::<TpacketReq>(), 16);
    }

    #[test]
    fn ring_sizes_are_whole_blocks_of_whole_frames() {
        assert_eq!(frames_for(8 << 20), (8, 8 * 512));
        assert_eq!(frames_for(1000), (1, 512));
    }
}
