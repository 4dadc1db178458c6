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
    cur: FxHashMap<i64, (i64, i64)>,
    runs: FxHashMap<i64, Runs>,
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
        match self.cur.get(&cpu) {
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
        let from = match (self.cur.get(&cpu), self.woken.get(&task)) {
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
        match self.cur.get(&cpu) {
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
                self.runs.entry(cpu).or_default().push((since, t, p));
            }
        }
    }

    /// Every CPU's runs, the open ones closed at the last event, and the
    /// runs whose start was placed at a wake-up.
    pub fn finish(mut self) -> (FxHashMap<i64, Runs>, Vec<Guess>) {
        let end = self.t_end;
        let open: Vec<(i64, (i64, i64))> = self.cur.drain().collect();
        for (c, (p, since)) in open {
            if p > 0 && end > since {
                self.runs.entry(c).or_default().push((since, end, p));
            }
        }
        (self.runs, self.guesses)
    }
}

/// The parts of `runs` that no run of `covered` (sorted by end, disjoint
/// but for rounding) overlaps, at least MIN_FILL_NS long.
pub fn uncovered(runs: &Runs, covered: &[(i64, i64)]) -> Runs {
    let mut out = Vec::new();
    for &(s, e, p) in runs {
        let mut t = s;
        // the first covered run that ends after s
        let mut j = covered.partition_point(|x| x.1 <= s);
        while j > 0 && covered[j - 1].1 > s {
            j -= 1;
        }
        while t < e {
            let next = covered[j..].iter().position(|x| x.0 < e && x.1 > t).map(|k| k + j);
            match next {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_before_a_cpus_first_switch_ran_from_the_first_event() {
        let mut s = Switches::default();
        s.seen(0, 100, -1);
        s.seen(1, 150, -1);
        s.switch(1, 400, 7, 9);
        s.seen(1, 900, -1);
        let (r, _) = s.finish();
        assert_eq!(r[&1], vec![(100, 400, 7), (400, 900, 9)]);
    }

    #[test]
    fn an_event_in_a_tasks_context_before_any_switch_says_it_ran_from_the_start() {
        let mut s = Switches::default();
        s.seen(0, 100, -1);
        s.seen(1, 200, 7); // an interrupt while 7 ran
        s.switch(1, 400, 7, 0);
        let (r, _) = s.finish();
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
        assert!(r.get(&1).is_none_or(|runs| runs.iter().all(|x| x.0 >= 800)), "{r:?}");
    }

    #[test]
    fn a_switch_whose_prev_is_not_the_current_task_closes_the_one_before() {
        let mut s = Switches::default();
        s.switch(1, 100, 7, 0);
        s.switch(1, 600, 8, 9); // 8 ran from somewhere after 100: it is placed at 600
        s.switch(1, 700, 9, 0);
        let (r, _) = s.finish();
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
