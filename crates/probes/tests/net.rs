//! Sender and receiver on loopback: counts, kernel timestamps, pacing.

use loopscope_probes::net::recv::{self, RecvConfig};
use loopscope_probes::net::rr::{self, RrConfig};
use loopscope_probes::net::schedule::Pattern;
use loopscope_probes::net::send::{self, SendConfig};
use loopscope_probes::net::sock::Udp;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

fn receiver() -> (Udp, RecvConfig) {
    let cfg = RecvConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        duration_ns: None,
        idle_ns: Some(300_000_000),
        count: None,
        records: false,
        rcvbuf: 8 << 20,
        max_size: 2048,
    };
    (recv::bind(&cfg).unwrap(), cfg)
}

#[test]
fn every_packet_arrives_with_a_kernel_timestamp_and_tx_stamps_come_back() {
    let (sock, rcfg) = receiver();
    let dest = sock.local;
    let rx = std::thread::spawn(move || recv::run_on(sock, &rcfg, Arc::new(AtomicBool::new(false))));
    let cfg = SendConfig {
        dest,
        size: 200,
        pps_num: 20_000,
        pps_den: 1,
        pattern: Pattern::Cbr,
        count: Some(5_000),
        duration_ns: None,
        workers: 1,
        flow: 3,
        tx_timestamps: true,
        records: false,
        cpus: vec![],
    };
    let s = send::run(&cfg, Arc::new(AtomicBool::new(false))).unwrap();
    let r = rx.join().unwrap();
    let w = &s.workers[0];
    assert_eq!(w.sent, 5_000);
    assert_eq!(r.packets, 5_000);
    assert_eq!(r.no_kernel_ts, 0);
    let (flow, f) = &r.flows[0];
    assert_eq!((*flow, f.unique, f.lost(), f.duplicates), (3, 5_000, 0, 0));
    assert!(w.tx_sw >= 4_900, "TX software stamps: {}", w.tx_sw);
    // At 20 kpps (50 us gaps) departures are within tens of microseconds.
    let mut e = w.dep_err_ns.clone();
    e.sort_unstable();
    assert!(e[e.len() / 2] < 50_000, "median departure error {}", e[e.len() / 2]);
}

#[test]
fn several_workers_share_one_schedule() {
    let (sock, rcfg) = receiver();
    let dest = sock.local;
    let rx = std::thread::spawn(move || recv::run_on(sock, &rcfg, Arc::new(AtomicBool::new(false))));
    let cfg = SendConfig {
        dest,
        size: 100,
        pps_num: 10_000,
        pps_den: 1,
        pattern: Pattern::Cbr,
        count: Some(3_000),
        duration_ns: None,
        workers: 3,
        flow: 1,
        tx_timestamps: false,
        records: false,
        cpus: vec![],
    };
    let s = send::run(&cfg, Arc::new(AtomicBool::new(false))).unwrap();
    let r = rx.join().unwrap();
    assert_eq!(s.workers.iter().map(|w| w.sent).collect::<Vec<_>>(), vec![1_000, 1_000, 1_000]);
    let f = &r.flows[0].1;
    assert_eq!((f.unique, f.lost(), f.first_seq, f.max_seq), (3_000, 0, 0, 2_999));
}

#[test]
fn a_port_in_use_is_named() {
    let (sock, rcfg) = receiver();
    let e = recv::bind(&RecvConfig { bind: sock.local, ..rcfg }).err().unwrap();
    assert!(e.is_input() && e.to_string().contains("port is in use"), "{e}");
}

#[test]
fn an_echo_server_answers_every_request_with_its_times() {
    let srv = Udp::bind(&"127.0.0.1:0".parse().unwrap(), 1 << 20).unwrap();
    srv.enable_rx_timestamps().unwrap();
    srv.set_read_timeout_ms(20);
    let dest = srv.local;
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let h = std::thread::spawn(move || rr::echo(srv, None, st));
    let cfg =
        RrConfig { dest, pps_num: 1000, pps_den: 1, pattern: Pattern::Cbr, duration_ns: 300_000_000, size: 64, flow: 9, grace_ns: 100_000_000, records: false };
    let r = rr::client(&cfg, Arc::new(AtomicBool::new(false))).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let e = h.join().unwrap();
    assert_eq!(r.sent, 300);
    assert_eq!(r.exchanges.len(), 300);
    assert_eq!(e.requests, 300);
    for x in &r.exchanges {
        assert!(x.sent <= x.srv_krx && x.srv_krx <= x.srv_urx && x.srv_urx <= x.srv_utx && x.srv_utx <= x.krx && x.krx <= x.urx, "{x:?}");
    }
}
