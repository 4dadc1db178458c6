//! Write traces through the public API and read them back.
//!
//! A process has one session at a time, so these tests take a lock.

use loopscope_trace::config::{Config, StreamConfig, StreamKind};
use loopscope_trace::reader::{read_bytes, read_file, Options};
use loopscope_trace::{format::rec, register, session, Kind};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

static LOCK: Mutex<()> = Mutex::new(());

/// A test's trace file in a directory of its own, removed with it when the
/// test ends, passed or failed (a leftover per run filled the temporary
/// directory).
struct Scratch {
    dir: PathBuf,
    file: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.file
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.file
    }
}

fn tmp(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("loopscope-rs-{}-{}", std::process::id(), name.trim_end_matches(".lstrace")));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch { file: dir.join(name), dir }
}

fn one_stream(groups: &[&str]) -> Config {
    Config {
        streams: vec![StreamConfig { name: "main".into(), kind: StreamKind::Normal, groups: groups.iter().map(|s| s.to_string()).collect(), buffer_kib: None }],
        ..Config::default()
    }
}

#[test]
fn events_from_several_threads_all_come_back() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let path = tmp("threads.lstrace");
    session::open(&path, one_stream(&["*"])).unwrap();
    let ev = register("rt", "tick", Kind::Event, "a tick", None).unwrap();
    let hs: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..50_000u32 {
                    ev.event(t * 1_000_000 + i);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let end = session::close().unwrap();
    assert_eq!(end.lost_records, 0);
    let t = read_file(&path, Options { sort: true, ..Default::default() }).unwrap();
    assert_eq!(t.stats.records, 200_000);
    assert_eq!(t.threads.len(), 4);
    assert!(t.stats.closed);
    assert!(t.cols.t_ns.windows(2).all(|w| w[0] <= w[1]));
    // Each thread's tags arrive in order.
    for th in 0..4u32 {
        let tags: Vec<u32> = t.cols.tag.iter().zip(&t.cols.thread).filter(|(_, &x)| x == th).map(|(&g, _)| g % 1_000_000).collect();
        assert_eq!(tags, (0..50_000).collect::<Vec<_>>());
    }
}

#[test]
fn every_kind_of_record_reads_back_with_its_fields() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let path = tmp("kinds.lstrace");
    session::open(&path, one_stream(&["*"])).unwrap();
    let ev = register("k", "ev", Kind::Event, "", None).unwrap();
    let iv = register("k", "iv", Kind::Interval, "", None).unwrap();
    let ct = register("k", "ct", Kind::Counter, "", None).unwrap();
    let hs = register("k", "hs", Kind::Histogram, "", Some(loopscope_trace::hist::Scale::Linear { lo: 0, hi: 100, n: 10 })).unwrap();
    ev.event(1);
    ev.event_value(2, -5);
    ev.event_payload(3, b"abc");
    let s = loopscope_trace::now();
    iv.interval(4, s);
    iv.interval_mono(5, 1_000, 250);
    ct.counter_add(7);
    ct.counter_add(3);
    ct.counter_log();
    ct.counter_reset();
    for v in [1, 15, 15, 200, -1] {
        hs.histogram_add(v);
    }
    hs.histogram_log();
    session::close().unwrap();
    let t = read_file(&path, Options::default()).unwrap();
    let c = &t.cols;
    let types: Vec<u8> = c.rtype.clone();
    assert_eq!(
        types,
        vec![
            rec::EVENT as u8,
            rec::EVENT_VALUE as u8,
            rec::EVENT_PAYLOAD as u8,
            rec::INTERVAL as u8,
            rec::INTERVAL as u8,
            rec::COUNTER as u8,
            rec::COUNTER as u8,
            rec::HISTOGRAM as u8
        ]
    );
    assert_eq!(c.value[1], -5);
    assert_eq!(&c.payload[c.payload_off[2] as usize..c.payload_off[3] as usize], b"abc");
    assert_eq!((c.t_ns[4], c.dur_ns[4]), (1_000, 250));
    assert!(c.dur_ns[3] >= 0);
    assert_eq!((c.value[5], c.tag[5]), (10, rec::COUNTER_LOG));
    assert_eq!((c.value[6], c.tag[6]), (10, rec::COUNTER_RESET));
    assert_eq!(c.value[7], 5);
    assert_eq!((c.hist_under[0], c.hist_over[0]), (1, 1));
    assert_eq!(c.bucket_idx, vec![0, 1]);
    assert_eq!(c.bucket_count, vec![1, 2]);
}

#[test]
fn a_disabled_group_writes_nothing_until_switched_on() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let path = tmp("groups.lstrace");
    session::open(&path, one_stream(&["on"])).unwrap();
    let a = register("on", "a", Kind::Event, "", None).unwrap();
    let b = register("off", "b", Kind::Event, "", None).unwrap();
    assert!(a.enabled() && !b.enabled());
    a.event(1);
    b.event(2);
    session::enable_group("main", "off", true).unwrap();
    b.event(3);
    session::enable_group("main", "on", false).unwrap();
    a.event(4);
    session::close().unwrap();
    let t = read_file(&path, Options::default()).unwrap();
    assert_eq!(t.cols.tag, vec![1, 3]);
    assert_eq!(t.changes.len(), 2);
}

#[test]
fn a_flight_recorder_writes_only_when_triggered_and_keeps_the_latest() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let path = tmp("ring.lstrace");
    let cfg = Config {
        streams: vec![
            StreamConfig { name: "main".into(), kind: StreamKind::Normal, groups: vec!["loopscope".into()], buffer_kib: None },
            StreamConfig { name: "flight".into(), kind: StreamKind::Ring, groups: vec!["fr".into()], buffer_kib: Some(256) },
        ],
        ..Config::default()
    };
    session::open(&path, cfg).unwrap();
    let ev = register("fr", "x", Kind::Event, "", None).unwrap();
    // 256 KiB hold 16384 events; log many more.
    for i in 0..100_000u32 {
        ev.event(i);
    }
    session::flush().unwrap();
    session::trigger("flight", 9).unwrap();
    session::flush().unwrap();
    for i in 100_000..100_010u32 {
        ev.event(i);
    }
    session::close().unwrap();
    let t = read_file(&path, Options::default()).unwrap();
    assert_eq!(t.dumps.len(), 1);
    assert!(t.dumps[0].overwritten_bytes > 0);
    let tags: Vec<u32> = t.cols.tag.iter().zip(&t.cols.entity).filter(|(_, &e)| e == ev.id()).map(|(&g, _)| g).collect();
    // The dump ends with the last record before the trigger, holds a
    // contiguous run of the latest records, and nothing after the trigger.
    assert_eq!(*tags.last().unwrap(), 99_999);
    assert!(tags.len() > 8_000 && tags.len() <= 16_384, "{}", tags.len());
    assert!(tags.windows(2).all(|w| w[1] == w[0] + 1));
}

#[test]
fn a_full_buffer_counts_what_it_drops() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let path = tmp("lost.lstrace");
    let mut cfg = one_stream(&["*"]);
    cfg.streams[0].buffer_kib = Some(256);
    cfg.flush_ms = 1000;
    session::open(&path, cfg).unwrap();
    let ev = register("lost", "x", Kind::Event, "", None).unwrap();
    // No writer cycle can run in between: 1M events at ~10 ns take ~10 ms,
    // but the writer sleeps for a second. Its first cycle happened at open.
    std::thread::sleep(std::time::Duration::from_millis(20));
    for i in 0..1_000_000u32 {
        ev.event(i);
    }
    let end = session::close().unwrap();
    let t = read_file(&path, Options::default()).unwrap();
    assert!(end.lost_records > 0);
    assert_eq!(t.stats.records + t.stats.lost_records, 1_000_000);
}

#[test]
fn a_truncated_file_reads_every_complete_chunk() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let path = tmp("trunc.lstrace");
    session::open(&path, one_stream(&["*"])).unwrap();
    let ev = register("tr", "x", Kind::Event, "", None).unwrap();
    for i in 0..20_000u32 {
        ev.event(i);
    }
    session::close().unwrap();
    let full = std::fs::read(&path).unwrap();
    let cut = &full[..full.len() - 1000];
    let t = read_bytes(cut, "cut", Options::default()).unwrap();
    assert!(t.stats.truncated_bytes > 0);
    assert!(!t.stats.closed);
    assert!(t.stats.records > 15_000 && t.stats.records < 20_000);
    // A flipped byte inside a data chunk loses that chunk only.
    let mut bad = full.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    let t = read_bytes(&bad, "flipped", Options::default()).unwrap();
    assert_eq!(t.stats.damaged_chunks, 1);
    assert!(t.stats.records >= 20_000 - 4096 && t.stats.records < 20_000);
}

#[test]
fn foreign_and_newer_files_are_refused_with_the_offset() {
    let e = read_bytes(b"GIF89a-this is not a trace", "x.gif", Options::default()).err().unwrap();
    assert!(e.to_string().contains("not a loopscope trace") && e.is_input(), "{e}");
    let mut h = loopscope_trace::format::file_header().to_vec();
    h[8] = 9;
    let e = read_bytes(&h, "new.lstrace", Options::default()).err().unwrap();
    assert!(e.to_string().contains("offset 8") && e.to_string().contains("9.0"), "{e}");
}
