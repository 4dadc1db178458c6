//! One channel: time-sequenced items, several consumers, bounded, reclaimed
//! when every consumer connected at put time has consumed.
//!
//! Items are keyed by their user timestamp (a frame number, a tick): a
//! timestamp is put once. Each consumer has its own view: `get(Next)` gives
//! the oldest item it has not got yet, `get(Latest)` the newest (the older
//! ones it skips count as consumed), `get(At(ts))` that item, waiting for
//! it. Getting does not consume: a consumer marks an item consumed when it
//! is done with it (or asks `get` to), and the item is reclaimed once every
//! consumer that was connected when it was put has done so (Stampede's
//! garbage-collection rule). A consumer that detaches consumes everything
//! it held. The channel holds at most `capacity` items; a put into a full
//! channel waits for space (`Full::Block`, with a timeout) or evicts the
//! oldest item (`Full::DropOldest`, counted). An item put while no
//! consumer is connected is dropped and counted, never kept for nobody.
//! Every blocking call takes a timeout; nothing waits forever.

use crate::inst;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    Block,
    DropOldest,
}

#[derive(Clone, Copy, Debug)]
pub enum Which {
    Next,
    Latest,
    At(u64),
}

/// Why a channel operation did not happen.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChanError {
    #[error("timed out")]
    Timeout,
    #[error("timestamp {0} was already put on this channel")]
    Duplicate(u64),
    #[error("an item of {size} bytes is larger than the channel's maximum of {max} bytes")]
    TooLarge { size: usize, max: usize },
    #[error("item {0} is not in the channel any more (reclaimed, evicted or skipped)")]
    Gone(u64),
    #[error("no consumer {0} is attached to this channel")]
    NoConsumer(u32),
    #[error("the channel is closed")]
    Closed,
    /// The network under a remote channel failed (the message says how).
    #[error("{0}")]
    Net(String),
}

pub struct Item {
    pub ts: u64,
    pub data: Vec<u8>,
}

impl Drop for Item {
    fn drop(&mut self) {
        crate::pool::give(std::mem::take(&mut self.data));
    }
}

struct Slot {
    item: Arc<Item>,
    /// consumers that have not consumed it yet
    pending: Vec<u32>,
    /// consumers that have got it
    got: Vec<u32>,
}

#[derive(Default, Clone, Debug)]
pub struct Stats {
    pub put: u64,
    pub got: u64,
    pub consumed: u64,
    pub reclaimed: u64,
    pub dropped_full: u64,
    pub dropped_no_consumer: u64,
    pub skipped: u64,
    pub put_timeouts: u64,
    pub get_timeouts: u64,
    pub consumers_lost: u64,
    pub bytes_put: u64,
}

struct Consumer {
    /// items with a timestamp at or below this have been got (or skipped)
    cursor: Option<u64>,
}

struct State {
    items: BTreeMap<u64, Slot>,
    consumers: HashMap<u32, Consumer>,
    next_consumer: u32,
    stats: Stats,
    closed: bool,
}

/// Something to run while a caller waits (the hub's network pump), so a
/// thread that blocks on a channel also moves its network input.
pub trait Waiter: Send + Sync {
    /// Move input for at most `max`; None when another thread is pumping
    /// (then wait on the channel instead).
    fn try_pump(&self, max: Duration) -> Option<bool>;
    /// Cut a pump's wait short: something changed that a pumping getter
    /// must see (a local put, a consume).
    fn wake(&self);
}

type OnPut = Arc<dyn Fn(&Arc<Item>) + Send + Sync>;
type OnReclaim = Arc<dyn Fn(u64) + Send + Sync>;

pub struct Channel {
    pub name: String,
    pub capacity: usize,
    pub max_item: usize,
    pub full: Full,
    state: Mutex<State>,
    changed: Condvar,
    pub(crate) waiter: Mutex<Option<Arc<dyn Waiter>>>,
    /// remote consumers' senders, called after every put (the hub installs it)
    pub(crate) on_put: Mutex<Option<OnPut>>,
    pub(crate) has_remote: AtomicBool,
    /// threads asleep on `changed` (notifying nobody costs a futex call)
    sleepers: AtomicUsize,
    /// called with the timestamp of every item that leaves the channel
    /// (reclaimed or evicted): a remote consumer's mirror tells the owner
    pub(crate) on_reclaim: Mutex<Option<OnReclaim>>,
    pub(crate) ents: Option<&'static inst::ChanEnts>,
}

impl Channel {
    pub fn new(name: &str, capacity: usize, full: Full, max_item: usize) -> Arc<Channel> {
        Arc::new(Channel {
            name: name.into(),
            capacity: capacity.max(1),
            max_item,
            full,
            state: Mutex::new(State { items: BTreeMap::new(), consumers: HashMap::new(), next_consumer: 1, stats: Stats::default(), closed: false }),
            changed: Condvar::new(),
            waiter: Mutex::new(None),
            on_put: Mutex::new(None),
            has_remote: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            on_reclaim: Mutex::new(None),
            ents: inst::channel(name),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        let t0 = loopscope_trace::now();
        let g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        inst::lock(t0);
        g
    }

    fn waiter(&self) -> Option<Arc<dyn Waiter>> {
        self.waiter.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Wait for a change until `deadline`: pump the network when a hub
    /// feeds this channel (the waiting thread does the receiving itself, so
    /// no hand-off between threads), else sleep on the condition variable.
    fn wait<'a>(&'a self, g: MutexGuard<'a, State>, deadline: Instant) -> Result<MutexGuard<'a, State>, ChanError> {
        let now = Instant::now();
        if now >= deadline {
            // a last look at the network, so a zero timeout still polls it
            if let Some(w) = self.waiter() {
                drop(g);
                if w.try_pump(Duration::ZERO) == Some(true) {
                    return Ok(self.lock());
                }
            }
            return Err(ChanError::Timeout);
        }
        let left = deadline - now;
        let t0 = loopscope_trace::now();
        let g = match self.waiter() {
            Some(w) => {
                drop(g);
                if w.try_pump(left.min(Duration::from_millis(50))).is_none() {
                    // another thread pumps: it notifies; look again soon in
                    // case it leaves without anything for us
                    let g = self.lock();
                    self.sleep(g, left.min(Duration::from_millis(2)))
                } else {
                    self.lock()
                }
            }
            None => self.sleep(g, left),
        };
        inst::block(t0);
        Ok(g)
    }

    fn sleep<'a>(&'a self, g: MutexGuard<'a, State>, d: Duration) -> MutexGuard<'a, State> {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let g = self.changed.wait_timeout(g, d).unwrap_or_else(|e| e.into_inner()).0;
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        g
    }

    pub(crate) fn notify(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.changed.notify_all();
        }
        if let Some(w) = self.waiter() {
            w.wake();
        }
    }

    /// Attach a consumer: it sees the items put from now on (`oldest`: also
    /// those the channel holds now).
    pub fn attach(&self, oldest: bool) -> u32 {
        let mut g = self.lock();
        let id = g.next_consumer;
        g.next_consumer += 1;
        let cursor = if oldest { None } else { g.items.keys().next_back().copied() };
        if oldest {
            for s in g.items.values_mut() {
                s.pending.push(id);
            }
        }
        g.consumers.insert(id, Consumer { cursor });
        id
    }

    /// Detach: everything it had pending counts as consumed.
    pub fn detach(&self, id: u32, lost: bool) {
        let mut g = self.lock();
        if g.consumers.remove(&id).is_none() {
            return;
        }
        if lost {
            g.stats.consumers_lost += 1;
        }
        let keys: Vec<u64> = g.items.keys().copied().collect();
        for ts in keys {
            self.consume_locked(&mut g, id, ts);
        }
        drop(g);
        self.notify();
    }

    pub fn consumers(&self) -> usize {
        self.lock().consumers.len()
    }

    pub fn put(&self, ts: u64, data: Vec<u8>, timeout: Duration) -> Result<(), ChanError> {
        let t0 = loopscope_trace::now();
        if data.len() > self.max_item {
            return Err(ChanError::TooLarge { size: data.len(), max: self.max_item });
        }
        let deadline = Instant::now() + timeout;
        let mut g = self.lock();
        loop {
            if g.closed {
                return Err(ChanError::Closed);
            }
            if g.items.contains_key(&ts) {
                return Err(ChanError::Duplicate(ts));
            }
            if g.items.len() < self.capacity {
                break;
            }
            match self.full {
                Full::DropOldest => {
                    let oldest = *g.items.keys().next().unwrap();
                    g.items.remove(&oldest);
                    g.stats.dropped_full += 1;
                    self.reclaimed(oldest);
                    break;
                }
                Full::Block => match self.wait(g, deadline) {
                    Ok(x) => g = x,
                    Err(e) => {
                        self.lock().stats.put_timeouts += 1;
                        return Err(e);
                    }
                },
            }
        }
        let n = data.len() as u64;
        g.stats.bytes_put += n;
        g.stats.put += 1;
        let item = Arc::new(Item { ts, data });
        let pending: Vec<u32> = g.consumers.iter().filter(|(_, c)| c.cursor.is_none_or(|cur| ts > cur)).map(|(id, _)| *id).collect();
        let remote = self.has_remote.load(Ordering::Relaxed);
        if pending.is_empty() && !remote {
            g.stats.dropped_no_consumer += 1;
        } else if !pending.is_empty() {
            g.items.insert(ts, Slot { item: item.clone(), pending, got: Vec::new() });
        }
        drop(g);
        self.notify();
        if remote {
            let f = self.on_put.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(f) = f {
                f(&item);
            }
        }
        inst::put(self.ents, t0, ts);
        inst::bytes(self.ents, ts, n as usize);
        Ok(())
    }

    pub fn get(&self, id: u32, which: Which, consume: bool, timeout: Duration) -> Result<Arc<Item>, ChanError> {
        let t0 = loopscope_trace::now();
        let deadline = Instant::now() + timeout;
        let mut g = self.lock();
        loop {
            let cur = match g.consumers.get(&id) {
                Some(c) => c.cursor,
                None => return Err(ChanError::NoConsumer(id)),
            };
            let found = match which {
                Which::Next => g.items.iter().find(|(ts, s)| cur.is_none_or(|c| **ts > c) && s.pending.contains(&id)).map(|(ts, _)| *ts),
                Which::Latest => g.items.iter().rev().find(|(ts, s)| cur.is_none_or(|c| **ts > c) && s.pending.contains(&id)).map(|(ts, _)| *ts),
                Which::At(t) => {
                    if g.items.get(&t).is_some_and(|s| s.pending.contains(&id)) {
                        Some(t)
                    } else if cur.is_some_and(|c| t <= c) || g.items.keys().next_back().is_some_and(|last| *last > t) {
                        return Err(ChanError::Gone(t));
                    } else {
                        None
                    }
                }
            };
            if let Some(ts) = found {
                if let Which::Latest = which {
                    // the older ones it skips are consumed
                    let older: Vec<u64> = g.items.range(..ts).filter(|(_, s)| s.pending.contains(&id) && !s.got.contains(&id)).map(|(t, _)| *t).collect();
                    g.stats.skipped += older.len() as u64;
                    for t in older {
                        self.consume_locked(&mut g, id, t);
                    }
                }
                let c = g.consumers.get_mut(&id).unwrap();
                c.cursor = Some(c.cursor.map_or(ts, |x| x.max(ts)));
                g.stats.got += 1;
                let slot = g.items.get_mut(&ts).unwrap();
                slot.got.push(id);
                let item = slot.item.clone();
                if consume {
                    self.consume_locked(&mut g, id, ts);
                }
                drop(g);
                self.notify();
                inst::get(self.ents, t0, ts);
                return Ok(item);
            }
            if g.closed {
                return Err(ChanError::Closed);
            }
            g = match self.wait(g, deadline) {
                Ok(x) => x,
                Err(e) => {
                    self.lock().stats.get_timeouts += 1;
                    return Err(e);
                }
            };
        }
    }

    fn consume_locked(&self, g: &mut State, id: u32, ts: u64) -> bool {
        let Some(s) = g.items.get_mut(&ts) else {
            return false;
        };
        let Some(i) = s.pending.iter().position(|x| *x == id) else {
            return false;
        };
        s.pending.swap_remove(i);
        g.stats.consumed += 1;
        if s.pending.is_empty() {
            g.items.remove(&ts);
            g.stats.reclaimed += 1;
            self.reclaimed(ts);
        }
        true
    }

    fn reclaimed(&self, ts: u64) {
        let f = self.on_reclaim.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(f) = f {
            f(ts);
        }
    }

    /// Mark item `ts` consumed by consumer `id`; false if it held no such item.
    pub fn consume(&self, id: u32, ts: u64) -> bool {
        let mut g = self.lock();
        let r = self.consume_locked(&mut g, id, ts);
        drop(g);
        if r {
            self.notify();
        }
        r
    }

    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats.clone()
    }

    pub fn close(&self) {
        self.lock().closed = true;
        self.notify();
    }

    pub(crate) fn count_consumer_lost(&self) {
        self.lock().stats.consumers_lost += 1;
    }
}
