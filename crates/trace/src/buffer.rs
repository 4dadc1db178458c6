//! Per-thread record buffers: single-producer rings of 8-byte words.
//!
//! Each logging thread owns one ring per stream. Positions are byte counts
//! that only grow; a position's slot is `pos % capacity`. The producer (the
//! logging thread) writes records at `head` and publishes the new head with a
//! release store; the writer thread reads `[tail, head)` and publishes the new
//! tail. Nothing on the producer's path locks, allocates or enters the kernel.
//!
//! The ring is cut into 64 KiB blocks and a record never crosses a block
//! boundary: when one does not fit, the producer writes a one-word PAD marker
//! and continues at the next block. So every block start is a record start,
//! which is what lets a flight-recorder dump begin at any block of a ring that
//! has been overwriting itself, and lets the writer turn any block into a
//! self-contained data chunk.
//!
//! A normal ring never overwrites: when it is full the record is dropped and
//! counted in `lost`. A flight-recorder ring overwrites its oldest blocks.

use crate::format::{rec, BLOCK};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};

#[repr(align(64))]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The memory of one ring and the positions both sides share.
pub(crate) struct Ring {
    ptr: *mut u64,
    pub cap: u64,
    pub overwrite: bool,
    /// Published by the producer: records below are complete.
    pub head: Padded<AtomicU64>,
    /// Published by the writer: bytes below are consumed (normal rings).
    pub tail: Padded<AtomicU64>,
    /// Records dropped because the ring was full (written by the producer only).
    pub lost: Padded<AtomicU64>,
}

unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

impl Ring {
    /// Allocate `cap` bytes (a power-of-two number of blocks) and touch every
    /// page so the hot path never takes a page fault on it.
    pub fn new(cap: u64, overwrite: bool) -> Ring {
        assert!(cap.is_power_of_two() && cap >= BLOCK);
        let layout = Layout::from_size_align(cap as usize, 4096).unwrap();
        let ptr = unsafe { alloc_zeroed(layout) } as *mut u64;
        assert!(!ptr.is_null(), "trace buffer allocation of {cap} bytes failed");
        let mut i = 0;
        while i < cap as usize / 8 {
            unsafe { ptr.add(i).write_volatile(0) };
            i += 512;
        }
        Ring { ptr, cap, overwrite, head: Padded(AtomicU64::new(0)), tail: Padded(AtomicU64::new(0)), lost: Padded(AtomicU64::new(0)) }
    }

    /// The bytes of positions `[a, b)`, which must lie within one block.
    ///
    /// # Safety
    /// The caller must know the producer is not writing there: below the
    /// published head for a normal ring; for an overwriting ring the caller
    /// validates the copy against the head afterwards.
    pub unsafe fn bytes(&self, a: u64, b: u64) -> &[u8] {
        debug_assert!(b >= a && b - a <= BLOCK && (a / BLOCK == (b - 1) / BLOCK || a == b));
        let off = (a & (self.cap - 1)) as usize;
        std::slice::from_raw_parts((self.ptr as *const u8).add(off), (b - a) as usize)
    }

    pub fn producer(&self) -> Producer {
        let mut p = Producer { base: self.ptr, wmask: self.cap / 8 - 1, pos: 0, end: 0, head: &self.head.0 as *const AtomicU64, ring: self as *const Ring };
        p.end = p.limit_in_block(p.pos);
        p
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        unsafe { dealloc(self.ptr as *mut u8, Layout::from_size_align(self.cap as usize, 4096).unwrap()) };
    }
}

/// The producing thread's private cursor into one ring.
pub(crate) struct Producer {
    pub(crate) base: *mut u64,
    pub(crate) wmask: u64,
    pub(crate) pos: u64,
    /// Records ending at or below `end` fit without further checks.
    pub(crate) end: u64,
    /// `&ring.head`, kept here so the hot path stores it without another load.
    pub(crate) head: *const AtomicU64,
    ring: *const Ring,
}

impl Producer {
    #[inline(always)]
    fn ring<'a>(&self) -> &'a Ring {
        // The ring outlives its producer: both belong to the thread's state,
        // and the writer's reference keeps the ring alive after that.
        unsafe { &*self.ring }
    }

    fn limit_in_block(&self, pos: u64) -> u64 {
        let blk_end = (pos | (BLOCK - 1)) + 1;
        let r = self.ring();
        if r.overwrite {
            blk_end
        } else {
            blk_end.min(r.tail.load(Ordering::Acquire) + r.cap)
        }
    }

    /// Write a fixed-size record.
    #[inline(always)]
    pub fn write<const N: usize>(&mut self, w: [u64; N]) {
        let size = (N * 8) as u64;
        if self.pos + size > self.end && !self.make_room(size) {
            return;
        }
        unsafe {
            let dst = self.base.add(((self.pos >> 3) & self.wmask) as usize);
            for (i, x) in w.iter().enumerate() {
                dst.add(i).write(*x);
            }
        }
        self.pos += size;
        self.ring().head.store(self.pos, Ordering::Release);
    }

    /// Write a record of `head` words followed by `tail` (padded to 8 bytes).
    pub fn write_var(&mut self, head: &[u64], tail: &[u8]) {
        let size = (head.len() * 8 + tail.len().div_ceil(8) * 8) as u64;
        if size > BLOCK || (self.pos + size > self.end && !self.make_room(size)) {
            if size > BLOCK {
                self.count_lost();
            }
            return;
        }
        unsafe {
            let dst = self.base.add(((self.pos >> 3) & self.wmask) as usize);
            for (i, x) in head.iter().enumerate() {
                dst.add(i).write(*x);
            }
            let bytes = dst.add(head.len()) as *mut u8;
            std::ptr::copy_nonoverlapping(tail.as_ptr(), bytes, tail.len());
            let pad = tail.len().div_ceil(8) * 8 - tail.len();
            std::ptr::write_bytes(bytes.add(tail.len()), 0, pad);
        }
        self.pos += size;
        self.ring().head.store(self.pos, Ordering::Release);
    }

    fn count_lost(&self) {
        let l = &self.ring().lost;
        l.store(l.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Slow path: move to the next block when the record does not fit in this
    /// one, and refresh the free space from the writer's tail. Returns false
    /// (and counts the record as lost) when the ring is full.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self, size: u64) -> bool {
        let blk_end = (self.pos | (BLOCK - 1)) + 1;
        if self.pos + size > blk_end {
            let r = self.ring();
            let limit = if r.overwrite { u64::MAX } else { r.tail.load(Ordering::Acquire) + r.cap };
            if self.pos + 8 > limit {
                self.end = self.pos;
                self.count_lost();
                return false;
            }
            unsafe {
                let dst = self.base.add(((self.pos >> 3) & self.wmask) as usize);
                dst.write(rec::word0(rec::PAD, 0, 0));
            }
            self.pos = blk_end;
            // Publish the skip so a flight-recorder dump never waits on it.
            r.head.store(self.pos, Ordering::Release);
        }
        self.end = self.limit_in_block(self.pos);
        if self.pos + size > self.end {
            self.count_lost();
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(r: &Ring, a: u64, b: u64) -> Vec<u64> {
        unsafe { r.bytes(a, b) }.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn records_are_published_in_order() {
        let r = Ring::new(4 * BLOCK, false);
        let mut p = r.producer();
        p.write([1, 2]);
        p.write([3, 4, 5]);
        assert_eq!(r.head.load(Ordering::Acquire), 40);
        assert_eq!(words(&r, 0, 40), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_full_normal_ring_drops_and_counts() {
        let r = Ring::new(4 * BLOCK, false);
        let mut p = r.producer();
        let n = 4 * BLOCK / 16;
        for i in 0..n + 10 {
            p.write([i, i]);
        }
        assert_eq!(r.head.load(Ordering::Acquire), 4 * BLOCK);
        assert_eq!(r.lost.load(Ordering::Relaxed), 10);
        // The writer consumes one block; the producer can continue.
        r.tail.store(BLOCK, Ordering::Release);
        p.write([7, 7]);
        assert_eq!(r.head.load(Ordering::Acquire), 4 * BLOCK + 16);
    }

    #[test]
    fn records_never_straddle_a_block_boundary() {
        let r = Ring::new(4 * BLOCK, false);
        let mut p = r.producer();
        for i in 0..(BLOCK / 24) {
            p.write([i, i, i]);
        }
        let before = r.head.load(Ordering::Acquire);
        assert!(before + 24 > BLOCK && before < BLOCK);
        p.write([9, 9, 9]);
        assert_eq!(r.head.load(Ordering::Acquire), BLOCK + 24);
        assert_eq!(words(&r, before, before + 8)[0] as u32 >> 24, rec::PAD);
    }

    #[test]
    fn an_overwriting_ring_keeps_going() {
        let r = Ring::new(4 * BLOCK, true);
        let mut p = r.producer();
        for i in 0..(20 * BLOCK / 16) {
            p.write([i, i]);
        }
        assert_eq!(r.head.load(Ordering::Acquire), 20 * BLOCK);
        assert_eq!(r.lost.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn variable_records_are_padded_to_words() {
        let r = Ring::new(4 * BLOCK, false);
        let mut p = r.producer();
        p.write_var(&[1, 2, 3], b"hello");
        assert_eq!(r.head.load(Ordering::Acquire), 32);
        let b = unsafe { r.bytes(24, 32) };
        assert_eq!(b, b"hello\0\0\0");
    }
}
