//! The Rust reader reads the checked-in golden trace (written through the C
//! header by tests/c/golden_writer.c) as tests/fixtures/golden-v1.json says.
//! The Python reader checks the same pair (tests/trace/test_golden.py).

use loopscope_trace::format::rec;
use loopscope_trace::reader::{read_file, Options};
use serde_json::Value;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

#[test]
fn the_golden_trace_reads_back_as_recorded() {
    let t = read_file(&fixtures().join("golden-v1.lstrace"), Options::default()).unwrap();
    let want: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("golden-v1.json")).unwrap()).unwrap();
    assert!(t.stats.closed);
    assert_eq!(t.stats.lost_records, want["lost_records"].as_u64().unwrap());
    let ents = want["entities"].as_array().unwrap();
    assert_eq!(t.entities.len(), ents.len());
    for (e, w) in t.entities.iter().zip(ents) {
        assert_eq!(e.id as u64, w["id"].as_u64().unwrap());
        assert_eq!(e.group, w["group"].as_str().unwrap());
        assert_eq!(e.name, w["name"].as_str().unwrap());
        assert_eq!(e.kind.as_str(), w["kind"].as_str().unwrap());
    }
    let recs = want["records"].as_array().unwrap();
    let c = &t.cols;
    assert_eq!(c.len(), recs.len());
    for (i, w) in recs.iter().enumerate() {
        let e = t.entities.iter().find(|e| e.id == c.entity[i]).unwrap();
        assert_eq!(e.name, w["name"].as_str().unwrap(), "record {i}");
        assert_eq!(c.tag[i] as u64, w["tag"].as_u64().unwrap(), "record {i}");
        if let Some(v) = w.get("value") {
            assert_eq!(c.value[i], v.as_i64().unwrap(), "record {i}");
        }
        if let Some(d) = w.get("dur_ns") {
            assert_eq!(c.rtype[i] as u32, rec::INTERVAL);
            assert_eq!(c.dur_ns[i], d.as_i64().unwrap());
            assert_eq!(c.t_ns[i], w["t_ns"].as_i64().unwrap());
        }
        if let Some(p) = w.get("payload_hex") {
            let (a, b) = (c.payload_off[i] as usize, c.payload_off[i + 1] as usize);
            let hex: String = c.payload[a..b].iter().map(|x| format!("{x:02x}")).collect();
            assert_eq!(hex, p.as_str().unwrap());
        }
    }
    let s = &want["histogram_summary"];
    assert_eq!(c.hist_sum[0], s["sum"].as_i64().unwrap());
    assert_eq!((c.hist_min[0], c.hist_max[0]), (s["min"].as_i64().unwrap(), s["max"].as_i64().unwrap()));
    assert_eq!((c.hist_under[0], c.hist_over[0]), (1, 1));
    let buckets: Vec<(String, u64)> = c.bucket_idx.iter().zip(&c.bucket_count).map(|(i, n)| (i.to_string(), *n)).collect();
    let want_b: Vec<(String, u64)> = want["histogram_buckets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["lo"].is_number())
        .map(|b| (b["bucket"].as_str().unwrap().to_string(), b["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(buckets, want_b);
}
