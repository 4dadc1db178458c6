//! Every activation of chosen threads, from scheduling events alone, in one
//! pass over the capture in time order, a batch at a time.
//!
//! The semantics are those `python/loopscope/analysis/activations.py`
//! documents. Per thread, its events (switched in, switched out asleep or
//! preempted, woken, a sleep timer armed, run time accounted, any event in
//! its own context) at one instant are applied in that order: run, out, arm,
//! wake, in, own. Activation k is everything after the thread's k-th sleep up
//! to and including its (k+1)-th. A switch-in the kernel did not trace is
//! placed between the last event of anyone on that CPU before the thread's
//! first event in its own context after it slept, and that event, its width
//! said. Memory is each thread's open activation and the rows, not the
//! events: a capture of any length streams through. Times are the
//! capture's; `NULL` marks a figure that does not exist.

use std::collections::VecDeque;

/// A figure that does not exist (a column's null).
pub const NULL: i64 = i64::MIN;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Kind {
    Run = 0,
    Out = 1,
    Arm = 2,
    Wake = 3,
    In = 4,
    /// Any event in the thread's own context (`value`: the last event on its CPU before it).
    Own = 5,
}

/// One event of one thread: (time, kind, cpu, went to sleep, value: an
/// arm's expiry, a run's ns, an own event's last event on its CPU before it).
#[derive(Clone, Copy, Debug)]
pub struct TEv {
    pub t: i64,
    pub kind: Kind,
    pub cpu: i64,
    pub sleep: bool,
    pub value: i64,
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
    /// where runtime accounting says the thread's run began, when its switch-in was not traced
    ran_from: i64,
}

impl Group {
    fn new(act: i64) -> Self {
        Group {
            act,
            first_in: NULL,
            off: NULL,
            first_wake: NULL,
            armed: NULL,
            sum_out: 0,
            sum_in: 0,
            preemptions: 0,
            migrations: 0,
            n_in: 0,
            n_out: 0,
            last_cpu: NULL,
            ran_from: NULL,
        }
    }
}

fn some(x: i64) -> Option<i64> {
    (x != NULL).then_some(x)
}

/// A group that ended, waiting (when its switch-in was not traced) for the
/// thread's first own event at or after `after`: (its time, the last event
/// on its CPU before it).
struct Closed {
    g: Group,
    after: i64,
    seen: Option<(i64, i64)>,
}

impl Closed {
    fn ready(&self) -> bool {
        self.g.first_in != NULL || self.after == NULL || self.seen.is_some()
    }
}

/// One thread along the stream.
struct ThreadState {
    tid: i64,
    /// Its events at the latest instant seen (applied in kind order when time moves on).
    pending: Vec<TEv>,
    act: i64,
    open: Option<Group>,
    /// When it last went to sleep (the previous group's end).
    last_off: i64,
    /// Its first own event at or after the open group's `after`.
    own_since: Option<(i64, i64)>,
    /// Groups ended and not yet rows, in order.
    closed: VecDeque<Closed>,
    prev_armed: i64,
    prev_woken: i64,
    /// Held off the CPU at this time after a switch-in (`HELD_NS`): its switch-in is looked for after it.
    held: i64,
    /// A short first run that ended runnable (time, cpu): held, if its CPU then idles with a task runnable.
    cand: (i64, i64),
}

impl ThreadState {
    fn new(tid: i64) -> Self {
        ThreadState {
            tid,
            pending: Vec::new(),
            act: 0,
            open: None,
            last_off: NULL,
            own_since: None,
            closed: VecDeque::new(),
            prev_armed: NULL,
            prev_woken: NULL,
            held: NULL,
            cand: (NULL, NULL),
        }
    }

    /// Where the open group's untraced switch-in is looked for from.
    fn after(&self) -> i64 {
        let base = if self.last_off != NULL { self.last_off + 1 } else { self.open.map_or(NULL, |g| g.first_wake) };
        if self.held != NULL {
            base.max(self.held + 1)
        } else {
            base
        }
    }
}

/// A first run after a wake-up this short that ends runnable, with its CPU
/// idling within as long while a task is runnable (switched out runnable to
/// the idle task: the thread itself, or a sibling of its group picked next),
/// never reached user space: the thread's group ran out of its CPU limit
/// (cgroup bandwidth; Linux 6.18 throttles a task on its way back to user
/// space, after its switch-in), and its wait runs on to the next switch-in.
pub const HELD_NS: i64 = 200_000;

/// How early runtime accounting's start of a run can read. The kernel reads
/// its clock for the next task's run a moment before it traces the switch
/// (µs, interrupts off). It can read late by any amount: the task clock
/// leaves out the vCPU's steal (paravirt time accounting; 61 µs of an 82 µs
/// run under a busy host here), and the accounting event is stamped after
/// its clock was read. So it bounds an untraced switch-in from above, this
/// much after it, and never from below. A host that takes the vCPU away
/// between that clock read and the switch's trace (interrupts off in the
/// guest do not stop it) breaks the bound by the stall: rare (seen once in a
/// 1.5 s 1 kHz probe beside a busy host), and nothing in the guest's events
/// shows it.
pub const RUN_EARLY_NS: i64 = 20_000;

/// The thread was held (`HELD_NS`) at `at`: its first switch-in did not count.
fn hold(th: &mut ThreadState, at: i64) {
    if let Some(g) = th.open.as_mut() {
        if g.first_in != NULL && g.n_in == 1 {
            g.first_in = NULL;
            th.held = at;
            th.own_since = None;
        }
    }
    th.cand = (NULL, NULL);
}

/// Every activation of chosen threads from events fed in time order (any
/// number of batches), then `finish`.
pub struct Stream {
    index: rustc_hash::FxHashMap<i64, usize>,
    threads: Vec<ThreadState>,
    /// Per CPU (by number): the latest event time seen, and the latest before that one.
    cpu_last: Vec<(i64, i64)>,
    lost: Losses,
    out: Sink,
}

impl Stream {
    pub fn new(tids: &[i64], lost: Losses) -> Self {
        Self::into(tids, lost, Sink::Rows(Out::default()))
    }

    /// The pass with its activations going to `out` (rows, or a summary).
    pub fn into(tids: &[i64], lost: Losses, out: Sink) -> Self {
        let mut sorted = tids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let index = sorted.iter().enumerate().map(|(i, &t)| (t, i)).collect();
        let threads = sorted.into_iter().map(ThreadState::new).collect();
        Stream { index, threads, cpu_last: Vec::new(), lost, out }
    }

    /// The last event on `cpu` strictly before `t`; `t` is then seen there.
    fn see(&mut self, cpu: i64, t: i64) -> i64 {
        let c = cpu.clamp(0, 1 << 16) as usize;
        if c >= self.cpu_last.len() {
            self.cpu_last.resize(c + 1, (NULL, NULL));
        }
        let e = &mut self.cpu_last[c];
        if e.0 == NULL || t > e.0 {
            *e = (t, e.0);
        }
        if e.0 < t {
            e.0
        } else {
            e.1
        }
    }

    /// One event, in time order: its kind (1 switch, 2 wake-up, 3 sleep
    /// timer armed, 4 run time accounted, else 0), the task in whose context
    /// it ran (`pid`), the switch's previous task or the woken one
    /// (`target`), the switch's next task, whether the previous task went to
    /// sleep, and the arm's expiry or the run's ns (`NULL`: none).
    #[allow(clippy::too_many_arguments)]
    pub fn event(&mut self, t: i64, cpu: i64, kind: i64, pid: i64, target: i64, next_pid: i64, asleep: bool, value: i64) {
        let lower = self.see(cpu, t);
        if kind == 1 && next_pid == 0 && !asleep && target > 0 {
            self.idled_runnable(cpu, t);
        }
        match kind {
            1 => {
                self.push(next_pid, TEv { t, kind: Kind::In, cpu, sleep: false, value: NULL });
                self.push(target, TEv { t, kind: Kind::Out, cpu, sleep: asleep, value: next_pid });
            }
            2 => self.push(target, TEv { t, kind: Kind::Wake, cpu, sleep: false, value: NULL }),
            3 => self.push(pid, TEv { t, kind: Kind::Arm, cpu, sleep: false, value }),
            4 => self.push(target, TEv { t, kind: Kind::Run, cpu, sleep: false, value }),
            _ => {}
        }
        self.push(pid, TEv { t, kind: Kind::Own, cpu, sleep: false, value: lower });
    }

    /// A task was switched out runnable to the idle task on `cpu` at `t`: a
    /// thread whose short first run there ended runnable just before was held.
    fn idled_runnable(&mut self, cpu: i64, t: i64) {
        for th in self.threads.iter_mut() {
            if th.pending.first().is_some_and(|p| p.t < t) {
                apply(th, &self.lost, &mut self.out);
            }
            let (at, c) = th.cand;
            if at != NULL && c == cpu && t - at <= HELD_NS {
                hold(th, at);
            }
        }
    }

    fn push(&mut self, who: i64, e: TEv) {
        let Some(&j) = self.index.get(&who) else { return };
        let th = &mut self.threads[j];
        if th.pending.first().is_some_and(|p| p.t != e.t) {
            apply(th, &self.lost, &mut self.out);
        }
        th.pending.push(e);
    }

    /// Every thread's last group ended; the rows, by thread id then
    /// activation (none when the pass was summarizing).
    pub fn finish(self) -> Out {
        match self.close_all() {
            Sink::Rows(o) => o.sorted(),
            Sink::Summary(_) => Out::default(),
        }
    }

    /// Every thread's last group ended; the summary (empty when the pass kept rows).
    pub fn finish_summary(self) -> Summary {
        match self.close_all() {
            Sink::Summary(s) => s,
            Sink::Rows(_) => Summary::new(None, 0),
        }
    }

    fn close_all(mut self) -> Sink {
        for th in self.threads.iter_mut() {
            apply(th, &self.lost, &mut self.out);
            if let Some(g) = th.open.take() {
                close(th, g);
            }
            while let Some(c) = th.closed.pop_front() {
                row(th, c, &self.lost, &mut self.out);
            }
        }
        self.out
    }
}

/// A thread's pending events (one instant), in kind order.
fn apply(th: &mut ThreadState, lost: &Losses, out: &mut Sink) {
    let mut pend = std::mem::take(&mut th.pending);
    pend.sort_by_key(|e| e.kind);
    for &e in &pend {
        step(th, e, lost, out);
    }
    pend.clear();
    th.pending = pend;
}

fn step(th: &mut ThreadState, e: TEv, lost: &Losses, out: &mut Sink) {
    if e.kind == Kind::Own {
        // groups waiting for this: their switch-in is placed before it
        while let Some(c) = th.closed.front_mut() {
            if !c.ready() && e.t >= c.after {
                c.seen = Some((e.t, e.value));
            }
            if !c.ready() {
                break;
            }
            let c = th.closed.pop_front().unwrap();
            row(th, c, lost, out);
        }
        let after = th.after();
        if th.own_since.is_none() && after != NULL && e.t >= after {
            th.own_since = Some((e.t, e.value));
        }
        return;
    }
    let act = th.act;
    let mut held = false;
    let g = th.open.get_or_insert_with(|| Group::new(act));
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
            if !e.sleep && g.n_out == 1 && g.first_wake != NULL && g.first_in != NULL && e.t - g.first_in < HELD_NS {
                // maybe held on the way back to user space: not yet run
                held = true;
            }
        }
        Kind::Wake => {
            if g.first_wake == NULL || e.t < g.first_wake {
                g.first_wake = e.t;
            }
        }
        Kind::Arm => g.armed = e.value,
        Kind::Run => {
            if g.first_in == NULL && e.value != NULL && g.ran_from == NULL {
                g.ran_from = e.t - e.value;
            }
        }
        Kind::Own => {}
    }
    if matches!(e.kind, Kind::In | Kind::Run) {
        if g.last_cpu != NULL && g.last_cpu != e.cpu {
            g.migrations += 1;
        }
        g.last_cpu = e.cpu;
    }
    if held {
        if e.value == 0 {
            hold(th, e.t);
        } else {
            th.cand = (e.t, e.cpu);
        }
    } else if e.kind == Kind::In {
        th.cand = (NULL, NULL);
    }
    if e.kind == Kind::Out && e.sleep {
        let g = th.open.take().unwrap();
        close(th, g);
        th.act += 1;
        th.last_off = e.t;
        th.own_since = None;
        th.held = NULL;
        th.cand = (NULL, NULL);
    }
}

/// A group ends: a row now, or queued (in order) until its untraced switch-in can be placed.
fn close(th: &mut ThreadState, g: Group) {
    let after = if th.last_off != NULL { th.last_off + 1 } else { g.first_wake };
    let seen = if g.first_in == NULL && after != NULL { th.own_since.filter(|s| s.0 >= after) } else { None };
    th.closed.push_back(Closed { g, after, seen });
}

/// The row of a group whose switch-in is known (or never will be).
fn row(th: &mut ThreadState, c: Closed, lost: &Losses, o: &mut Sink) {
    let g = c.g;
    let (seen, lower) = match c.seen {
        Some((s, l)) if g.first_in == NULL => (s, l),
        _ => (NULL, NULL),
    };
    // an untraced switch-in lies in [on, upper]: after the last other event on its CPU (or the wake-up)
    let (on, upper) = if seen != NULL {
        let w = some(g.first_wake).filter(|&w| w <= seen);
        let at = match (some(lower), w) {
            (Some(a), Some(b)) => a.max(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => NULL,
        };
        // and no later than RUN_EARLY_NS after runtime accounting's start of the run, where recorded
        let ran = some(g.ran_from).filter(|&r| r <= seen && r >= c.after && (at == NULL || r >= at));
        match (at, ran) {
            (NULL, Some(r)) => (r, seen),
            (_, Some(r)) => (at, seen.min(r + RUN_EARLY_NS)),
            _ => (at, seen),
        }
    } else {
        (g.first_in, g.first_in)
    };
    let woken = if g.first_wake != NULL && on != NULL && g.first_wake <= on { g.first_wake } else { NULL };
    let runtime = if seen != NULL && g.n_out == g.n_in + 1 && on != NULL {
        g.sum_out - g.sum_in - on
    } else if seen == NULL && g.n_out == g.n_in {
        g.sum_out - g.sum_in
    } else {
        NULL
    };
    let timer_expires = th.prev_armed;
    let period = if woken != NULL && th.prev_woken != NULL { woken - th.prev_woken } else { NULL };
    th.prev_armed = g.armed;
    th.prev_woken = woken;
    if on == NULL {
        return;
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
    o.push(Row {
        tid: th.tid,
        act: g.act,
        woken,
        on,
        off: g.off,
        wakeup_latency: if woken != NULL { on - woken } else { NULL },
        timer_expires,
        timer_lateness: if timer_expires != NULL && timer_expires <= on { on - timer_expires } else { NULL },
        runtime: if whole { runtime } else { NULL },
        preemptions: g.preemptions,
        migrations: g.migrations,
        period,
        on_bound: upper - on,
        complete,
    });
}

mod out;
pub use out::{Out, Row, Sink};
pub mod summary;
pub use summary::Summary;
mod nearest;
pub use nearest::Nearest;

#[cfg(test)]
mod tests;
