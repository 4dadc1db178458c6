//! The channel runtime's own instrumentation, at its layer boundaries, so
//! a thread's time splits into application logic (outside any channel
//! call), blocking (waiting for an item or for space), runtime (the rest
//! of a put or get) and messaging (sending and receiving on the network),
//! with lock waits and item allocations inside them:
//!
//! | entity              | kind     | covers                                          |
//! |---------------------|----------|-------------------------------------------------|
//! | `chan/put:<C>`      | interval | a whole put into channel C, local or remote (tag: item ts) |
//! | `chan/get:<C>`      | interval | a whole get from C, its blocking included (tag: ts) |
//! | `chan/send:<C>`     | interval | handing an item of C to the network (tag: ts)   |
//! | `chan/arrived:<C>`  | event    | an item of C arrived; value: its sender's REALTIME send stamp |
//! | `chan/bytes:<C>`    | event    | a put of an item of C; value: its size in bytes  |
//! | `chan/block`        | interval | each wait inside a put or get, or on a hub      |
//! | `chan/recv`         | interval | reading items' bytes off a socket               |
//! | `chan/lock`         | interval | a channel lock that took over ~0.5 µs to get    |
//! | `chan/alloc`        | interval | allocating a received item's buffer             |
//!
//! Per-channel names let an item be followed from its put on one host to its
//! get on another (the per-item macro events of `analysis/items.py`).
//!
//! Every record costs a TSC read and a few stores, and nothing when the
//! trace does not log the `chan` group. Tags are the item timestamp's low
//! 32 bits, which is how a per-item macro event is put together across
//! threads and hosts.

use loopscope_trace::{register, Entity, Kind};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The entities of one channel, registered once per name and kept.
pub struct ChanEnts {
    put: &'static Entity,
    get: &'static Entity,
    send: &'static Entity,
    arrived: &'static Entity,
    bytes: &'static Entity,
}

struct Ents {
    block: &'static Entity,
    recv: &'static Entity,
    lock: &'static Entity,
    alloc: &'static Entity,
}

fn ents() -> Option<&'static Ents> {
    static E: OnceLock<Option<Ents>> = OnceLock::new();
    E.get_or_init(|| {
        let r = |n: &str, k: Kind, d: &str| register("chan", n, k, d, None).ok();
        Some(Ents {
            block: r("block", Kind::Interval, "waiting for an item, for space, or on a hub")?,
            recv: r("recv", Kind::Interval, "reading items off a socket")?,
            lock: r("lock", Kind::Interval, "a contended channel lock")?,
            alloc: r("alloc", Kind::Interval, "allocating a received item")?,
        })
    })
    .as_ref()
}

/// The entities of channel `name` (characters a name cannot hold become `_`).
pub fn channel(name: &str) -> Option<&'static ChanEnts> {
    static M: OnceLock<Mutex<HashMap<String, &'static ChanEnts>>> = OnceLock::new();
    let mut m = M.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = m.get(name) {
        return Some(e);
    }
    let clean: String = name.chars().map(|c| if c == '/' || c.is_control() { '_' } else { c }).collect();
    let r = |what: &str, k: Kind, d: &str| register("chan", &format!("{what}:{clean}"), k, d, None).ok();
    let e: &'static ChanEnts = Box::leak(Box::new(ChanEnts {
        put: r("put", Kind::Interval, "a put, local or remote (tag: item ts)")?,
        get: r("get", Kind::Interval, "a get, its blocking included (tag: item ts)")?,
        send: r("send", Kind::Interval, "handing an item to the network (tag: item ts)")?,
        arrived: r("arrived", Kind::Event, "an item arrived (tag: item ts); value: the sender's REALTIME send stamp")?,
        bytes: r("bytes", Kind::Event, "an item was put (tag: item ts); value: its size in bytes")?,
    }));
    m.insert(name.to_string(), e);
    Some(e)
}

#[inline]
pub fn put(c: Option<&ChanEnts>, t0: u64, ts: u64) {
    if let Some(e) = c {
        e.put.interval(ts as u32, t0);
    }
}

/// The size of an item put (per-size breakdowns join it by timestamp).
#[inline]
pub fn bytes(c: Option<&ChanEnts>, ts: u64, n: usize) {
    if let Some(e) = c {
        e.bytes.event_value(ts as u32, n as i64);
    }
}

#[inline]
pub fn get(c: Option<&ChanEnts>, t0: u64, ts: u64) {
    if let Some(e) = c {
        e.get.interval(ts as u32, t0);
    }
}

#[inline]
pub fn send(c: Option<&ChanEnts>, t0: u64, ts: u64) {
    if let Some(e) = c {
        e.send.interval(ts as u32, t0);
    }
}

#[inline]
pub fn arrived(c: Option<&ChanEnts>, ts: u64, sent_ns: u64) {
    if let Some(e) = c {
        e.arrived.event_value(ts as u32, sent_ns as i64);
    }
}

#[inline]
pub fn block(t0: u64) {
    if let Some(e) = ents() {
        e.block.interval(0, t0);
    }
}

#[inline]
pub fn recv(t0: u64) {
    if let Some(e) = ents() {
        e.recv.interval(0, t0);
    }
}

#[inline]
pub fn alloc(t0: u64) {
    if let Some(e) = ents() {
        e.alloc.interval(0, t0);
    }
}

/// Only lock waits long enough to matter (about 0.5 µs in TSC ticks at a
/// few GHz) are logged: an uncontended lock would cost more to record than
/// to take.
#[inline]
pub fn lock(t0: u64) {
    let t1 = loopscope_trace::now();
    if t1.wrapping_sub(t0) > 1500 {
        if let Some(e) = ents() {
            e.lock.interval_raw(0, t0, t1);
        }
    }
}
