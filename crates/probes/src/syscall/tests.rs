//! Tests of `syscall`.

use super::*;

#[test]
fn every_call_converges_to_a_positive_cost() {
    let cfg = SyscallConfig {
        calls: CALLS.iter().map(|s| s.to_string()).collect(),
        batch: 100,
        min_batches: 5,
        max_batches: 200,
        target_rel: 0.2,
        max_seconds: 1.0,
        dir: std::env::temp_dir(),
    };
    let r = run(&cfg, Arc::new(AtomicBool::new(false))).unwrap();
    assert_eq!(r.calls.len(), CALLS.len());
    for c in &r.calls {
        assert!(c.error.is_none(), "{}: {:?}", c.name, c.error);
        assert!(c.mean_ns > 0.0 && c.batch_ns.len() >= 5, "{c:?}");
    }
}

fn median(x: &[f64]) -> f64 {
    let mut v = x.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn sized_calls_move_their_bytes_and_larger_ones_cost_more() {
    let calls: Vec<String> = ["read", "write", "sendto", "recvfrom"].iter().flat_map(|c| [format!("{c}:64"), format!("{c}:60000")]).collect();
    let cfg = SyscallConfig { calls, batch: 50, min_batches: 5, max_batches: 100, target_rel: 0.2, max_seconds: 1.0, dir: std::env::temp_dir() };
    let r = run(&cfg, Arc::new(AtomicBool::new(false))).unwrap();
    for pair in r.calls.chunks(2) {
        assert!(pair[0].error.is_none() && pair[1].error.is_none(), "{pair:?}");
        let (small, large) = (median(&pair[0].batch_ns), median(&pair[1].batch_ns));
        assert!(large > small, "{}: {small} ns, {}: {large} ns", pair[0].name, pair[1].name);
    }
}

#[test]
fn a_size_is_refused_where_a_call_takes_none_or_it_is_out_of_range() {
    assert_eq!(parse_call("read:4096").unwrap(), ("read".to_string(), Some(4096)));
    for (spec, why) in [("getpid:8", "takes no size"), ("sendto:70000", "1..65000"), ("read:x", "number of bytes"), ("reed", "unknown system call")] {
        let e = parse_call(spec).unwrap_err();
        assert!(e.is_input() && e.to_string().contains(why), "{spec}: {e}");
    }
}

#[test]
fn an_unusable_directory_fails_with_its_path() {
    let cfg =
        SyscallConfig { calls: vec!["open".into()], batch: 10, min_batches: 2, max_batches: 3, target_rel: 0.5, max_seconds: 1.0, dir: "/proc/1/nope".into() };
    let e = run(&cfg, Arc::new(AtomicBool::new(false))).err().unwrap();
    assert!(e.to_string().contains("/proc/1/nope"), "{e}");
}

#[test]
fn t_quantiles_approach_the_normal_one() {
    assert!((t95(1) - 12.706).abs() < 1e-9);
    assert!((t95(100) - 1.984).abs() < 0.002);
    assert!((t95(10_000) - 1.96).abs() < 0.001);
}
