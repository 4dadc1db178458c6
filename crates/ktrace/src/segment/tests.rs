//! Tests of `segment`.

use super::*;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::RowAccessor;

fn events(ts: &[i64]) -> Columns {
    let n = ts.len();
    let mut c = Columns { t_ns: ts.to_vec(), cpu: vec![1; n], event: (0..n as i32).collect(), pid: vec![7; n], ..Default::default() };
    for v in [
        &mut c.target,
        &mut c.target_comm,
        &mut c.next_pid,
        &mut c.next_comm,
        &mut c.prev_state,
        &mut c.irq,
        &mut c.name,
        &mut c.dest_cpu,
        &mut c.prio,
        &mut c.next_prio,
    ] {
        *v = vec![-1; n];
    }
    for v in [&mut c.runtime, &mut c.expires, &mut c.softexpires] {
        *v = vec![-1; n];
    }
    c
}

#[test]
fn the_switches_name_each_thread_by_its_latest_name_in_time_order_wherever_the_cut_moved_them() {
    // event 0 a switch, 1 anything else; thread 5 is "a" (code 10) then "b" (11); 7 is "c" (12); a damaged id kept
    let mut c = events(&[40, 10, 20, 30, 50]);
    c.event = vec![0, 0, 1, 0, 0];
    c.target = vec![5, 5, 5, 7, 1 << 30];
    c.target_comm = vec![11, 10, 13, 12, 14];
    c.next_pid = vec![7, 0, -1, 5, -1];
    c.next_comm = vec![12, 9, -1, 10, -1];
    let cut = Cutter::default().cut(c, None);
    assert_eq!(switch_names(&cut, 0), vec![(5, 11), (7, 12), (1 << 30, 14)]);
    assert_eq!(switch_names(&cut, 3), vec![]);
}

#[test]
fn merging_the_cpus_lanes_gives_the_order_a_sort_of_the_whole_batch_gives() {
    // a few CPUs' sorted sequences dealt in pages of random length, ties across CPUs and across the carry
    let mut rnd = super::xorshift(0x9e37_79b9_7f4a_7c15u64);
    // one room for the keys and lanes throughout, as a cutter keeps it: what a call left there is never read again
    let (mut got, mut lanes) = (Vec::new(), Vec::new());
    for cpus in [8usize, 1, 2, 3, 8, 2] {
        for _ in 0..30 {
            let mut clocks = vec![0i64; cpus];
            let (mut held, mut batch) = (events(&[]), events(&[]));
            for part in [&mut held, &mut batch] {
                for _ in 0..(1 + rnd(40)) {
                    let c = rnd(cpus as u64) as usize;
                    for _ in 0..(1 + rnd(30)) {
                        clocks[c] += rnd(5) as i64; // equal stamps often
                        part.t_ns.push(clocks[c]);
                        part.cpu.push(if c == 3 { -1 } else { c as i32 }); // CPU -1 too (a loss of unknown place)
                    }
                }
            }
            let mut want: Vec<(i64, u32)> = held.t_ns.iter().chain(&batch.t_ns).enumerate().map(|(r, &t)| (t, r as u32)).collect();
            want.sort();
            in_time_order(&held, &batch, &mut got, &mut lanes);
            assert_eq!(got, want, "{cpus} CPUs");
        }
    }
}

#[test]
fn a_cpu_whose_stamps_step_back_is_sorted_with_the_rest() {
    let mut b = events(&[5, 3, 4, 1, 2]);
    b.cpu = vec![0, 0, 1, 1, 0]; // CPU 0 steps back from 5 to 3
    let (mut got, mut lanes) = (Vec::new(), Vec::new());
    in_time_order(&events(&[]), &b, &mut got, &mut lanes);
    assert_eq!(got, vec![(1, 3), (2, 4), (3, 1), (4, 2), (5, 0)]);
}

fn read(path: &Path) -> Vec<(i64, i32, Option<i64>)> {
    let r = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
    r.get_row_iter(None)
        .unwrap()
        .map(|row| {
            let row = row.unwrap();
            (row.get_long(0).unwrap(), row.get_int(3).unwrap(), row.get_long(12).ok())
        })
        .collect()
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ls-segment-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(d.join("events")).unwrap();
    d
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn a_batch_out_of_order_is_written_sorted_with_equal_stamps_in_decoding_order() {
    let d = dir();
    let got = write(&d, &properties(1).unwrap(), 0, &Cutter::default().cut(events(&[30, 10, 20, 10]), None), None).unwrap();
    assert_eq!(got.events, 4);
    assert_eq!((got.t_first_ns, got.t_last_ns), (Some(10), Some(30)));
    assert_eq!(got.file.as_deref(), Some("events/00000.parquet"));
    let rows = read(&d.join("events/00000.parquet"));
    assert_eq!(rows.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(), vec![(10, 1), (10, 3), (20, 2), (30, 0)]);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn what_lies_at_or_after_the_watermark_waits_for_the_next_segment() {
    let d = dir();
    let mut cut = Cutter::default();
    let a = cut.cut(events(&[5, 50, 40]), Some(40));
    let all = |c: &Cut, of: fn(&Columns) -> &[i64]| c.rows(of, 0, c.len(), &mut Vec::new()).to_vec();
    assert_eq!((all(&a, |c| &c.t_ns), cut.held()), (vec![5], 2));
    let b = cut.cut(events(&[45, 40, 60]), None);
    // the held-back 40 (decoded first) before the new batch's 40
    let events = b.rows(|c| &c.event, 0, b.len(), &mut Vec::new()).to_vec();
    assert_eq!((all(&b, |c| &c.t_ns), events), (vec![40, 40, 45, 50, 60], vec![2, 1, 0, 1, 2]));
    assert_eq!(cut.held(), 0);
    write(&d, &properties(1).unwrap(), 1, &b, None).unwrap();
    assert_eq!(read(&d.join("events/00001.parquet")).iter().map(|r| r.0).collect::<Vec<_>>(), vec![40, 40, 45, 50, 60]);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_negative_value_is_stored_as_null_and_others_as_they_are() {
    let d = dir();
    let mut c = events(&[1, 2]);
    c.runtime = vec![-1, 123_456_789_012];
    write(&d, &properties(1).unwrap(), 0, &Cut::sorted(c), None).unwrap();
    let rows = read(&d.join("events/00000.parquet"));
    assert_eq!(rows.iter().map(|r| r.2).collect::<Vec<_>>(), vec![None, Some(123_456_789_012)]);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn row_groups_hold_group_events_each_and_say_their_first_and_last_stamps() {
    let d = dir();
    let n = GROUP * 2 + 10;
    let ts: Vec<i64> = (0..n as i64).map(|i| 1000 + i).collect();
    let got = write(&d, &properties(1).unwrap(), 3, &Cut::sorted(events(&ts)), None).unwrap();
    assert_eq!(
        got.groups,
        vec![(1000, 1000 + GROUP as i64 - 1), (1000 + GROUP as i64, 1000 + 2 * GROUP as i64 - 1), (1000 + 2 * GROUP as i64, 1000 + n as i64 - 1)]
    );
    let r = SerializedFileReader::new(File::open(d.join("events/00003.parquet")).unwrap()).unwrap();
    let sizes: Vec<i64> = r.metadata().row_groups().iter().map(|g| g.num_rows()).collect();
    assert_eq!(sizes, vec![GROUP as i64, GROUP as i64, 10]);
    assert!(got.bytes > 0);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn segments_are_written_as_parquet_2_pages_with_the_stamps_delta_encoded() {
    let d = dir();
    let ts: Vec<i64> = (0..1000).map(|i| 5_000 + 7 * i).collect();
    write(&d, &properties(1).unwrap(), 0, &Cut::sorted(events(&ts)), None).unwrap();
    let r = SerializedFileReader::new(File::open(d.join("events/00000.parquet")).unwrap()).unwrap();
    assert_eq!(r.metadata().file_metadata().version(), 2);
    let t = r.metadata().row_group(0).column(0);
    assert_eq!(t.column_path().string(), "t_ns");
    assert!(t.encodings().any(|e| e == parquet::basic::Encoding::DELTA_BINARY_PACKED), "{:?}", t.encodings().collect::<Vec<_>>());
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_batch_wholly_past_the_watermark_writes_no_file() {
    let d = dir();
    let mut cut = Cutter::default();
    let got = write(&d, &properties(1).unwrap(), 0, &cut.cut(events(&[50, 60]), Some(10)), None).unwrap();
    assert_eq!(got, Written::default());
    assert_eq!(cut.held(), 2);
    assert!(!d.join("events/00000.parquet").exists());
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn rows_read_back_across_row_groups_give_nulls_as_minus_one_and_a_missing_column_as_minus_one_throughout() {
    let d = dir();
    let n = GROUP + 20;
    let ts: Vec<i64> = (0..n as i64).map(|i| 1000 + i).collect();
    let mut c = events(&ts);
    c.runtime = (0..n as i64).map(|i| if i % 3 == 0 { 500 + i } else { -1 }).collect();
    c.target = (0..n as i32).map(|i| if i % 2 == 0 { i } else { -1 }).collect();
    write(&d, &properties(1).unwrap(), 0, &Cut::sorted(c), None).unwrap();
    let names = ["t_ns", "runtime", "target", "no_such_column"];
    let mut files = read::Files::new(&names);
    let mut out = vec![Vec::new(); names.len()];
    // rows on both sides of the first row group's end, and a range past the file's end cut at it
    let (lo, hi) = (GROUP - 5, GROUP + 50);
    assert_eq!(files.read(&d.join("events/00000.parquet"), lo, hi, None, &mut out).unwrap(), n - lo);
    let want_t: Vec<i64> = (lo as i64..n as i64).map(|i| 1000 + i).collect();
    let want_run: Vec<i64> = (lo as i64..n as i64).map(|i| if i % 3 == 0 { 500 + i } else { -1 }).collect();
    let want_target: Vec<i64> = (lo as i64..n as i64).map(|i| if i % 2 == 0 { i } else { -1 }).collect();
    assert_eq!((&out[0], &out[1], &out[2]), (&want_t, &want_run, &want_target));
    assert!(out[3].len() == n - lo && out[3].iter().all(|&v| v == -1));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_run_of_ranges_whose_stamps_interleave_is_read_sorted_with_equal_stamps_in_the_runs_order() {
    let d = dir();
    let mut a = events(&[10, 30, 50]);
    a.pid = vec![1, 1, 1];
    let mut b = events(&[20, 30, 40]);
    b.pid = vec![2, 2, 2];
    write(&d, &properties(1).unwrap(), 0, &Cut::sorted(a), None).unwrap();
    write(&d, &properties(1).unwrap(), 1, &Cut::sorted(b), None).unwrap();
    let names = ["t_ns", "pid"];
    let mut files = read::Files::new(&names);
    let mut out = vec![vec![99]; 2];
    let p = |s: u32| d.join(format!("events/{s:05}.parquet")).display().to_string();
    files.read_run(&[(p(0), 0, GROUP), (p(1), 0, GROUP)], None, &mut out).unwrap();
    assert_eq!(out, vec![vec![10, 20, 30, 30, 40, 50], vec![1, 2, 1, 2, 2, 1]]);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_file_that_is_not_parquet_is_named_in_the_error() {
    let d = dir();
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("junk.parquet");
    std::fs::write(&p, b"not parquet at all").unwrap();
    let names = ["t_ns"];
    let e = read::Files::new(&names).read(&p, 0, 10, None, &mut [Vec::new()]).unwrap_err();
    assert!(e.starts_with(&p.display().to_string()), "{e}");
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn rows_read_within_a_span_of_stamps_are_those_of_the_whole_read_that_lie_in_it() {
    let d = dir();
    let n = 2 * GROUP + 7;
    let ts: Vec<i64> = (0..n as i64).map(|i| 10 * i).collect();
    let mut c = events(&ts);
    c.runtime = (0..n as i64).map(|i| if i % 5 == 0 { i } else { -1 }).collect();
    write(&d, &properties(1).unwrap(), 0, &Cut::sorted(c), None).unwrap();
    let names = ["t_ns", "runtime", "pid"];
    let p = d.join("events/00000.parquet");
    let (mut whole, mut part) = (vec![Vec::new(); 3], vec![Vec::new(); 3]);
    let mut files = read::Files::new(&names);
    files.read(&p, GROUP - 100, 2 * GROUP + 7, None, &mut whole).unwrap();
    // a span across the second group's start, and one that holds no stamp (between two)
    let (a, b) = (10 * (GROUP as i64 - 40), 10 * (GROUP as i64 + 33) + 5);
    let got = files.read(&p, GROUP - 100, 2 * GROUP + 7, Some((a, b)), &mut part).unwrap();
    let keep: Vec<usize> = (0..whole[0].len()).filter(|&i| (a..=b).contains(&whole[0][i])).collect();
    assert_eq!(got, keep.len());
    for j in 0..3 {
        assert_eq!(part[j], keep.iter().map(|&i| whole[j][i]).collect::<Vec<_>>(), "column {}", names[j]);
    }
    let mut none = vec![Vec::new(); 3];
    assert_eq!(files.read(&p, 0, n, Some((11, 19)), &mut none).unwrap(), 0);
    assert!(none.iter().all(Vec::is_empty));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn more_files_than_are_kept_open_read_one_after_the_other_as_each_alone() {
    let d = dir();
    let names = ["t_ns"];
    let mut files = read::Files::new(&names);
    let mut out = vec![Vec::new()];
    for s in 0..40u32 {
        write(&d, &properties(1).unwrap(), s, &Cut::sorted(events(&[i64::from(s) * 10, i64::from(s) * 10 + 1])), None).unwrap();
    }
    // twice round: the files closed to keep a few open are opened again
    for s in (0..40u32).chain(0..3) {
        files.read(&d.join(format!("events/{s:05}.parquet")), 0, GROUP, None, &mut out).unwrap();
    }
    let want: Vec<i64> = (0..40i64).chain(0..3).flat_map(|s| [s * 10, s * 10 + 1]).collect();
    assert_eq!(out[0], want);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn the_int32_chunks_laid_out_here_read_back_as_written_whatever_their_dictionary_and_nulls() {
    let d = dir();
    let n = 2 * GROUP + 777; // a short last group; pages of PAGE_ROWS, the last one short too
    let build = || {
        let mut c = events(&(0..n as i64).collect::<Vec<_>>());
        c.cpu = (0..n as i32).map(|i| i % 2).collect(); // two values
        c.pid = vec![i32::MAX; n]; // one value: indices of no width
        c.event = (0..n as i32).map(|i| 3 + (i / 1000) % 5).collect(); // the statistics' column
        c.target = (0..n as i32).map(|i| if i % 7 == 3 { -1 } else { i * 31 }).collect(); // nearly every value its own, nulls
        c.name = (0..n as i32).map(|i| if i >= GROUP as i32 && i < 2 * GROUP as i32 { -1 } else { i % 3 }).collect(); // a group all null
        c.irq = (0..n as i32).map(|i| if i % 64 == 0 { 0 } else { -1 }).collect();
        c
    };
    let c = build();
    write(&d, &properties(1).unwrap(), 0, &Cut::sorted(build()), None).unwrap();
    let p = d.join("events/00000.parquet");
    let names = ["t_ns", "cpu", "pid", "event", "target", "name", "irq", "prio"];
    let mut out = vec![Vec::new(); names.len()];
    // from inside a page of the first group to the file's end, so the readers skip into a chunk
    let lo = dict::PAGE_ROWS + 5;
    assert_eq!(read::Files::new(&names).read(&p, lo, n, None, &mut out).unwrap(), n - lo);
    let want = |v: &[i32]| v[lo..].iter().map(|&x| x as i64).collect::<Vec<i64>>();
    assert_eq!(out[1], want(&c.cpu));
    assert_eq!(out[2], want(&c.pid));
    assert_eq!(out[3], want(&c.event));
    assert_eq!(out[4], want(&c.target));
    assert_eq!(out[5], want(&c.name));
    assert_eq!(out[6], want(&c.irq));
    assert!(out[7].iter().all(|&v| v == -1));
    // the event codes' minimum and maximum per group, as readers skip groups by them
    let meta = SerializedFileReader::new(File::open(&p).unwrap()).unwrap().metadata().clone();
    for (g, rg) in meta.row_groups().iter().enumerate() {
        let (a, b) = (g * GROUP, ((g + 1) * GROUP).min(n));
        let s = rg.column(3).statistics().unwrap();
        let (lo, hi) = (c.event[a..b].iter().min().unwrap(), c.event[a..b].iter().max().unwrap());
        assert_eq!((s.min_bytes_opt().unwrap(), s.max_bytes_opt().unwrap()), (&lo.to_le_bytes()[..], &hi.to_le_bytes()[..]), "group {g}");
        assert_eq!(s.null_count_opt(), Some(0));
    }
    std::fs::remove_dir_all(d).unwrap();
}
