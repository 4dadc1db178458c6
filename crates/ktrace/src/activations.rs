//! Every activation of chosen threads, from scheduling events alone, in one pass.
//!
//! The semantics are those `python/loopscope/analysis/activations.py`
//! documents; this is their native form (the polars one read 1 M events a
//! second of a busy capture, this one reads tens). Per thread, its events
//! (switched in, switched out asleep or preempted, woken, a sleep timer armed,
//! run time accounted) are sorted by time and, at one instant, in that order:
//! run, out, arm, wake, in. Activation k is everything after the thread's
//! k-th sleep up to and including its (k+1)-th. A switch-in the kernel did
//! not trace is placed between the last event of anyone on that CPU before
//! the thread's first event in its own context and that event, its width
//! said. Times are the capture's; `NULL` marks a figure that does not exist.

/// A figure that does not exist (a column's null).
pub const NULL: i64 = i64::MIN;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Kind {
    Run = 0,
    Out = 1,
    Arm = 2,
    Wake = 3,
    In = 4,
}

/// One event of one thread: (time, kind, cpu, went to sleep, value: an arm's expiry, a run's ns).
#[derive(Clone, Copy, Debug)]
pub struct TEv {
    pub t: i64,
    pub kind: Kind,
    pub cpu: i64,
    pub sleep: bool,
    pub value: i64,
}

/// Per thread: its events, and the (time, cpu) of every event in its own context.
#[derive(Default, Debug)]
pub struct Thread {
    pub tid: i64,
    pub events: Vec<TEv>,
    pub own: Vec<(i64, i64)>,
}

/// Every event's (time, cpu), per CPU, time-sorted: where a switch-in may have been.
pub struct Cpus {
    by_cpu: rustc_hash::FxHashMap<i64, Vec<i64>>,
}

impl Cpus {
    pub fn new(t: &[i64], cpu: &[i64]) -> Self {
        let mut by_cpu: rustc_hash::FxHashMap<i64, Vec<i64>> = Default::default();
        for (&a, &c) in t.iter().zip(cpu) {
            by_cpu.entry(c).or_default().push(a);
        }
        for v in by_cpu.values_mut() {
            v.sort_unstable();
        }
        Cpus { by_cpu }
    }

    /// The last event on `cpu` at or before `t`.
    fn last_at_or_before(&self, cpu: i64, t: i64) -> Option<i64> {
        let v = self.by_cpu.get(&cpu)?;
        let i = v.partition_point(|&x| x <= t);
        if i == 0 {
            None
        } else {
            Some(v[i - 1])
        }
    }
}

/// Loss windows, for "does any overlap [lo, hi]" in log time.
pub struct Losses {
    start: Vec<i64>,
    max_end: Vec<i64>,
}

impl Losses {
    pub fn new(mut w: Vec<(i64, i64)>) -> Self {
        w.sort_unstable();
        let mut max_end = Vec::with_capacity(w.len());
        let mut m = i64::MIN;
        for &(_, e) in &w {
            m = m.max(e);
            max_end.push(m);
        }
        Losses { start: w.iter().map(|x| x.0).collect(), max_end }
    }

    fn overlaps(&self, lo: i64, hi: i64) -> bool {
        let i = self.start.partition_point(|&s| s <= hi);
        i > 0 && self.max_end[i - 1] >= lo
    }
}

/// The columns of activations (one entry per activation, `NULL` for none).
#[derive(Default, Debug)]
pub struct Out {
    pub tid: Vec<i64>,
    pub act: Vec<i64>,
    pub woken: Vec<i64>,
    pub on: Vec<i64>,
    pub off: Vec<i64>,
    pub wakeup_latency: Vec<i64>,
    pub timer_expires: Vec<i64>,
    pub timer_lateness: Vec<i64>,
    pub runtime: Vec<i64>,
    pub preemptions: Vec<i64>,
    pub migrations: Vec<i64>,
    pub period: Vec<i64>,
    pub on_bound: Vec<i64>,
    pub complete: Vec<bool>,
}

#[derive(Clone, Copy)]
struct Group {
    act: i64,
    first_in: i64,
    off: i64,
    first_wake: i64,
    armed: i64,
    sum_out: i64,
    sum_in: i64,
    preemptions: i64,
    migrations: i64,
    n_in: i64,
    n_out: i64,
    last_cpu: i64,
}

impl Group {
    fn new(act: i64) -> Self {
        Group { act, first_in: NULL, off: NULL, first_wake: NULL, armed: NULL, sum_out: 0, sum_in: 0, preemptions: 0, migrations: 0, n_in: 0, n_out: 0, last_cpu: NULL }
    }
}

fn some(x: i64) -> Option<i64> {
    (x != NULL).then_some(x)
}

/// The groups (activations with at least one event) of one thread, in order.
fn groups(th: &mut Thread) -> Vec<Group> {
    th.events.sort_by_key(|e| (e.t, e.kind));
    let mut out: Vec<Group> = Vec::new();
    let mut act = 0i64;
    for e in &th.events {
        if out.last().is_none_or(|g| g.act != act) {
            out.push(Group::new(act));
        }
        let g = out.last_mut().unwrap();
        match e.kind {
            Kind::In => {
                if g.first_in == NULL || e.t < g.first_in {
                    g.first_in = e.t;
                }
                g.sum_in += e.t;
                g.n_in += 1;
            }
            Kind::Out => {
                if e.sleep && (g.off == NULL || e.t > g.off) {
                    g.off = e.t;
                }
                g.sum_out += e.t;
                g.n_out += 1;
                if !e.sleep {
                    g.preemptions += 1;
                }
            }
            Kind::Wake => {
                if g.first_wake == NULL || e.t < g.first_wake {
                    g.first_wake = e.t;
                }
            }
            Kind::Arm => g.armed = e.value,
            Kind::Run => {}
        }
        if matches!(e.kind, Kind::In | Kind::Run) {
            if g.last_cpu != NULL && g.last_cpu != e.cpu {
                g.migrations += 1;
            }
            g.last_cpu = e.cpu;
        }
        if e.kind == Kind::Out && e.sleep {
            act += 1;
        }
    }
    out
}

/// Every activation of every thread in `threads`.
pub fn activations(threads: &mut [Thread], cpus: &Cpus, lost: &Losses) -> Out {
    let mut o = Out::default();
    for th in threads.iter_mut() {
        th.own.sort_unstable();
        let gs = groups(th);
        let mut prev_off = NULL;
        let mut prev_armed = NULL;
        let mut prev_woken = NULL;
        for g in &gs {
            // a switch-in not traced: between the last event on its CPU and the thread's first own event after it slept
            let (mut seen, mut lower) = (NULL, NULL);
            if g.first_in == NULL {
                let after = if prev_off != NULL { prev_off + 1 } else { g.first_wake };
                if after != NULL {
                    let i = th.own.partition_point(|x| x.0 < after);
                    if let Some(&(s, c)) = th.own.get(i) {
                        seen = s;
                        lower = cpus.last_at_or_before(c, s - 1).unwrap_or(NULL);
                    }
                }
            }
            let on = if seen != NULL {
                let w = some(g.first_wake).filter(|&w| w <= seen);
                match (some(lower), w) {
                    (Some(a), Some(b)) => a.max(b),
                    (Some(a), None) => a,
                    (None, Some(b)) => b,
                    (None, None) => NULL,
                }
            } else {
                g.first_in
            };
            let woken = if g.first_wake != NULL && on != NULL && g.first_wake <= on { g.first_wake } else { NULL };
            let runtime = if seen != NULL && g.n_out == g.n_in + 1 && on != NULL {
                g.sum_out - g.sum_in - on
            } else if seen == NULL && g.n_out == g.n_in {
                g.sum_out - g.sum_in
            } else {
                NULL
            };
            let timer_expires = prev_armed;
            let period = if woken != NULL && prev_woken != NULL { woken - prev_woken } else { NULL };
            prev_armed = g.armed;
            prev_woken = woken;
            prev_off = g.off;
            if on == NULL {
                continue;
            }
            let whole = g.off != NULL && g.act > 0;
            let mut complete = whole;
            if complete {
                let lo = if woken != NULL { woken } else { on };
                let hi = if g.off != NULL { g.off } else { on };
                if lost.overlaps(lo, hi) {
                    complete = false;
                }
            }
            o.tid.push(th.tid);
            o.act.push(g.act);
            o.woken.push(woken);
            o.on.push(on);
            o.off.push(g.off);
            o.wakeup_latency.push(if woken != NULL { on - woken } else { NULL });
            o.timer_expires.push(timer_expires);
            o.timer_lateness.push(if timer_expires != NULL && timer_expires <= on { on - timer_expires } else { NULL });
            o.runtime.push(if whole { runtime } else { NULL });
            o.preemptions.push(g.preemptions);
            o.migrations.push(g.migrations);
            o.period.push(period);
            o.on_bound.push(if seen != NULL { seen - on } else { 0 });
            o.complete.push(complete);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(t: i64, kind: Kind, cpu: i64, sleep: bool) -> TEv {
        TEv { t, kind, cpu, sleep, value: NULL }
    }

    #[test]
    fn a_timer_sleep_gives_its_lateness_and_wake_up_latency() {
        let mut a = TEv { t: 100, kind: Kind::Arm, cpu: 0, sleep: false, value: 1000 };
        a.value = 1000;
        let mut th = vec![Thread {
            tid: 7,
            events: vec![ev(50, Kind::In, 0, false), a, ev(110, Kind::Out, 0, true), ev(1005, Kind::Wake, 0, false), ev(1012, Kind::In, 0, false), ev(1030, Kind::Out, 0, true)],
            own: vec![(50, 0), (100, 0)],
        }];
        let o = activations(&mut th, &Cpus::new(&[], &[]), &Losses::new(vec![]));
        let i = o.act.iter().position(|&a| a == 1).unwrap();
        assert_eq!((o.woken[i], o.on[i], o.wakeup_latency[i], o.timer_lateness[i], o.runtime[i], o.complete[i]), (1005, 1012, 7, 12, 18, true));
    }

    #[test]
    fn an_untraced_switch_in_is_placed_after_the_last_event_on_its_cpu() {
        let mut th = vec![Thread {
            tid: 7,
            events: vec![ev(10, Kind::In, 1, false), ev(20, Kind::Out, 1, true), ev(100, Kind::Wake, 1, false), ev(200, Kind::Out, 1, true)],
            own: vec![(10, 1), (150, 1)],
        }];
        let cpus = Cpus::new(&[10, 20, 100, 130, 150], &[1, 1, 1, 1, 1]);
        let o = activations(&mut th, &cpus, &Losses::new(vec![]));
        let i = o.act.iter().position(|&a| a == 1).unwrap();
        assert_eq!((o.on[i], o.on_bound[i], o.wakeup_latency[i]), (130, 20, 30));
    }

    #[test]
    fn an_activation_overlapping_lost_events_is_incomplete() {
        let mut th = vec![Thread {
            tid: 7,
            events: vec![ev(10, Kind::Out, 0, true), ev(100, Kind::Wake, 0, false), ev(110, Kind::In, 0, false), ev(200, Kind::Out, 0, true)],
            own: vec![],
        }];
        let o = activations(&mut th, &Cpus::new(&[], &[]), &Losses::new(vec![(150, 160)]));
        assert!(!o.complete[0]);
    }
}
