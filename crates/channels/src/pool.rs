//! Recycled item buffers. A received item's buffer comes from here and
//! goes back when the last reference to the item is dropped, so a stream
//! of large items (frames) does not map, fault in and unmap fresh memory for
//! every one: at 1 MiB that was most of what a channel cost over raw
//! sockets. Small buffers are left to the allocator.

use std::sync::Mutex;

const MIN: usize = 16 << 10;
const KEEP: usize = 16;

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A buffer of `len` bytes (contents unspecified: the caller fills it).
pub fn take(len: usize) -> Vec<u8> {
    if len >= MIN {
        let mut p = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = p.iter().rposition(|b| b.capacity() >= len && b.capacity() <= 2 * len) {
            let mut b = p.remove(i);
            drop(p);
            if b.len() >= len {
                b.truncate(len);
            } else {
                b.resize(len, 0);
            }
            return b;
        }
    }
    vec![0u8; len]
}

/// Give a buffer back.
pub fn give(b: Vec<u8>) {
    if b.capacity() >= MIN {
        let mut p = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() < KEEP {
            p.push(b);
        }
    }
}
