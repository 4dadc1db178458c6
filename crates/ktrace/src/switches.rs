//! Who ran on each CPU, from `sched_switch` (and from whose context each
//! event was recorded in), for recordings without runtime accounting.
//!
//! Attribution first learned who ran from `sched_stat_runtime`, an event
//! most users do not record (`perf sched record`, `trace-cmd record -e
//! sched_switch -e sched_wakeup`). Every `sched_switch` says who ran until
//! then (`prev_*`) and who runs from then (`next_*`), so the runs of every
//! task on a CPU follow from the switches alone:
//!
//! - before a CPU's first switch, the task its `prev_*` fields name ran
//!   from the start of the events (nothing else is known of that time);
//! - a switch whose `prev` is not the task the last switch put on the CPU,
//!   or an event recorded in another task's context, means a switch went
//!   unrecorded (some kernels, this VM's among them, do not trace the
//!   switch out of the idle task): the new task is taken to run from the
//!   first event that shows it running, or, where the CPU was idle and the
//!   task was woken while it idled, from that wake-up (an idle CPU runs
//!   what is woken onto it at once, less its exit from idle, which the
//!   task's run then holds; with runtime accounting recorded, its runs say
//!   where the run began and this is not needed);
//! - after a CPU's last switch its task ran to the end of the events.
//!
//! Where runtime accounting exists, its runs stay what attribution uses;
//! the switches fill only the time it does not cover on that CPU (a task
//! whose class emits no runtime events, an update that was lost), pieces
//! shorter than `MIN_FILL_NS` left out as the accounting's own rounding.

use crate::percpu::PerCpu;
use rustc_hash::FxHashMap;

/// A stretch of a switch-derived run not covered by runtime runs shorter
/// than this is the accounting's rounding, not a run of its own.
const MIN_FILL_NS: i64 = 2_000;

/// (start, end, task) of every run of a task other than idle on one CPU.
pub type Runs = Vec<(i64, i64, i64)>;

/// Follows each CPU's current task through the events, in time order.
#[derive(Default)]
pub struct Switches {
    /// per CPU: (current task, since)
    cur: PerCpu<(i64, i64)>,
    runs: PerCpu<Runs>,
    /// the first event's time: what ran before a CPU's first switch ran from here
    t0: Option<i64>,
    t_end: i64,
    /// whether any CPU had runtime accounting
    pub runtime_seen: bool,
    /// each task's latest wake-up not yet followed by a run
    woken: FxHashMap<i64, i64>,
    guesses: Vec<Guess>,
}

/// A run whose start was placed at the task's wake-up: (CPU, task, the
/// wake-up, the first event that shows it running). Where in between the
/// switch came, nothing recorded says.
pub type Guess = (i64, i64, i64, i64);

impl Switches {
    /// Any event on `cpu` at `t`, recorded in the context of task `ctx_pid`
    /// (NONE when the recorder does not say): a task seen running that is
    /// not the current one was switched in unrecorded.
    pub fn seen(&mut self, cpu: i64, t: i64, ctx_pid: i64) {
        if self.t0.is_none() {
            self.t0 = Some(t);
        }
        self.t_end = self.t_end.max(t);
        if ctx_pid < 0 {
            return;
        }
        match self.cur.get(cpu) {
            // the CPU's first event: whoever it was recorded for ran from the start
            None => {
                let since = self.t0.unwrap_or(t);
                self.cur.insert(cpu, (ctx_pid, since));
            }
            Some(&(p, _)) if p != ctx_pid => self.unrecorded(cpu, t, ctx_pid),
            _ => {}
        }
    }

    /// A task was woken at `t` (on whichever CPU).
    pub fn woke(&mut self, task: i64, t: i64) {
        if !self.runtime_seen {
            self.woken.insert(task, t);
        }
    }

    /// `task` is seen running on `cpu` at `t`, its switch-in unrecorded.
    fn unrecorded(&mut self, cpu: i64, t: i64, task: i64) {
        let from = match (self.cur.get(cpu), self.woken.get(&task)) {
            (Some(&(0, since)), Some(&w)) if !self.runtime_seen && w > since && w < t => w,
            _ => t,
        };
        if from < t {
            self.guesses.push((cpu, task, from, t));
        }
        self.to(cpu, from, task);
    }

    /// A recorded switch on `cpu` at `t` from `prev` to `next`.
    pub fn switch(&mut self, cpu: i64, t: i64, prev: i64, next: i64) {
        match self.cur.get(cpu) {
            None => {
                let since = self.t0.unwrap_or(t);
                self.cur.insert(cpu, (prev, since));
            }
            Some(&(p, _)) if p != prev && prev >= 0 => self.unrecorded(cpu, t, prev),
            _ => {}
        }
        if next >= 0 {
            self.to(cpu, t, next);
        }
    }

    fn to(&mut self, cpu: i64, t: i64, next: i64) {
        if !self.woken.is_empty() {
            self.woken.remove(&next); // it runs: its wake-up has had its effect
        }
        if let Some((p, since)) = self.cur.insert(cpu, (next, t)) {
            if p > 0 && t > since {
                self.runs.entry(cpu).push((since, t, p));
            }
        }
    }

    /// Every CPU's runs, the open ones closed at the last event, and the
    /// runs whose start was placed at a wake-up.
    pub fn finish(mut self) -> (Vec<(i64, Runs)>, Vec<Guess>) {
        let end = self.t_end;
        for (c, (p, since)) in std::mem::take(&mut self.cur).into_sorted() {
            if p > 0 && end > since {
                self.runs.entry(c).push((since, end, p));
            }
        }
        (self.runs.into_sorted(), self.guesses)
    }
}

/// The parts of `runs` that no run of `covered` (sorted by end, disjoint
/// but for rounding and nesting) overlaps, at least MIN_FILL_NS long.
///
/// Walking a run, the next covered run to cut it is the first (by end)
/// that ends after the walk's point and starts before the run's end. The
/// ends are sorted, so those ending after the point are a suffix; in it,
/// the first start before the run's end is found a block of 64 at a time
/// by each block's earliest start (`Starts`). A scan run by run to the
/// next such start was quadratic where a long run nests many short ones.
pub fn uncovered(runs: &Runs, covered: &[(i64, i64)]) -> Runs {
    let starts = Starts::new(covered);
    let mut out = Vec::new();
    let mut after = Ends::default();
    for &(s, e, p) in runs {
        let mut t = s;
        while t < e {
            // the runs ending after t (a suffix); the first of them to start before e
            if let Some(k) = starts.first_before(after.at(covered, t), e) {
                let (a, b) = covered[k];
                if a > t && a.min(e) - t >= MIN_FILL_NS {
                    out.push((t, a.min(e), p));
                }
                t = t.max(b);
            } else {
                if e - t >= MIN_FILL_NS {
                    out.push((t, e, p));
                }
                break;
            }
        }
    }
    out
}

/// Where the runs ending after a time begin, found from the last answer
/// when the time moved forward (the walk's times mostly do), by galloping
/// (a binary search over the whole array per step was 80 % of the walk).
#[derive(Default)]
struct Ends {
    t: i64,
    k: usize,
}

impl Ends {
    fn at(&mut self, covered: &[(i64, i64)], t: i64) -> usize {
        let k = if t >= self.t && self.k > 0 {
            let (mut lo, mut step) = (self.k, 1);
            while lo + step < covered.len() && covered[lo + step].1 <= t {
                lo += step;
                step *= 2;
            }
            let hi = (lo + step).min(covered.len());
            lo + covered[lo..hi].partition_point(|x| x.1 <= t)
        } else {
            covered.partition_point(|x| x.1 <= t)
        };
        (self.t, self.k) = (t, k);
        k
    }
}

/// The covered runs' starts, and the earliest of each block of 64.
struct Starts {
    start: Vec<i64>,
    block_min: Vec<i64>,
}

impl Starts {
    const B: usize = 64;

    fn new(covered: &[(i64, i64)]) -> Self {
        let start: Vec<i64> = covered.iter().map(|x| x.0).collect();
        let block_min = start.chunks(Self::B).map(|c| c.iter().copied().min().unwrap_or(i64::MAX)).collect();
        Starts { start, block_min }
    }

    /// The first index from `from` on whose start is before `e`.
    fn first_before(&self, from: usize, e: i64) -> Option<usize> {
        let n = self.start.len();
        let mut k = from;
        while k < n {
            if k % Self::B == 0 && self.block_min[k / Self::B] >= e {
                k += Self::B; // none of this block
                continue;
            }
            if self.start[k] < e {
                return Some(k);
            }
            k += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk as it was first written (a scan for the next covered run), the reference.
    fn uncovered_by_scan(runs: &Runs, covered: &[(i64, i64)]) -> Runs {
        let mut out = Vec::new();
        for &(s, e, p) in runs {
            let mut t = s;
            let mut j = covered.partition_point(|x| x.1 <= s);
            while t < e {
                match covered[j..].iter().position(|x| x.0 < e && x.1 > t).map(|k| k + j) {
                    Some(k) => {
                        let (a, b) = covered[k];
                        if a > t && a.min(e) - t >= MIN_FILL_NS {
                            out.push((t, a.min(e), p));
                        }
                        t = t.max(b);
                        j = k + 1;
                    }
                    None => {
                        if e - t >= MIN_FILL_NS {
                            out.push((t, e, p));
                        }
                        break;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn a_long_covered_run_behind_many_short_later_ones_still_cuts_an_earlier_run() {
        // 200 short runs from 1_000_000 on, then (sorted by end) a long one from 5_000 to 3_000_000
        let mut covered: Vec<(i64, i64)> = (0..200).map(|i| (1_000_000 + i * 10_000, 1_005_000 + i * 10_000)).collect();
        covered.push((5_000, 3_000_000));
        let runs: Runs = vec![(0, 20_000, 7)];
        assert_eq!(uncovered(&runs, &covered), vec![(0, 5_000, 7)]);
        assert_eq!(uncovered(&runs, &covered), uncovered_by_scan(&runs, &covered));
    }

    #[test]
    fn the_uncovered_parts_are_those_of_the_scan_on_nested_and_overlapping_runs() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = |m: i64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m as u64) as i64
        };
        for _ in 0..300 {
            let mut covered: Vec<(i64, i64)> = (0..next(400))
                .map(|_| {
                    let a = next(200_000);
                    let long = next(4) == 0;
                    (a, a + 1 + next(if long { 60_000 } else { 8_000 }))
                })
                .collect();
            covered.sort_by_key(|r| r.1);
            let mut runs: Runs = (0..next(30))
                .map(|_| {
                    let a = next(200_000);
                    (a, a + 1 + next(50_000), next(9))
                })
                .collect();
            runs.sort();
            assert_eq!(uncovered(&runs, &covered), uncovered_by_scan(&runs, &covered), "{covered:?} {runs:?}");
        }
    }

    #[test]
    fn the_task_before_a_cpus_first_switch_ran_from_the_first_event() {
        let mut s = Switches::default();
        s.seen(0, 100, -1);
        s.seen(1, 150, -1);
        s.switch(1, 400, 7, 9);
        s.seen(1, 900, -1);
        let (r, _) = s.finish();
        let r: FxHashMap<i64, Runs> = r.into_iter().collect();
        assert_eq!(r[&1], vec![(100, 400, 7), (400, 900, 9)]);
    }

    #[test]
    fn an_event_in_a_tasks_context_before_any_switch_says_it_ran_from_the_start() {
        let mut s = Switches::default();
        s.seen(0, 100, -1);
        s.seen(1, 200, 7); // an interrupt while 7 ran
        s.switch(1, 400, 7, 0);
        let (r, _) = s.finish();
        let r: FxHashMap<i64, Runs> = r.into_iter().collect();
        assert_eq!(r[&1], vec![(100, 400, 7)]);
    }

    #[test]
    fn a_switch_out_of_idle_that_was_not_recorded_starts_the_task_at_its_first_own_event() {
        let mut s = Switches::default();
        s.switch(1, 100, 7, 0); // 7 sleeps: idle
        s.seen(1, 300, 0); // an interrupt in idle
        s.seen(1, 500, 8); // 8 is running: the switch to it was not recorded
        s.switch(1, 800, 8, 0);
        let (r, _) = s.finish();
        let r: FxHashMap<i64, Runs> = r.into_iter().collect();
        assert_eq!(r[&1], vec![(500, 800, 8)]);
    }

    #[test]
    fn a_task_woken_while_its_cpu_idled_ran_from_its_wake_up_where_the_switch_to_it_was_not_recorded() {
        let mut s = Switches::default();
        s.switch(1, 100, 7, 0); // 7 sleeps: idle
        s.woke(8, 300); // 8 is woken (on another CPU, or this one)
        s.switch(1, 800, 8, 0); // 8 is seen running: the switch out of idle was not recorded
        s.woke(9, 850); // 9 is woken while the CPU idles, and seen running by an event in its context
        s.seen(1, 900, 9);
        s.woke(7, 950); // 7 is woken while 9 runs: the CPU was not idle, so 7 ran from where it is seen
        s.switch(1, 1000, 7, 0);
        let (r, g) = s.finish();
        let r: FxHashMap<i64, Runs> = r.into_iter().collect();
        assert_eq!(r[&1], vec![(300, 800, 8), (850, 1000, 9)]);
        assert_eq!(g, vec![(1, 8, 300, 800), (1, 9, 850, 900)]);
    }

    #[test]
    fn with_runtime_accounting_a_wake_up_does_not_place_an_unrecorded_switch() {
        let mut s = Switches { runtime_seen: true, ..Default::default() };
        s.switch(1, 100, 7, 0);
        s.woke(8, 300);
        s.switch(1, 800, 8, 0);
        s.seen(1, 900, 0);
        let (r, _) = s.finish();
        let r: FxHashMap<i64, Runs> = r.into_iter().collect();
        assert!(r.get(&1).is_none_or(|runs| runs.iter().all(|x| x.0 >= 800)), "{r:?}");
    }

    #[test]
    fn a_switch_whose_prev_is_not_the_current_task_closes_the_one_before() {
        let mut s = Switches::default();
        s.switch(1, 100, 7, 0);
        s.switch(1, 600, 8, 9); // 8 ran from somewhere after 100: it is placed at 600
        s.switch(1, 700, 9, 0);
        let (r, _) = s.finish();
        let r: FxHashMap<i64, Runs> = r.into_iter().collect();
        assert_eq!(r[&1], vec![(600, 700, 9)]);
    }

    #[test]
    fn runtime_runs_keep_their_time_and_switches_fill_only_what_they_leave() {
        let runs = vec![(0, 1_000_000, 5), (1_000_000, 1_100_000, 6)];
        let covered = vec![(0, 400_000), (401_000, 900_000)];
        // 1 µs at 400 µs is rounding; 900..1000 µs and all of 6's run are not covered
        assert_eq!(uncovered(&runs, &covered), vec![(900_000, 1_000_000, 5), (1_000_000, 1_100_000, 6)]);
    }
}
