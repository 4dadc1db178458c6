//! The channel runtime's own instrumentation, at its layer boundaries, so
//! a thread's time splits into application logic (outside any channel
//! call), blocking (waiting for an item or for space), runtime (the rest
//! of a put or get) and messaging (sending and receiving on the network),
//! with lock waits and item allocations inside them:
//!
//! | entity          | kind     | covers                                          |
//! |-----------------|----------|-------------------------------------------------|
//! | `chan/put`      | interval | a whole put, local or remote (tag: item ts)     |
//! | `chan/get`      | interval | a whole get, its blocking included (tag: ts)    |
//! | `chan/block`    | interval | each wait inside a put or get                   |
//! | `chan/send`     | interval | handing an item to the network (tag: ts)        |
//! | `chan/recv`     | interval | reading an item's bytes off a socket            |
//! | `chan/lock`     | interval | a channel lock that took over ~0.5 µs to get    |
//! | `chan/alloc`    | interval | allocating a received item's buffer             |
//! | `chan/arrived`  | event    | an item arrived; value: its sender's REALTIME send stamp |
//!
//! Every record costs a TSC read and a few stores, and nothing when the
//! trace does not log the `chan` group. Tags are the item timestamp's low
//! 32 bits, which is how a per-item macro event is put together across
//! threads and hosts.

use loopscope_trace::{register, Entity, Kind};
use std::sync::OnceLock;

struct Ents {
    put: &'static Entity,
    get: &'static Entity,
    block: &'static Entity,
    send: &'static Entity,
    recv: &'static Entity,
    lock: &'static Entity,
    alloc: &'static Entity,
    arrived: &'static Entity,
}

fn ents() -> Option<&'static Ents> {
    static E: OnceLock<Option<Ents>> = OnceLock::new();
    E.get_or_init(|| {
        let r = |n: &str, k: Kind, d: &str| register("chan", n, k, d, None).ok();
        Some(Ents {
            put: r("put", Kind::Interval, "a put, local or remote")?,
            get: r("get", Kind::Interval, "a get, its blocking included")?,
            block: r("block", Kind::Interval, "waiting for an item or for space")?,
            send: r("send", Kind::Interval, "handing an item to the network")?,
            recv: r("recv", Kind::Interval, "reading an item off a socket")?,
            lock: r("lock", Kind::Interval, "a contended channel lock")?,
            alloc: r("alloc", Kind::Interval, "allocating a received item")?,
            arrived: r(
                "arrived",
                Kind::Event,
                "an item arrived; value: sender's REALTIME send stamp",
            )?,
        })
    })
    .as_ref()
}

#[inline]
pub fn put(t0: u64, ts: u64) {
    if let Some(e) = ents() {
        e.put.interval(ts as u32, t0);
    }
}

#[inline]
pub fn get(t0: u64, ts: u64) {
    if let Some(e) = ents() {
        e.get.interval(ts as u32, t0);
    }
}

#[inline]
pub fn block(t0: u64) {
    if let Some(e) = ents() {
        e.block.interval(0, t0);
    }
}

#[inline]
pub fn send(t0: u64, ts: u64) {
    if let Some(e) = ents() {
        e.send.interval(ts as u32, t0);
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

#[inline]
pub fn arrived(ts: u64, sent_ns: u64) {
    if let Some(e) = ents() {
        e.arrived.event_value(ts as u32, sent_ns as i64);
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
