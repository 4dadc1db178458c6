//! Channel semantics in one process, then items across real sockets
//! (loopback, TCP and UDP) between hubs.

use loopscope_channels::{ChanError, Channel, Full, Hub, RemoteConsumer, RemoteProducer, Transport, Which};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_millis(500);

#[test]
fn an_item_is_reclaimed_only_when_every_consumer_has_consumed_it() {
    let c = Channel::new("c", 8, Full::Block, 1 << 20);
    let a = c.attach(false);
    let b = c.attach(false);
    c.put(1, vec![1], T).unwrap();
    let got = c.get(a, Which::Next, true, T).unwrap();
    assert_eq!(got.ts, 1);
    assert_eq!(c.len(), 1, "b has not consumed it yet");
    c.get(b, Which::Next, false, T).unwrap();
    assert_eq!(c.len(), 1, "b got it but has not consumed it");
    assert!(c.consume(b, 1));
    assert_eq!(c.len(), 0);
    assert_eq!(c.stats().reclaimed, 1);
}

#[test]
fn latest_skips_older_items_and_counts_them() {
    let c = Channel::new("c", 8, Full::Block, 1 << 20);
    let a = c.attach(false);
    for ts in 1..=5 {
        c.put(ts, vec![0; 4], T).unwrap();
    }
    assert_eq!(c.get(a, Which::Latest, true, T).unwrap().ts, 5);
    assert_eq!(c.stats().skipped, 4);
    assert_eq!(c.len(), 0);
}

#[test]
fn get_by_timestamp_waits_for_it_and_refuses_one_already_gone() {
    let c = Channel::new("c", 8, Full::Block, 1 << 20);
    let a = c.attach(false);
    let c2 = c.clone();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        c2.put(7, vec![7], T).unwrap();
    });
    assert_eq!(c.get(a, Which::At(7), true, T).unwrap().data, vec![7]);
    h.join().unwrap();
    assert_eq!(c.get(a, Which::At(3), true, Duration::from_millis(10)).err(), Some(ChanError::Gone(3)));
}

#[test]
fn a_full_channel_blocks_until_timeout_or_drops_its_oldest() {
    let c = Channel::new("c", 2, Full::Block, 1 << 20);
    let _a = c.attach(false);
    c.put(1, vec![], T).unwrap();
    c.put(2, vec![], T).unwrap();
    let t0 = Instant::now();
    assert_eq!(c.put(3, vec![], Duration::from_millis(50)), Err(ChanError::Timeout));
    assert!(t0.elapsed() >= Duration::from_millis(50));
    assert_eq!(c.stats().put_timeouts, 1);
    let d = Channel::new("d", 2, Full::DropOldest, 1 << 20);
    let a = d.attach(false);
    for ts in 1..=4 {
        d.put(ts, vec![], T).unwrap();
    }
    assert_eq!(d.stats().dropped_full, 2);
    assert_eq!(d.get(a, Which::Next, true, T).unwrap().ts, 3);
}

#[test]
fn bad_puts_and_gets_are_refused_with_a_reason() {
    let c = Channel::new("c", 2, Full::Block, 16);
    let a = c.attach(false);
    assert_eq!(c.put(1, vec![0; 17], T), Err(ChanError::TooLarge { size: 17, max: 16 }));
    c.put(1, vec![], T).unwrap();
    assert_eq!(c.put(1, vec![], T), Err(ChanError::Duplicate(1)));
    assert_eq!(c.get(99, Which::Next, false, T).err(), Some(ChanError::NoConsumer(99)));
    c.get(a, Which::Next, true, T).unwrap();
    assert_eq!(c.get(a, Which::Next, true, Duration::from_millis(20)).err(), Some(ChanError::Timeout));
}

#[test]
fn an_item_put_with_no_consumer_is_dropped_and_counted() {
    let c = Channel::new("c", 2, Full::Block, 16);
    c.put(1, vec![], T).unwrap();
    assert_eq!(c.len(), 0);
    assert_eq!(c.stats().dropped_no_consumer, 1);
}

#[test]
fn a_consumer_that_detaches_releases_what_it_held() {
    let c = Channel::new("c", 4, Full::Block, 16);
    let a = c.attach(false);
    let b = c.attach(false);
    c.put(1, vec![], T).unwrap();
    c.get(a, Which::Next, true, T).unwrap();
    c.detach(b, true);
    assert_eq!(c.len(), 0);
    assert_eq!(c.stats().consumers_lost, 1);
}

fn roundtrip(transport: Transport, size: usize) {
    let owner = Hub::new(1400);
    let addr = owner.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let ch = owner.create("frames", 16, Full::Block, 4 << 20).unwrap();
    let local = ch.attach(false);
    // a remote consumer on another hub, attached before anything is put
    let rc = {
        let o = owner.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let pumper = std::thread::spawn(move || o.pump_forever(&s2));
        let rc = RemoteConsumer::attach(addr, "frames", transport, 16, 4 << 20, 1400, Duration::from_secs(2)).unwrap();
        let mut p = RemoteProducer::connect(addr, "frames", transport, 1400, Duration::from_secs(2)).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        pumper.join().unwrap();
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        p.put(42, &data, T).unwrap();
        let got = ch.get(local, Which::Next, true, Duration::from_secs(2)).unwrap();
        assert_eq!(got.ts, 42);
        assert_eq!(got.data, data);
        let there = rc.mirror.get(rc.cid, Which::Next, true, Duration::from_secs(2)).unwrap();
        assert_eq!(there.data, data);
        rc
    };
    if transport == Transport::Tcp {
        // the remote consumer's consume reaches the owner: the item is reclaimed there
        let t0 = Instant::now();
        while ch.len() > 0 && t0.elapsed() < Duration::from_secs(2) {
            owner.pump(Duration::from_millis(20));
        }
        assert_eq!(ch.len(), 0);
    }
    drop(rc);
}

#[test]
fn an_item_crosses_tcp_whole_to_local_and_remote_consumers() {
    roundtrip(Transport::Tcp, 300_000);
}

#[test]
fn an_item_crosses_udp_in_fragments_and_is_put_back_together() {
    roundtrip(Transport::Udp, 100_000);
}

#[test]
fn opening_a_channel_the_hub_does_not_have_names_it() {
    let owner = Hub::new(1400);
    let addr = owner.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let o = owner.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let pumper = std::thread::spawn(move || o.pump_forever(&s2));
    let e = RemoteProducer::connect(addr, "nosuch", Transport::Tcp, 1400, Duration::from_secs(2)).err().unwrap();
    assert!(!e.is_input() && e.to_string().contains("no channel named \"nosuch\""), "{e}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    pumper.join().unwrap();
    let e = RemoteProducer::connect("127.0.0.1:1".parse().unwrap(), "x", Transport::Tcp, 1400, Duration::from_millis(300)).err().unwrap();
    assert!(e.to_string().contains("cannot connect"), "{e}");
}
