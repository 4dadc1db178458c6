//! Tests of `activations`.

use super::*;

/// Feeds (t, cpu, kind, pid, target, next_pid, asleep, value) rows.
fn run(tids: &[i64], rows: &[(i64, i64, i64, i64, i64, i64, bool, i64)], lost: Vec<(i64, i64)>) -> Out {
    let mut s = Stream::new(tids, Losses::new(lost));
    for &(t, c, k, p, tg, n, a, v) in rows {
        s.event(t, c, k, p, tg, n, a, v);
    }
    s.finish()
}

#[test]
fn a_timer_sleep_gives_its_lateness_and_wake_up_latency() {
    let o = run(
        &[7],
        &[
            (50, 0, 1, 0, 0, 7, false, NULL),    // switched in
            (100, 0, 3, 7, -1, -1, false, 1000), // arms its sleep timer for 1000
            (110, 0, 1, 7, 7, 0, true, NULL),    // sleeps
            (1005, 0, 2, 0, 7, -1, false, NULL), // woken
            (1012, 0, 1, 0, 0, 7, false, NULL),  // in
            (1030, 0, 1, 7, 7, 0, true, NULL),   // sleeps again
        ],
        vec![],
    );
    let i = o.act.iter().position(|&a| a == 1).unwrap();
    assert_eq!((o.woken[i], o.on[i], o.wakeup_latency[i], o.timer_lateness[i], o.runtime[i], o.complete[i]), (1005, 1012, 7, 12, 18, true));
}

#[test]
fn a_thread_held_on_its_way_back_to_user_space_waits_until_its_next_switch_in() {
    // woken at 1005, switched in at 1012, switched out runnable to idle at 1020 (its group's CPU limit), in again at 80_000
    let o = run(
        &[7],
        &[
            (50, 0, 1, 0, 0, 7, false, NULL),
            (100, 0, 3, 7, -1, -1, false, 1000),
            (110, 0, 1, 7, 7, 0, true, NULL),
            (1005, 0, 2, 0, 7, -1, false, NULL),
            (1012, 0, 1, 0, 0, 7, false, NULL),
            (1020, 0, 1, 7, 7, 0, false, NULL),
            (80_000, 0, 1, 0, 0, 7, false, NULL),
            (80_030, 0, 1, 7, 7, 0, true, NULL),
        ],
        vec![],
    );
    let i = o.act.iter().position(|&a| a == 1).unwrap();
    assert_eq!((o.on[i], o.wakeup_latency[i], o.timer_lateness[i]), (80_000, 80_000 - 1005, 79_000));
}

#[test]
fn a_thread_held_while_a_sibling_of_its_group_runs_out_the_limit_waits_too() {
    // 7 is switched out runnable to its sibling 9, which is switched out runnable to idle 6 ns later;
    // 7's switch-in from idle is not traced, its runtime accounting says it ran from 800_000
    let o = run(
        &[7],
        &[
            (50, 1, 1, 0, 0, 7, false, NULL),
            (110, 1, 1, 7, 7, 9, true, NULL),
            (1005, 1, 2, 9, 7, -1, false, NULL),
            (1012, 1, 1, 9, 9, 7, false, NULL),
            (1020, 1, 1, 7, 7, 9, false, NULL),
            (1026, 1, 1, 9, 9, 0, false, NULL),
            (60_000, 1, 0, 0, -1, -1, false, NULL),
            (800_030, 1, 4, 7, 7, -1, false, 30),
            (800_030, 1, 1, 7, 7, 0, true, NULL),
        ],
        vec![],
    );
    let i = o.act.iter().position(|&a| a == 1).unwrap();
    // after the last other event on its CPU, before its own first event
    assert_eq!((o.on[i], o.wakeup_latency[i], o.on_bound[i]), (60_000, 60_000 - 1005, 800_030 - 60_000));
}

#[test]
fn a_short_preemption_by_another_task_is_not_a_hold() {
    let o = run(
        &[7],
        &[
            (50, 1, 1, 0, 0, 7, false, NULL),
            (110, 1, 1, 7, 7, 0, true, NULL),
            (1005, 1, 2, 0, 7, -1, false, NULL),
            (1012, 1, 1, 0, 0, 7, false, NULL),
            (1020, 1, 1, 7, 7, 9, false, NULL), // preempted by 9, which runs on
            (5000, 1, 1, 9, 9, 7, true, NULL),
            (5030, 1, 1, 7, 7, 0, true, NULL),
        ],
        vec![],
    );
    let i = o.act.iter().position(|&a| a == 1).unwrap();
    assert_eq!((o.on[i], o.wakeup_latency[i]), (1012, 7));
}

#[test]
fn a_held_thread_whose_next_switch_in_is_untraced_is_placed_after_the_hold() {
    let o = run(
        &[7],
        &[
            (50, 1, 1, 0, 0, 7, false, NULL),
            (110, 1, 1, 7, 7, 0, true, NULL),
            (1005, 1, 2, 0, 7, -1, false, NULL),
            (1012, 1, 1, 0, 0, 7, false, NULL),
            (1020, 1, 1, 7, 7, 0, false, NULL),
            (79_990, 1, 0, 0, -1, -1, false, NULL), // an interrupt in idle
            (80_010, 1, 0, 7, -1, -1, false, NULL), // the thread's own: it runs again, the switch-in untraced
            (80_030, 1, 1, 7, 7, 0, true, NULL),
        ],
        vec![],
    );
    let i = o.act.iter().position(|&a| a == 1).unwrap();
    assert_eq!((o.on[i], o.on_bound[i]), (79_990, 20));
}

#[test]
fn an_untraced_switch_in_is_placed_after_the_last_event_on_its_cpu() {
    let o = run(
        &[7],
        &[
            (10, 1, 1, 0, 0, 7, false, NULL),
            (20, 1, 1, 7, 7, 0, true, NULL),
            (100, 1, 2, 0, 7, -1, false, NULL),
            (130, 1, 0, 0, -1, -1, false, NULL), // someone else's event on CPU 1
            (150, 1, 0, 7, -1, -1, false, NULL), // the thread's own: it runs, its switch-in untraced
            (200, 1, 1, 7, 7, 0, true, NULL),
        ],
        vec![],
    );
    let i = o.act.iter().position(|&a| a == 1).unwrap();
    assert_eq!((o.on[i], o.on_bound[i], o.wakeup_latency[i]), (130, 20, 30));
}

#[test]
fn runtime_accounting_bounds_an_untraced_switch_in_from_above_and_never_from_below() {
    // the run accounted at 60_000 began at 10_000 by the task clock, which can read late (steal), never
    // much early: the switch-in lies after the last other event (130), by 10_000 + RUN_EARLY_NS
    let o = run(
        &[7],
        &[
            (10, 1, 1, 0, 0, 7, false, NULL),
            (20, 1, 1, 7, 7, 0, true, NULL),
            (100, 1, 2, 0, 7, -1, false, NULL),
            (130, 1, 0, 0, -1, -1, false, NULL),
            (60_000, 1, 4, 7, 7, -1, false, 50_000),
            (60_000, 1, 1, 7, 7, 0, true, NULL),
        ],
        vec![],
    );
    let i = o.act.iter().position(|&a| a == 1).unwrap();
    assert_eq!((o.on[i], o.on_bound[i]), (130, 10_000 + RUN_EARLY_NS - 130));
}

#[test]
fn an_activation_overlapping_lost_events_is_incomplete() {
    let o = run(
        &[7],
        &[(10, 0, 1, 7, 7, 0, true, NULL), (100, 0, 2, 0, 7, -1, false, NULL), (110, 0, 1, 0, 0, 7, false, NULL), (200, 0, 1, 7, 7, 0, true, NULL)],
        vec![(150, 160)],
    );
    let i = o.act.iter().position(|&a| a == 1).unwrap();
    assert!(!o.complete[i]);
}

#[test]
fn events_at_one_instant_are_applied_in_kind_order_whatever_order_they_come_in() {
    // woken and switched in at the same instant, the switch-in listed first
    let o = run(
        &[7],
        &[(10, 0, 1, 7, 7, 0, true, NULL), (100, 0, 1, 0, 0, 7, false, NULL), (100, 0, 2, 0, 7, -1, false, NULL), (200, 0, 1, 7, 7, 0, true, NULL)],
        vec![],
    );
    let i = o.act.iter().position(|&a| a == 1).unwrap();
    assert_eq!((o.woken[i], o.wakeup_latency[i]), (100, 0));
}

#[test]
fn a_switch_in_placed_by_an_own_event_in_a_later_batch_keeps_the_rows_in_order() {
    let mut s = Stream::new(&[7], Losses::new(vec![]));
    for &(t, c, k, p, tg, n, a) in &[(10, 0, 1, 7, 7, 0, true), (100, 0, 2, 0, 7, -1, false), (120, 0, 0, 3, -1, -1, false)] {
        s.event(t, c, k, p, tg, n, a, NULL);
    }
    // the next batch: the thread's first own event, then a sleep
    for &(t, c, k, p, tg, n, a) in &[(150, 0, 0, 7, -1, -1, false), (160, 0, 1, 7, 7, 0, true)] {
        s.event(t, c, k, p, tg, n, a, NULL);
    }
    let o = s.finish();
    // activation 0 is a sleep alone (nothing of it ran in view): no row
    assert_eq!(o.act, vec![1]);
    assert_eq!((o.on[0], o.on_bound[0], o.wakeup_latency[0]), (120, 30, 20));
}

/// A thread that sleeps on a timer every 1000 ns and is woken `late(k)` after it, 2 ns to run.
fn periodic(n: i64, late: impl Fn(i64) -> i64) -> Vec<(i64, i64, i64, i64, i64, i64, bool, i64)> {
    let mut ev = vec![(0, 0, 1, 0, 0, 7, false, NULL)];
    for k in 0..n {
        let t = k * 10_000;
        let exp = t + 1000;
        ev.push((t + 1, 0, 3, 7, -1, -1, false, exp)); // arms its timer
        ev.push((t + 2, 0, 1, 7, 7, 0, true, NULL)); // sleeps
        ev.push((exp + late(k), 0, 2, 0, 7, -1, false, NULL)); // woken
        ev.push((exp + late(k) + 3, 0, 1, 0, 0, 7, false, NULL)); // in
    }
    ev
}

fn fold(tids: &[i64], rows: &[(i64, i64, i64, i64, i64, i64, bool, i64)], window: Option<(i64, i64)>, k: usize) -> Summary {
    let mut s = Stream::into(tids, Losses::new(vec![]), Sink::Summary(Summary::new(window, k)));
    for &(t, c, kd, p, tg, n, a, v) in rows {
        s.event(t, c, kd, p, tg, n, a, v);
    }
    s.finish_summary()
}

#[test]
fn a_folded_pass_counts_what_the_rows_hold_and_its_quantiles_are_within_its_precision() {
    let ev = periodic(2000, |k| 10 + (k * 37) % 5000);
    let rows = run(&[7], &ev, vec![]);
    let s = fold(&[7], &ev, None, 5);
    let t = &s.threads[0];
    assert_eq!(t.activations as usize, rows.tid.len());
    assert_eq!(t.complete as usize, rows.complete.iter().filter(|&&c| c).count());
    let mut lat: Vec<i64> = (0..rows.tid.len()).filter(|&i| rows.complete[i] && rows.timer_lateness[i] != NULL).map(|i| rows.timer_lateness[i]).collect();
    lat.sort_unstable();
    assert_eq!(t.timer_lateness.max(), *lat.last().unwrap());
    let exact = lat[(lat.len() - 1) / 2];
    let got = t.timer_lateness.quantile(0.5);
    assert!((got - exact).abs() as f64 <= exact as f64 * 1e-3 + 1.0, "p50 {got} against {exact}");
}

#[test]
fn a_folded_pass_keeps_each_threads_latest_outliers_with_their_windows() {
    // every 100th activation is 100 µs late, the others 10 ns
    let ev = periodic(1000, |k| if k % 100 == 50 { 100_000 } else { 10 });
    let s = fold(&[7], &ev, None, 3);
    let (n, kept) = s.threads[0].outliers();
    assert!(n >= 10, "{n} outliers");
    assert_eq!(kept.len(), 3);
    for (late, start, end) in kept {
        // late from the timer's expiry, the window from the expiry to the switch-in
        assert_eq!((late, end - start), (100_003, 100_003));
    }
}

#[test]
fn a_folded_pass_keeps_only_the_activations_woken_inside_its_window() {
    let ev = periodic(100, |_| 10);
    let all = fold(&[7], &ev, None, 1).threads[0].activations;
    let part = fold(&[7], &ev, Some((200_000, 499_999)), 1).threads[0].activations;
    assert_eq!(part, 30);
    assert!(all > part);
}

#[test]
fn an_arm_is_carried_by_the_nearest_offset_a_tie_by_the_later_and_of_offsets_at_one_time_by_the_last() {
    let mut n = Nearest::new(vec![0, 10, 10, 20, 40], vec![1, 2, 5, 3, 4]);
    // 5: 0 and 10 equally near, the later (10's last: 5); 14: 10; 15: a tie, 20; 100: past the last, 40
    assert_eq!([-3, 5, 10, 14, 15, 29, 30, 31, 100].map(|t| n.at(t)), [1, 5, 5, 5, 3, 3, 4, 4, 4]);
    assert_eq!(Nearest::new(Vec::new(), Vec::new()).at(7), 0);
}
