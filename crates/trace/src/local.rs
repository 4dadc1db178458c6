//! The calling thread's side of logging: its buffers and the hot path.
//!
//! Each thread reaches its buffers through one thread-local pointer with a
//! constant initialiser (no lazy-init check, no destructor on that slot). The
//! pointer is tagged with the epoch of the session that made the buffers; a
//! mismatch (first record of the thread, or a new session since) sends the
//! record down the cold path, which allocates this thread's rings for the
//! current session and registers them with its writer. A second thread-local
//! with a destructor marks the buffers as orphaned when the thread exits, so
//! the writer drains them and then frees them.

use crate::buffer::{Producer, Ring};
use crate::shared::{self, Shared, ThreadShared, EPOCH};
use std::cell::Cell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub(crate) struct ThreadState {
    epoch: u64,
    /// Stream 0's cursor, inline: the common single-stream case needs no
    /// further indirection.
    first: Producer,
    /// Streams 1.. .
    rest: Vec<Producer>,
    shared: Arc<ThreadShared>,
}

impl ThreadState {
    #[inline(always)]
    fn prod(&mut self, s: usize) -> Option<&mut Producer> {
        if s == 0 {
            Some(&mut self.first)
        } else {
            self.rest.get_mut(s - 1)
        }
    }
}

thread_local! {
    static LOCAL: Cell<*mut ThreadState> = const { Cell::new(null_mut()) };
    static GUARD: Guard = const { Guard };
}

struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        let p = LOCAL.with(|c| c.replace(null_mut()));
        if !p.is_null() {
            let st = unsafe { Box::from_raw(p) };
            st.shared.exited.store(true, Ordering::Release);
        }
    }
}

/// Log a record of two or three words to every stream in `mask`.
///
/// The fast path (one stream, buffers current, room in the block) is written
/// out here with each word stored from its register: passing the record as
/// an array made the compiler spill it to the stack and copy it with one
/// 16-byte load, which stalls on store forwarding (a third of the cost). The
/// cold path takes the words by value for the same reason.
#[inline(always)]
pub(crate) fn emit2(mask: u32, w0: u64, w1: u64) {
    if let Some((dst, np, head)) = reserve(mask, 16) {
        unsafe {
            dst.write(w0);
            dst.add(1).write(w1);
            (*head).store(np, Ordering::Release);
        }
        return;
    }
    emit_cold2(mask, w0, w1);
}

/// See [`emit2`].
#[inline(always)]
pub(crate) fn emit3(mask: u32, w0: u64, w1: u64, w2: u64) {
    if let Some((dst, np, head)) = reserve(mask, 24) {
        unsafe {
            dst.write(w0);
            dst.add(1).write(w1);
            dst.add(2).write(w2);
            (*head).store(np, Ordering::Release);
        }
        return;
    }
    emit_cold3(mask, w0, w1, w2);
}

/// Room for `size` bytes in stream 0 of the current session, without any
/// slow-path work: (where to write, the head to publish, the head itself).
#[inline(always)]
fn reserve(mask: u32, size: u64) -> Option<(*mut u64, u64, *const std::sync::atomic::AtomicU64)> {
    let st = LOCAL.with(|c| c.get());
    if mask != 1 || st.is_null() {
        return None;
    }
    let st = unsafe { &mut *st };
    if st.epoch != EPOCH.load(Ordering::Relaxed) {
        return None;
    }
    let p = &mut st.first;
    let pos = p.pos;
    let np = pos + size;
    if np > p.end {
        return None;
    }
    p.pos = np;
    Some((unsafe { p.base.add(((pos >> 3) & p.wmask) as usize) }, np, p.head))
}

#[cold]
#[inline(never)]
fn emit_cold2(mask: u32, w0: u64, w1: u64) {
    emit_cold(mask, [w0, w1]);
}

#[cold]
#[inline(never)]
fn emit_cold3(mask: u32, w0: u64, w1: u64, w2: u64) {
    emit_cold(mask, [w0, w1, w2]);
}

fn emit_cold<const N: usize>(mask: u32, w: [u64; N]) {
    let mut st = LOCAL.with(|c| c.get());
    unsafe {
        if st.is_null() || (*st).epoch != EPOCH.load(Ordering::Relaxed) {
            match attach() {
                Some(s) => st = s,
                None => return,
            }
        }
        let st = &mut *st;
        let mut m = mask;
        while m != 0 {
            let s = m.trailing_zeros() as usize;
            m &= m - 1;
            if let Some(p) = st.prod(s) {
                p.write(w);
            }
        }
    }
}

/// Log a variable-size record (`head` words, then `tail` bytes).
pub(crate) fn emit_var(mask: u32, head: &[u64], tail: &[u8]) {
    let st = LOCAL.with(|c| c.get());
    unsafe {
        if st.is_null() || (*st).epoch != EPOCH.load(Ordering::Relaxed) {
            return emit_slow(mask, head, tail);
        }
        write_all(&mut *st, mask, head, tail);
    }
}

fn write_all(st: &mut ThreadState, mask: u32, head: &[u64], tail: &[u8]) {
    let mut m = mask;
    while m != 0 {
        let s = m.trailing_zeros() as usize;
        m &= m - 1;
        if let Some(p) = st.prod(s) {
            p.write_var(head, tail);
        }
    }
}

#[cold]
#[inline(never)]
fn emit_slow(mask: u32, head: &[u64], tail: &[u8]) {
    if let Some(st) = attach() {
        write_all(unsafe { &mut *st }, mask, head, tail);
    }
}

/// Allocate (and pre-fault) the calling thread's buffers now, so that its
/// first record does not pay for it. Returns false when no trace is open.
pub fn prepare_thread() -> bool {
    let st = LOCAL.with(|c| c.get());
    if !st.is_null() && unsafe { (*st).epoch } == EPOCH.load(Ordering::Relaxed) {
        return true;
    }
    attach().is_some()
}

/// Make this thread's buffers for the current session. None when no session
/// is open or the thread is being torn down (the record is then counted lost).
fn attach() -> Option<*mut ThreadState> {
    let shared = shared::current()?;
    let old = LOCAL.with(|c| c.replace(null_mut()));
    if !old.is_null() {
        let st = unsafe { Box::from_raw(old) };
        st.shared.exited.store(true, Ordering::Release);
    }
    if GUARD.try_with(|_| ()).is_err() {
        shared.lost_unattached.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    let st = Box::new(new_state(&shared));
    let p = Box::into_raw(st);
    LOCAL.with(|c| c.set(p));
    Some(p)
}

fn new_state(shared: &Arc<Shared>) -> ThreadState {
    let rings = shared.config.streams.iter().map(|s| Ring::new(s.buffer_bytes(), s.kind == crate::config::StreamKind::Ring)).collect();
    let ts =
        shared.add_thread(|index| ThreadShared { index, tid: unsafe { libc::gettid() } as u32, name: thread_name(), rings, exited: AtomicBool::new(false) });
    let first = ts.rings[0].producer();
    let rest = ts.rings[1..].iter().map(|r| r.producer()).collect();
    ThreadState { epoch: shared.epoch, first, rest, shared: ts }
}

fn thread_name() -> String {
    let mut buf = [0u8; 32];
    unsafe { libc::prctl(libc::PR_GET_NAME, buf.as_mut_ptr() as libc::c_ulong, 0, 0, 0) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
