//! Why was it late: windows of threads split into causes, from kernel events.
//!
//! One call takes a cluster of outlier windows and the kernel events around
//! them (the columns `decode` produces, text as indices into string tables)
//! and returns, per window, its causes in nanoseconds. Building the per-CPU
//! picture (who ran when from runtime accounting, which interrupt handler
//! ran when, innermost first) and each thread's own events is one pass over
//! the events; each window is then a few binary searches. The rules are the
//! ones `python/loopscope/analysis/attribution.py` documents; that module is
//! now a thin layer over this one.
//!
//! - a wake-up window [a, b] (`span` false): on the CPU the thread ran on,
//!   interrupt handlers first, then every other task that ran (but from the
//!   expiry of the timer it slept on to the interrupt that woke it, `timer
//!   interrupt late`: `late_until`), then idle
//!   time: before the thread's wake-up `CPU idle` (or `timer slack` inside
//!   the slack of the timer it slept on, `page faults` after a fault of its
//!   own), after it `scheduling latency`; from its switch-in to b, `return
//!   to user space`;
//! - a span (`span` true): its own runs (`running`, less interrupts), its
//!   sleeps by the state it switched out in (`blocked: sleeping`, ...), or
//!   `blocked: <task>` when another task woke it, `page faults` when it
//!   blocked right after a fault of its own, `timer slack` past the soft
//!   expiry of the timer it slept on; while runnable, what ran instead.
//!
//! Times are the kernel's CLOCK_MONOTONIC.

use std::collections::HashMap;

use rustc_hash::FxHashMap;

use crate::activations::RUN_EARLY_NS;
use crate::percpu::PerCpu;
use crate::switches::{uncovered, Switches};

/// No value in a column (a field the event does not have).
const NONE: i64 = -1;
/// Runtime segments of one task closer than this are one run.
const JOIN_NS: i64 = 2_000;
/// The window's start within this of a timer's soft expiry: the timer it slept on.
const SLACK_MATCH_NS: i64 = 20_000;
/// An uninterruptible sleep this soon after a fault of the thread: waiting for the page.
const FAULT_BEFORE_NS: i64 = 200_000;
/// Idle shorter than this between two interrupts of one kind, inside a
/// window before the thread's wake-up, counts to them (`Kernel::storm`).
const STORM_GAP_NS: i64 = 50_000;
/// The longest a group can be held by its CPU limit: cgroup bandwidth's longest period (1 s).
const MAX_HOLD_NS: i64 = 1_000_000_000;

/// Whether a kernel priority is a real-time one (SCHED_FIFO/RR: 0-99;
/// deadline tasks show -1, the others 100-139).
fn is_rt(prio: i64) -> bool {
    (0..100).contains(&prio)
}
/// A wait on another task shorter than this is not looked into (what held that task up).
const CHAIN_MIN_NS: i64 = 100_000;
/// Another task ran on the thread's CPU between its timer's expiry and the
/// interrupt that woke it: the interrupt came late. That task did not hold
/// the wake-up up unless it kept interrupts off in the kernel, and a
/// hypervisor may deliver the interrupt late (this VM: 0.3-1 ms under a
/// user-space spinner that cannot turn interrupts off); the guest cannot
/// tell these apart, so neither is named.
pub const LATE_IRQ: &str = "timer interrupt late";
/// The local timer interrupt's handlers (hrtimer callbacks, the tick).
const TIMER_IRQ: &str = "timer interrupt";
/// A wake-up at most this long after a timer's hard expiry is that timer's,
/// come late (a CPU leaving deep idle takes tens of µs in this VM).
const LATE_EXPIRY_NS: i64 = 1_000_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ev {
    Switch,
    Wakeup,
    Waking,
    Migrate,
    Runtime,
    IrqEntry,
    IrqExit,
    SoftEntry,
    SoftExit,
    TimerEntry,
    TimerExit,
    CallEntry,
    CallExit,
    ReschedEntry,
    ReschedExit,
    PageFault,
    HrStart,
    Tlb,
    Other,
}

fn ev_of(name: &str) -> Ev {
    match name {
        "sched_switch" => Ev::Switch,
        "sched_wakeup" => Ev::Wakeup,
        "sched_waking" => Ev::Waking,
        "sched_migrate_task" => Ev::Migrate,
        "sched_stat_runtime" => Ev::Runtime,
        "irq_handler_entry" => Ev::IrqEntry,
        "irq_handler_exit" => Ev::IrqExit,
        "softirq_entry" => Ev::SoftEntry,
        "softirq_exit" => Ev::SoftExit,
        "local_timer_entry" => Ev::TimerEntry,
        "local_timer_exit" => Ev::TimerExit,
        "call_function_single_entry" | "call_function_entry" => Ev::CallEntry,
        "call_function_single_exit" | "call_function_exit" => Ev::CallExit,
        "reschedule_entry" => Ev::ReschedEntry,
        "reschedule_exit" => Ev::ReschedExit,
        "page_fault_user" => Ev::PageFault,
        "hrtimer_start" => Ev::HrStart,
        "csd_function_entry" => Ev::Tlb,
        _ => Ev::Other,
    }
}

/// The events of a cluster, one entry per event in each column (NONE: no such field).
pub struct Events<'a> {
    pub t_ns: &'a [i64],
    pub cpu: &'a [i64],
    /// index into `event_names`
    pub event: &'a [i64],
    /// the task that was current (its kernel pid: a thread id)
    pub pid: &'a [i64],
    pub target: &'a [i64],
    /// index into `comms`
    pub target_comm: &'a [i64],
    pub next_pid: &'a [i64],
    pub next_comm: &'a [i64],
    /// index into `states`
    pub prev_state: &'a [i64],
    /// index into `names`
    pub name: &'a [i64],
    pub runtime: &'a [i64],
    pub expires: &'a [i64],
    pub softexpires: &'a [i64],
    /// the kernel priority of the target task (sched_switch: prev's; wake-ups: the woken task's), and of the next
    pub prio: &'a [i64],
    pub next_prio: &'a [i64],
    pub event_names: &'a [String],
    pub comms: &'a [String],
    pub states: &'a [String],
    pub names: &'a [String],
}

/// What the run knows beyond the events.
pub struct Context {
    /// threads named by the run (loads, the lab's processes): tid → label
    pub roles: HashMap<i64, String>,
    /// a `perf` thread is the lab's capture (runs recorded with perf record)
    pub perf_is_lab: bool,
    /// events the capture lost, and where when known (cpu, start, end, count)
    pub lost: i64,
    pub lost_at: Option<Vec<(i64, i64, i64, i64)>>,
    pub t_first: i64,
    pub t_last: i64,
    /// the CPU-limited cgroup a measured thread is in (tid → its path), when known
    pub groups: HashMap<i64, String>,
}

/// A window of thread `tid`: [a, b), split as a span or as a wake-up.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub id: i64,
    pub tid: i64,
    pub a: i64,
    pub b: i64,
    pub span: bool,
}

/// One window's result.
#[derive(Debug, Default, Clone)]
pub struct Split {
    pub id: i64,
    pub causes: Vec<(String, i64)>,
    pub cpu: Option<i64>,
    pub migrations: i64,
    pub page_faults: i64,
    pub complete: bool,
    pub missing: Option<String>,
    /// what rtla's rule blames: the task running on the CPU when the window
    /// began (the timer fired), else `CPU idle`; the thread itself running
    /// then: the CPU's last other task before it
    pub rule: Option<String>,
    /// a wake-up window's causes before the thread's wake-up (from the start
    /// of the window, its timer's expiry, to the wake-up); None: no wake-up recorded
    pub before: Option<Vec<(String, i64)>>,
}

/// How attribution names a task that ran: the run's own names first (by
/// thread id), then the names loopscope's components give themselves,
/// else `thread: <comm>`.
pub fn task_label(comm: &str, pid: i64, roles: &HashMap<i64, String>, perf_is_lab: bool) -> String {
    if let Some(r) = roles.get(&pid) {
        return r.clone();
    }
    if comm == "ls-kcapture" || (perf_is_lab && comm == "perf") {
        return "lab: capture".into();
    }
    if comm.starts_with("ls-netem") {
        return "lab: emulator".into();
    }
    if comm == "ls-agent" || comm == "ls-ctl" {
        return "lab: agent".into();
    }
    if comm.starts_with("ls-sync") {
        return "lab: sync".into();
    }
    if comm == "ls-probe" {
        return "lab: probe".into();
    }
    if comm == "loopscope-wr" {
        return "lab: writer".into();
    }
    if let Some(rest) = comm.strip_prefix("ld:") {
        return format!("load: {rest}");
    }
    format!("thread: {comm}")
}

fn blocked_label(state: &str) -> String {
    match state {
        "S" => "blocked: sleeping".into(),
        "D" => "blocked: uninterruptible (I/O)".into(),
        "I" => "blocked: idle kernel thread".into(),
        "T" => "blocked: stopped".into(),
        "t" => "blocked: traced".into(),
        s => format!("blocked ({s})"),
    }
}

/// Left bisection: the first index whose value is >= x.
fn lower(v: &[i64], x: i64) -> usize {
    v.partition_point(|&y| y < x)
}

/// Right bisection: the first index whose value is > x.
fn upper(v: &[i64], x: i64) -> usize {
    v.partition_point(|&y| y <= x)
}

fn count_in(v: &[i64], a: i64, b: i64) -> i64 {
    upper(v, b) as i64 - lower(v, a) as i64
}

#[derive(Default)]
struct Cpu {
    run_s: Vec<i64>,
    run_e: Vec<i64>,
    run_pid: Vec<i64>,
    run_label: Vec<usize>,
    irq_s: Vec<i64>,
    irq_e: Vec<i64>,
    irq_label: Vec<usize>,
    /// stretches the CPU idled from a task's switch-out while runnable to that task's next run there: its group out of its CPU limit
    thr_s: Vec<i64>,
    thr_e: Vec<i64>,
    /// stretches from a real-time task's switch-out while runnable to a lower class (RT throttling, or the
    /// fair server's share) to the next real-time task's switch-in: real-time tasks here were held
    rt_s: Vec<i64>,
    rt_e: Vec<i64>,
}

#[derive(Default)]
struct Thread {
    so_t: Vec<i64>,
    /// the first letter of the state each switch-out left it in (0: none recorded): a byte, not a string per switch
    so_state: Vec<u8>,
    rs: Vec<i64>,
    re: Vec<i64>,
    rc: Vec<i64>,
    sw_t: Vec<i64>,
    sw_c: Vec<i64>,
    wake: Vec<i64>,
    migr: Vec<i64>,
    pf: Vec<i64>,
    wk_t: Vec<i64>,
    wk_by: Vec<i64>,
    wk_cpu: Vec<i64>,
    hs_t: Vec<i64>,
    hs_exp: Vec<i64>,
    hs_soft: Vec<i64>,
    /// how many of its runs came from runtime accounting
    from_runtime: usize,
    /// runs of its whose start the switches placed at its wake-up: (wake-up, first event showing it run)
    guess: Vec<(i64, i64)>,
    /// whether it ran real-time when last seen (its priority in the switches and wake-ups)
    rt: bool,
}

/// Labels, each once; segments hold their index.
#[derive(Default)]
struct Labels {
    list: Vec<String>,
    map: FxHashMap<String, usize>,
}

impl Labels {
    fn get(&mut self, s: String) -> usize {
        if let Some(&i) = self.map.get(&s) {
            return i;
        }
        self.list.push(s.clone());
        self.map.insert(s, self.list.len() - 1);
        self.list.len() - 1
    }
}

/// Causes of one window in the order they were first found.
#[derive(Default)]
struct Acc(Vec<(String, i64)>);

impl Acc {
    fn add(&mut self, k: &str, ns: i64) {
        if let Some(e) = self.0.iter_mut().find(|e| e.0 == k) {
            e.1 += ns;
        } else {
            self.0.push((k.to_string(), ns));
        }
    }
    fn take(&mut self, k: &str) -> i64 {
        match self.0.iter().position(|e| e.0 == k) {
            Some(i) => self.0.remove(i).1,
            None => 0,
        }
    }
}

/// What a thread waited on, for splitting what its CPU did meanwhile.
#[derive(Clone, Copy, Default)]
struct Wait {
    /// its wake-up (None: none recorded); idle before it is `CPU idle`, after it `scheduling latency`
    woke: Option<i64>,
    /// [soft, hard) of the timer it slept on, when it had slack
    slack: Option<(i64, i64)>,
    /// a page fault of its own it waited on from then
    fault: Option<i64>,
    /// when the timer interrupt that woke it began: another task's run before it is `LATE_IRQ`
    late: Option<i64>,
}

impl Wait {
    fn woken(woke: Option<i64>) -> Self {
        Wait { woke, ..Default::default() }
    }
}

/// The kernel's picture of a cluster: per CPU and per thread of interest.
///
/// It is built by one pass over the events, fed in time order a chunk at a
/// time (`start`, `feed`, then the windows split): only the per-CPU and
/// per-thread picture is kept, never the events, so a cluster's memory is
/// that picture and one chunk, however long its windows are.
pub struct Kernel<'a> {
    ctx: &'a Context,
    /// task names (`target_comm`, `next_comm` index it)
    comms: &'a [String],
    kinds: Vec<Ev>,
    cpus: FxHashMap<i64, Cpu>,
    threads: FxHashMap<i64, Thread>,
    labels: Labels,
    /// each task's latest name in the events (its index into `comms`)
    comm_of: FxHashMap<i64, i64>,
    /// the (task, name) last noted in `comm_of`, in a slot by task: a repeat needs no insert
    named: Vec<(i64, i64)>,
    /// the pass while events are fed; None once it ended
    pass: Option<Pass>,
}

/// Slots of `Kernel::named` (a power of two).
const NAMED: usize = 256;

fn text(table: &[String], i: i64) -> Option<&str> {
    if i < 0 {
        None
    } else {
        table.get(i as usize).map(|s| s.as_str())
    }
}

/// What `Kernel::new`'s one pass keeps while it walks the events: each
/// CPU's open interrupt handlers and the time of its last interrupt event,
/// its task runs and TLB flushes, and labels made once per handler kind and
/// name and per task.
#[derive(Default)]
struct Pass {
    stacks: PerCpu<Vec<(usize, i64)>>,
    prev_t: PerCpu<i64>,
    runs: PerCpu<Vec<(i64, i64, i64, usize)>>,
    tlb: PerCpu<Vec<i64>>,
    label_of: FxHashMap<(i64, i64), usize>,
    entry_label: FxHashMap<(u8, i64), usize>,
    switches: Switches,
    /// each task's latest name (index into `comms`), for runs found from switches
    comm: FxHashMap<i64, i64>,
    /// per CPU: when a task was switched out runnable to the idle task, and which
    held: PerCpu<Vec<(i64, i64)>>,
    /// per CPU: since when real-time tasks were held (the CPU ran a lower class while one waited there), and the stretches closed
    rt_open: PerCpu<i64>,
    rt: PerCpu<Vec<(i64, i64)>>,
    /// real-time tasks switched out runnable and not run since: the CPU each waits on
    rt_waiting: FxHashMap<i64, i64>,
    /// whether a task was real-time when last seen in a switch
    rt_task: FxHashMap<i64, bool>,
    /// each task's latest wake-up: a run runtime accounting says began before it began at it
    woke: FxHashMap<i64, i64>,
    /// per CPU: the latest recorded switch-in (task, time): where runtime accounting puts the start of that
    /// task's run well before it, the run began here
    switched_in: PerCpu<(i64, i64)>,
}

fn is_entry(kind: Ev) -> bool {
    matches!(kind, Ev::IrqEntry | Ev::SoftEntry | Ev::TimerEntry | Ev::CallEntry | Ev::ReschedEntry)
}

fn is_exit(kind: Ev) -> bool {
    matches!(kind, Ev::IrqExit | Ev::SoftExit | Ev::TimerExit | Ev::CallExit | Ev::ReschedExit)
}

impl Pass {
    fn event(&mut self, k: &mut Kernel, ev: &Events, i: usize, kind: Ev) {
        let (t, c) = (ev.t_ns[i], ev.cpu[i]);
        self.switches.seen(c, t, ev.pid[i]);
        if !self.rt_open.is_empty() && kind != Ev::Switch {
            self.rt_seen(ev, i, kind, c, t);
        }
        if kind == Ev::Switch {
            self.switched(ev, i, c, t);
        } else if kind == Ev::Migrate && !self.rt_waiting.is_empty() {
            // a waiting real-time task moved: it waits elsewhere now (where, the columns here do not say)
            if let Some(w) = self.rt_waiting.remove(&ev.target[i]) {
                if !self.rt_waiting.values().any(|&x| x == w) {
                    self.rt_close(w, t);
                }
            }
        }
        if is_entry(kind) || is_exit(kind) {
            self.irq_segment(k, c, t);
        }
        if is_entry(kind) {
            let l = self.entry_label(k, ev, i, kind);
            self.stacks.entry(c).push((l, t));
        } else if is_exit(kind) {
            // an exit with nothing open: a handler that began before these events
            self.stacks.entry(c).pop();
        } else if kind == Ev::Tlb && text(ev.names, ev.name[i]).is_none_or(|f| f.starts_with("flush_tlb_func")) {
            // loopscope's capture records only the TLB flush (a filter); a recording of every call names each
            self.tlb.entry(c).push(t);
        } else if kind == Ev::Runtime {
            self.runtime(k, ev, i, c, t);
        } else if kind == Ev::Wakeup {
            self.woke.insert(ev.target[i], t);
            self.switches.woke(ev.target[i], t);
        }
    }

    /// A `sched_switch`: the runs it ends and starts, and the tasks' names.
    fn switched(&mut self, ev: &Events, i: usize, c: i64, t: i64) {
        let (prev, next) = (ev.target[i], ev.next_pid[i]);
        if prev != NONE && ev.target_comm[i] != NONE {
            self.comm.insert(prev, ev.target_comm[i]);
        }
        if next != NONE && ev.next_comm[i] != NONE {
            self.comm.insert(next, ev.next_comm[i]);
        }
        self.switches.switch(c, t, prev, next);
        if next != NONE {
            self.switched_in.insert(c, (next, t));
        }
        let runnable = text(ev.states, ev.prev_state[i]).is_some_and(|x| x.starts_with('R'));
        if next == 0 && prev > 0 && runnable {
            self.held.entry(c).push((t, prev));
        }
        self.rt_switch(ev, i, c, t, runnable);
    }

    /// A CPU runs a lower class while a real-time task waits on it only
    /// when real-time time is rationed (RT throttling, the fair server's
    /// share): real-time tasks there are held from that switch until one
    /// runs again (on this CPU, or the waiting one anywhere).
    fn rt_switch(&mut self, ev: &Events, i: usize, c: i64, t: i64, runnable: bool) {
        let (prev, next, pp, np) = (ev.target[i], ev.next_pid[i], ev.prio[i], ev.next_prio[i]);
        if pp == NONE && np == NONE {
            return;
        }
        if pp != NONE {
            self.rt_task.insert(prev, is_rt(pp));
        }
        if np != NONE {
            self.rt_task.insert(next, is_rt(np));
        }
        if let Some(w) = self.rt_waiting.remove(&next) {
            if w != c && !self.rt_waiting.values().any(|&x| x == w) {
                self.rt_close(w, t);
            }
        }
        if is_rt(pp) && runnable && prev > 0 {
            self.rt_waiting.insert(prev, c);
        }
        if is_rt(np) {
            self.rt_close(c, t);
        } else if np != NONE && self.rt_waiting.values().any(|&x| x == c) {
            self.rt_open.get_or_insert_with(c, || t);
        }
    }

    fn rt_close(&mut self, c: i64, t: i64) {
        if let Some(s) = self.rt_open.remove(c) {
            self.rt.entry(c).push((s, t.min(s + MAX_HOLD_NS)));
        }
    }

    /// An event in a real-time task's context on a CPU whose real-time
    /// tasks were held: it runs, so the hold ended (at the run's start when
    /// runtime accounting says), a switch in that went unrecorded.
    fn rt_seen(&mut self, ev: &Events, i: usize, kind: Ev, c: i64, t: i64) {
        if self.rt_open.contains(c) && self.rt_task.get(&ev.pid[i]).copied().unwrap_or(false) {
            let at = if kind == Ev::Runtime && ev.runtime[i] > 0 { t - ev.runtime[i] } else { t };
            let s = *self.rt_open.get(c).expect("open");
            self.rt_close(c, at.max(s));
        }
    }

    /// Interrupt segments: from each entry or exit to the next on its CPU,
    /// labelled by the innermost open handler.
    fn irq_segment(&mut self, k: &mut Kernel, c: i64, t: i64) {
        if let (Some(stack), Some(&p)) = (self.stacks.get(c), self.prev_t.get(c)) {
            if let Some(&(lab, _)) = stack.last() {
                if t > p {
                    let cpu = k.cpus.entry(c).or_default();
                    cpu.irq_s.push(p);
                    cpu.irq_e.push(t);
                    cpu.irq_label.push(lab);
                }
            }
        }
        self.prev_t.insert(c, t);
    }

    /// A handler's label by (kind, name): made once, not per entry.
    fn entry_label(&mut self, k: &mut Kernel, ev: &Events, i: usize, kind: Ev) -> usize {
        let key = (kind as u8, if matches!(kind, Ev::IrqEntry | Ev::SoftEntry) { ev.name[i] } else { NONE });
        if let Some(&l) = self.entry_label.get(&key) {
            return l;
        }
        let lab = match kind {
            Ev::IrqEntry => text(ev.names, ev.name[i]).map(|s| format!("irq: {s}")).unwrap_or_else(|| "irq".into()),
            Ev::SoftEntry => text(ev.names, ev.name[i]).map(|s| format!("softirq: {s}")).unwrap_or_else(|| "softirq".into()),
            Ev::TimerEntry => TIMER_IRQ.into(),
            Ev::CallEntry => "IPI: function call".into(),
            _ => "IPI: reschedule".into(),
        };
        let l = k.labels.get(lab);
        self.entry_label.insert(key, l);
        l
    }

    /// A task's label by (name, thread id): made once, not per run.
    fn task(&mut self, k: &mut Kernel, comm: i64, who: i64) -> usize {
        if let Some(&l) = self.label_of.get(&(comm, who)) {
            return l;
        }
        let name = text(k.comms, comm).map(|s| s.to_string()).unwrap_or_else(|| if comm == NONE { format!("tid {who}") } else { "?".into() });
        let l = k.labels.get(task_label(&name, who, &k.ctx.roles, k.ctx.perf_is_lab));
        self.label_of.insert((comm, who), l);
        l
    }

    /// A task ran for `runtime` ns up to now on this CPU.
    fn runtime(&mut self, k: &mut Kernel, ev: &Events, i: usize, c: i64, t: i64) {
        let (who, rt) = (ev.target[i], ev.runtime[i]);
        if who == 0 || who == NONE || rt == NONE {
            return;
        }
        self.switches.runtime_seen = true;
        let lab = self.task(k, ev.target_comm[i], who);
        // the run queue's clock can be stale at a switch in from idle: the accounted run then reaches back
        // before the task's wake-up (seen here: 5-15 µs a run), where it cannot have run, and, where an
        // interrupt held the idle CPU between the wake-up and the switch (hundreds of µs under a timer
        // storm), before its recorded switch-in, where it did not run yet. (Within RUN_EARLY_NS of the
        // switch-in it is the kernel's own order, the clock read for the next task before the switch is
        // traced: kept, so that the previous task's accounted run and this one meet.)
        let mut start = match self.woke.get(&who) {
            Some(&w) if t - rt < w && w < t => w,
            _ => t - rt,
        };
        if let Some(&(p, s)) = self.switched_in.get(c) {
            if p == who && start < s - RUN_EARLY_NS && s <= t {
                start = s;
            }
        }
        self.runs.entry(c).push((start, t, who, lab));
    }

    /// Runs the runtime accounting left out, from the switches: all of
    /// them where none was recorded (`switches`); each thread of interest
    /// without runtime runs gets its runs from the switches too.
    fn fill_from_switches(&mut self, k: &mut Kernel) {
        let sw = std::mem::take(&mut self.switches);
        let (by_cpu, guesses) = sw.finish();
        for (_, p, w, seen) in guesses {
            if let Some(th) = k.threads.get_mut(&p) {
                if th.from_runtime == 0 {
                    th.guess.push((w, seen));
                }
            }
        }
        // (a window of seconds holds millions of runs: each CPU's are moved, never copied whole, and a
        // vector is grown to its exact size, not doubled)
        for (c, runs) in by_cpu {
            for &(s, e, p) in &runs {
                if let Some(th) = k.threads.get_mut(&p) {
                    if th.from_runtime == 0 {
                        th.rs.push(s);
                        th.re.push(e);
                        th.rc.push(c);
                    }
                }
            }
            let mut mine = self.runs.remove(c).unwrap_or_default();
            mine.sort_by_key(|r| r.1);
            let fill = if mine.is_empty() {
                runs
            } else {
                let covered: Vec<(i64, i64)> = mine.iter().map(|r| (r.0, r.1)).collect();
                uncovered(&runs, &covered)
            };
            mine.reserve_exact(fill.len());
            for (s, e, p) in fill {
                let comm = self.comm.get(&p).copied().unwrap_or(NONE);
                mine.push((s, e, p, self.task(k, comm, p)));
            }
            mine.sort_by_key(|r| r.1);
            self.runs.insert(c, mine);
        }
        for th in k.threads.values_mut() {
            if th.from_runtime == 0 && !th.re.windows(2).all(|w| w[0] <= w[1]) {
                let mut v: Vec<(i64, i64, i64)> = (0..th.re.len()).map(|j| (th.rs[j], th.re[j], th.rc[j])).collect();
                v.sort_by_key(|x| x.1);
                th.rs = v.iter().map(|x| x.0).collect();
                th.re = v.iter().map(|x| x.1).collect();
                th.rc = v.iter().map(|x| x.2).collect();
            }
        }
    }

    /// The runs into their CPUs; an IPI whose handler flushed the TLB (the
    /// capture records the IPI functions only when they are
    /// flush_tlb_func) becomes a TLB shootdown.
    fn finish(mut self, k: &mut Kernel) {
        self.fill_from_switches(k);
        for (c, r) in std::mem::take(&mut self.runs).into_sorted() {
            let cpu = k.cpus.entry(c).or_default();
            cpu.run_s.reserve_exact(r.len());
            cpu.run_e.reserve_exact(r.len());
            cpu.run_pid.reserve_exact(r.len());
            cpu.run_label.reserve_exact(r.len());
            for (s, e, p, l) in r {
                cpu.run_s.push(s);
                cpu.run_e.push(e);
                cpu.run_pid.push(p);
                cpu.run_label.push(l);
            }
        }
        for (c, s) in std::mem::take(&mut self.rt_open).into_sorted() {
            self.rt.entry(c).push((s, k.ctx.t_last.min(s + MAX_HOLD_NS)));
        }
        for (c, mut v) in std::mem::take(&mut self.rt).into_sorted() {
            v.sort_unstable();
            let cpu = k.cpus.entry(c).or_default();
            for (s, e) in v {
                if e > s {
                    cpu.rt_s.push(s);
                    cpu.rt_e.push(e);
                }
            }
        }
        // each held task's run starts on any CPU: a stretch ends where the task runs again, wherever that is
        let held_pids: rustc_hash::FxHashSet<i64> = self.held.values().flatten().map(|&(_, p)| p).collect();
        let mut starts: FxHashMap<i64, Vec<i64>> = FxHashMap::default();
        for cv in k.cpus.values() {
            for (j, &p) in cv.run_pid.iter().enumerate() {
                if held_pids.contains(&p) {
                    starts.entry(p).or_default().push(cv.run_s[j]);
                }
            }
        }
        for v in starts.values_mut() {
            v.sort_unstable();
        }
        for (c, marks) in std::mem::take(&mut self.held).into_sorted() {
            if let Some(cpu) = k.cpus.get_mut(&c) {
                for (m, who) in marks {
                    // to the held task's next run (its group's quota back; others may run meanwhile), at most a
                    // CFS period's longest, so that a task moved away and never back holds nothing here
                    let next = starts.get(&who).and_then(|v| v.get(lower(v, m + 1)).copied());
                    let end = next.unwrap_or(k.ctx.t_last).min(m + MAX_HOLD_NS);
                    if end > m && cpu.thr_e.last().is_none_or(|&e| e <= m) {
                        cpu.thr_s.push(m);
                        cpu.thr_e.push(end);
                    }
                }
            }
        }
        let call = k.labels.get("IPI: function call".into());
        let shoot = k.labels.get("IPI: TLB shootdown".into());
        for (c, flushes) in std::mem::take(&mut self.tlb).into_sorted() {
            if let Some(cpu) = k.cpus.get_mut(&c) {
                for f in flushes {
                    let j = upper(&cpu.irq_s, f);
                    if j > 0 && f <= cpu.irq_e[j - 1] && cpu.irq_label[j - 1] == call {
                        cpu.irq_label[j - 1] = shoot;
                    }
                }
            }
        }
    }
}

impl<'a> Kernel<'a> {
    /// One pass over the events: every CPU's runs and interrupt handlers,
    /// and the own events of the threads in `tids`.
    pub fn new(ev: &Events<'a>, ctx: &'a Context, tids: &[i64]) -> Kernel<'a> {
        let mut k = Kernel::start(ctx, ev.event_names, ev.comms, tids);
        k.feed(ev);
        k.end();
        k
    }

    /// Ready for a pass over events whose `event` column indexes
    /// `event_names` and whose task names index `comms`.
    pub fn start(ctx: &'a Context, event_names: &[String], comms: &'a [String], tids: &[i64]) -> Kernel<'a> {
        let kinds: Vec<Ev> = event_names.iter().map(|n| ev_of(n)).collect();
        let mut k = Kernel {
            ctx,
            comms,
            kinds,
            cpus: FxHashMap::default(),
            threads: FxHashMap::default(),
            labels: Labels::default(),
            comm_of: FxHashMap::default(),
            named: vec![(NONE, NONE); NAMED],
            pass: Some(Pass::default()),
        };
        for &t in tids {
            k.threads.entry(t).or_default();
        }
        k
    }

    /// The pass over the next events: a chunk later than every one fed
    /// before (its own events may come in any order: sorted here). The
    /// tables of `ev` are those `start` was given.
    pub fn feed(&mut self, ev: &Events) {
        let Some(mut pass) = self.pass.take() else { return };
        let n = ev.t_ns.len();
        if ev.t_ns.windows(2).all(|w| w[0] <= w[1]) {
            for i in 0..n {
                self.one(&mut pass, ev, i);
            }
        } else {
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by_key(|&i| ev.t_ns[i]);
            for i in order {
                self.one(&mut pass, ev, i);
            }
        }
        self.pass = Some(pass);
    }

    /// The pass's end: the runs the switches give, each CPU's picture
    /// sorted (a feed after it is ignored).
    pub fn end(&mut self) {
        if let Some(pass) = self.pass.take() {
            pass.finish(self);
        }
    }

    fn one(&mut self, pass: &mut Pass, ev: &Events, i: usize) {
        let kind = self.kind(ev, i);
        if kind != Ev::Waking && kind != Ev::Wakeup && ev.target[i] != NONE && ev.target_comm[i] != NONE {
            self.note_name(ev.target[i], ev.target_comm[i]);
        }
        if ev.next_pid[i] != NONE && ev.next_comm[i] != NONE {
            self.note_name(ev.next_pid[i], ev.next_comm[i]);
        }
        pass.event(self, ev, i, kind);
        self.thread_event(ev, i, kind);
    }

    /// `comm` is `tid`'s latest name (a wake-up's names the woken task as
    /// its waker saw it: not taken). The slot remembers the last pair noted
    /// for a task, so a repeat (every switch of a busy pair) inserts nothing.
    fn note_name(&mut self, tid: i64, comm: i64) {
        let slot = (tid as usize) & (NAMED - 1);
        if self.named[slot] != (tid, comm) {
            self.comm_of.insert(tid, comm);
            self.named[slot] = (tid, comm);
        }
    }

    fn kind(&self, ev: &Events, i: usize) -> Ev {
        let e = ev.event[i];
        if e < 0 {
            Ev::Other
        } else {
            self.kinds.get(e as usize).copied().unwrap_or(Ev::Other)
        }
    }

    fn thread_event(&mut self, ev: &Events, i: usize, kind: Ev) {
        if matches!(
            kind,
            Ev::Other
                | Ev::IrqEntry
                | Ev::IrqExit
                | Ev::SoftEntry
                | Ev::SoftExit
                | Ev::TimerEntry
                | Ev::TimerExit
                | Ev::CallEntry
                | Ev::CallExit
                | Ev::ReschedEntry
                | Ev::ReschedExit
                | Ev::Tlb
        ) {
            return;
        }
        let t = ev.t_ns[i];
        let (target, cur) = (ev.target[i], ev.pid[i]);
        match kind {
            Ev::Runtime if ev.runtime[i] != NONE => {
                if let Some(th) = self.threads.get_mut(&target) {
                    // Runtime accounting can carry the tail of the thread's
                    // last run (after its last update, before it slept) into
                    // this one: a thread that slept and was woken since ran
                    // from its wake-up at the earliest.
                    let mut start = t - ev.runtime[i];
                    if let (Some(&w), Some(&slept)) = (th.wake.last(), th.so_t.last()) {
                        if slept < w && start < w && w < t {
                            start = w;
                        }
                    }
                    // nor (by more than RUN_EARLY_NS) before its recorded switch-in on this CPU, when it has not
                    // been switched out since: the accounting's clock can be read at the wake-up, stale by what
                    // held the CPU since
                    if let (Some(&si), Some(&sc)) = (th.sw_t.last(), th.sw_c.last()) {
                        if sc == ev.cpu[i] && start < si - RUN_EARLY_NS && si <= t && th.so_t.last().is_none_or(|&so| so <= si) {
                            start = si;
                        }
                    }
                    th.rs.push(start);
                    th.re.push(t);
                    th.rc.push(ev.cpu[i]);
                    th.from_runtime += 1;
                }
            }
            Ev::Switch => {
                if let Some(th) = self.threads.get_mut(&target) {
                    if ev.prio[i] != NONE {
                        th.rt = is_rt(ev.prio[i]);
                    }
                    th.so_t.push(t);
                    th.so_state.push(text(ev.states, ev.prev_state[i]).and_then(|s| s.bytes().next()).unwrap_or(0));
                }
                if let Some(th) = self.threads.get_mut(&ev.next_pid[i]) {
                    if ev.next_prio[i] != NONE {
                        th.rt = is_rt(ev.next_prio[i]);
                    }
                    th.sw_t.push(t);
                    th.sw_c.push(ev.cpu[i]);
                }
            }
            Ev::Wakeup => {
                if let Some(th) = self.threads.get_mut(&target) {
                    if ev.prio[i] != NONE {
                        th.rt = is_rt(ev.prio[i]);
                    }
                    th.wake.push(t);
                }
            }
            Ev::Waking => {
                if let Some(th) = self.threads.get_mut(&target) {
                    th.wk_t.push(t);
                    th.wk_by.push(cur);
                    th.wk_cpu.push(ev.cpu[i]);
                }
            }
            Ev::Migrate => {
                if let Some(th) = self.threads.get_mut(&target) {
                    th.migr.push(t);
                }
            }
            Ev::PageFault => {
                if let Some(th) = self.threads.get_mut(&cur) {
                    th.pf.push(t);
                }
            }
            Ev::HrStart if ev.expires[i] != NONE => {
                if let Some(th) = self.threads.get_mut(&cur) {
                    th.hs_t.push(t);
                    th.hs_exp.push(ev.expires[i]);
                    th.hs_soft.push(ev.softexpires[i]);
                }
            }
            _ => {}
        }
    }

    /// How attribution names the task `tid` (its comm from the events that name it).
    fn name_of(&mut self, tid: i64) -> String {
        let comm = self.comm_of.get(&tid).and_then(|&c| text(self.comms, c)).map(|s| s.to_string()).unwrap_or_else(|| format!("tid {tid}"));
        task_label(&comm, tid, &self.ctx.roles, self.ctx.perf_is_lab)
    }

    fn lost_in(&self, a: i64, b: i64) -> Option<String> {
        let ctx = self.ctx;
        if ctx.lost == 0 {
            return None;
        }
        let Some(at) = &ctx.lost_at else {
            return Some(format!("{} kernel events lost at unknown times", ctx.lost));
        };
        let hit: Vec<&(i64, i64, i64, i64)> = at.iter().filter(|w| w.1 < b && w.2 >= a).collect();
        if hit.is_empty() {
            return None;
        }
        let mut cpus: Vec<i64> = hit.iter().map(|w| w.0).collect();
        cpus.sort();
        cpus.dedup();
        let list: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
        Some(format!("{} kernel events lost inside the window (CPU {})", hit.iter().map(|w| w.3).sum::<i64>(), list.join(", ")))
    }

    fn info(&self, id: i64, a: i64, b: i64) -> Split {
        let lost = self.lost_in(a, b);
        let mut s = Split { id, complete: lost.is_none(), missing: lost, ..Default::default() };
        if b > a && (a < self.ctx.t_first || b > self.ctx.t_last) {
            s.complete = false;
            and(&mut s.missing, "the window is not inside the capture");
        }
        s
    }

    /// What CPU `cpu` did over [u, v) while thread `tid` waited.
    fn activity(&self, cpu: Option<i64>, u: i64, v: i64, tid: i64, wt: Wait, out: &mut Acc) {
        if v <= u {
            return;
        }
        let Some(cv) = cpu.and_then(|c| self.cpus.get(&c)) else {
            out.add("unexplained", v - u);
            return;
        };
        if self.rt_held(cpu, cv, u, v, tid, wt, out) {
            return;
        }
        let Wait { woke, slack, fault, late } = wt;
        let irqs = overlaps(&cv.irq_s, &cv.irq_e, u, v);
        let mut covered: Vec<(i64, i64)> = Vec::with_capacity(irqs.len() + 8);
        for &(j, a, b) in &irqs {
            out.add(&self.labels.list[cv.irq_label[j]], b - a);
            covered.push((a, b));
        }
        // interrupt segments are disjoint and sorted: how much of [x, y) they cover, from a running sum
        let ia: Vec<i64> = irqs.iter().map(|x| x.1).collect();
        let ib: Vec<i64> = irqs.iter().map(|x| x.2).collect();
        let mut cum = vec![0i64; ia.len() + 1];
        for k in 0..ia.len() {
            cum[k + 1] = cum[k] + ib[k] - ia[k];
        }
        let irq_before = |t: i64| -> i64 {
            let k = upper(&ib, t);
            cum[k] + if k < ia.len() { (t - ia[k]).max(0) } else { 0 }
        };
        let mut prev_end = u;
        for (j, a, b) in overlaps(&cv.run_s, &cv.run_e, u, v) {
            if cv.run_pid[j] == tid {
                continue;
            }
            let a2 = a.max(prev_end); // runs on one CPU do not overlap; where accounting says so, count once
            let busy = |x: i64, y: i64| if y > x { (y - x) - (irq_before(y) - irq_before(x)) } else { 0 };
            let d = busy(a2, b);
            // before the interrupt that woke the thread came, the task ran but did not hold the wake-up: the
            // interrupt was late (in the slack of the thread's timer, the kernel's choice)
            let late_d = late.map_or(0, |e| busy(a2, b.min(e)));
            let slack_d = match (late, slack) {
                (Some(e), Some((s0, s1))) => busy(a2.max(s0), b.min(e).min(s1)),
                _ => 0,
            };
            for (label, ns) in [(self.labels.list[cv.run_label[j]].as_str(), d - late_d), ("timer slack", slack_d), (LATE_IRQ, late_d - slack_d)] {
                if ns > 0 {
                    out.add(label, ns);
                }
            }
            covered.push((a, b));
            prev_end = prev_end.max(b);
        }
        covered.sort();
        let mut gaps: Vec<(i64, i64)> = Vec::new();
        let mut t = u;
        for (x, y) in covered {
            if x > t {
                gaps.push((t, x.min(v)));
            }
            t = t.max(y);
        }
        if t < v {
            gaps.push((t, v));
        }
        let cut = match woke {
            None => v,
            Some(w) => w.max(u).min(v),
        };
        if let Some((s0, s1)) = slack {
            let (lo, hi) = (s0.max(u), s1.min(cut));
            let held: i64 = gaps.iter().map(|&(ga, gb)| (gb.min(hi) - ga.max(lo)).max(0)).sum();
            if held > 0 {
                out.add("timer slack", held);
                gaps = gaps.iter().flat_map(|&(ga, gb)| [(ga, gb.min(lo)), (ga.max(hi), gb)]).filter(|g| g.1 > g.0).collect();
            }
        }
        if let Some(f) = fault {
            if u <= f && f < v {
                let held: i64 = gaps.iter().map(|&(ga, gb)| (gb - ga.max(f)).max(0)).sum();
                if held > 0 {
                    out.add("page faults", held);
                    gaps = gaps.iter().map(|&(ga, gb)| (ga, gb.min(f))).filter(|g| g.1 > g.0).collect();
                }
            }
        }
        gaps = self.storm(cv, &irqs, gaps, cut, out);
        gaps = self.throttled(cv, gaps, cut, tid, out);
        let before: i64 = gaps.iter().map(|&(ga, gb)| (gb.min(cut) - ga).max(0)).sum();
        let after: i64 = gaps.iter().map(|&(ga, gb)| (gb - ga.max(cut)).max(0)).sum();
        if before > 0 {
            out.add("CPU idle", before);
        }
        if after > 0 {
            out.add("scheduling latency", after);
        }
    }

    /// A real-time thread woken on a CPU where real-time tasks were held
    /// (`rt_s`/`rt_e`) waited for the held stretch to end whoever ran
    /// meanwhile: `throttled: RT`. The rest of [u, v) is split as usual.
    /// Whether it was (false: nothing held the thread, nothing added).
    fn rt_held(&self, cpu: Option<i64>, cv: &Cpu, u: i64, v: i64, tid: i64, wt: Wait, out: &mut Acc) -> bool {
        if cv.rt_s.is_empty() || !self.threads.get(&tid).is_some_and(|th| th.rt) {
            return false;
        }
        let lo = wt.woke.map_or(u, |w| w.max(u));
        let held = overlaps(&cv.rt_s, &cv.rt_e, lo, v);
        if held.is_empty() {
            return false;
        }
        let mut t = u;
        for (_, a, b) in held {
            let a = a.max(t);
            if a > t {
                self.activity(cpu, t, a, tid, wt, out);
            }
            if b > a {
                out.add("throttled: RT", b - a);
            }
            t = t.max(b);
        }
        if t < v {
            self.activity(cpu, t, v, tid, wt, out);
        }
        true
    }

    /// Idle before the wake-up (`cut`) between two interrupts of one kind
    /// less than STORM_GAP_NS apart is theirs: a CPU interrupted that often
    /// leaves and re-enters its idle state (and, in a VM, exits to the
    /// hypervisor) for each, and its own timer interrupt comes late
    /// meanwhile (seen here: a 1 ms timer held up to a whole tick under an
    /// IPI every 28 µs). The gaps left are returned.
    fn storm(&self, cv: &Cpu, irqs: &[(usize, i64, i64)], gaps: Vec<(i64, i64)>, cut: i64, out: &mut Acc) -> Vec<(i64, i64)> {
        if irqs.len() < 2 {
            return gaps;
        }
        let mut left = Vec::with_capacity(gaps.len());
        for (ga, gb) in gaps {
            let end = gb.min(cut);
            // the interrupt that ends where the gap starts, and the next one
            let k = irqs.partition_point(|x| x.2 < ga);
            let stormy = end - ga > 0
                && end - ga < STORM_GAP_NS
                && k + 1 < irqs.len()
                && irqs[k].2 == ga
                && irqs[k + 1].1 == gb
                && cv.irq_label[irqs[k].0] == cv.irq_label[irqs[k + 1].0];
            if stormy {
                out.add(&self.labels.list[cv.irq_label[irqs[k].0]], end - ga);
                if gb > end {
                    left.push((end, gb));
                }
            } else {
                left.push((ga, gb));
            }
        }
        left
    }

    /// Idle after the wake-up (`cut`) inside a stretch the CPU idled from a
    /// task's switch-out while runnable: the thread was runnable and the
    /// CPU free, which CFS allows only when the thread's group (or one
    /// above it) is out of its CPU limit: `throttled: <group>` (the group's
    /// path when the run knows it). The gaps left are returned.
    fn throttled(&self, cv: &Cpu, gaps: Vec<(i64, i64)>, cut: i64, tid: i64, out: &mut Acc) -> Vec<(i64, i64)> {
        if cv.thr_s.is_empty() {
            return gaps;
        }
        let mut held = 0;
        let mut left = Vec::with_capacity(gaps.len());
        for (ga, gb) in gaps {
            let lo = ga.max(cut);
            if gb <= lo {
                left.push((ga, gb));
                continue;
            }
            if ga < lo {
                left.push((ga, lo));
            }
            let mut t = lo;
            for (_, x, y) in overlaps(&cv.thr_s, &cv.thr_e, lo, gb) {
                if x > t {
                    left.push((t, x));
                }
                held += y - x.max(t);
                t = t.max(y);
            }
            if t < gb {
                left.push((t, gb));
            }
        }
        if held > 0 {
            match self.ctx.groups.get(&tid) {
                Some(g) => out.add(&format!("throttled: {g}"), held),
                None => out.add("throttled: CPU limit", held),
            }
        }
        left
    }

    /// Whether at `t` the thread was in an uninterruptible sleep it entered
    /// within FAULT_BEFORE_NS of one of its page faults, and had not run
    /// since: waiting for the page (a swap-in, a file read).
    fn in_fault_sleep(th: &Thread, t: i64) -> bool {
        let i = upper(&th.so_t, t);
        if i == 0 || th.so_state[i - 1] != b'D' {
            return false;
        }
        let slept = th.so_t[i - 1];
        let j = upper(&th.rs, slept);
        let ran_since = j < th.rs.len() && th.rs[j] < t;
        !ran_since && count_in(&th.pf, slept - FAULT_BEFORE_NS, slept) > 0
    }

    /// [soft, hard) of the timer the thread armed for the deadline `a`, when it had slack.
    fn slack(th: &Thread, a: i64) -> Option<(i64, i64)> {
        let j = upper(&th.hs_t, a);
        if j == 0 {
            return None;
        }
        let (soft, hard) = (th.hs_soft[j - 1], th.hs_exp[j - 1]);
        if (soft - a).abs() > SLACK_MATCH_NS || hard <= soft {
            return None;
        }
        Some((soft, hard))
    }

    /// When the timer interrupt that woke thread `th` at `w` on `cpu` began,
    /// if it slept on a timer for `a` (armed for `a`, or woken inside a
    /// timer interrupt there): the start of the interrupt handlers the
    /// wake-up ran in, back to back, when no timer interrupt came there
    /// between `a` and them (one would have expired the thread's timer: it
    /// slept on something else); `w` itself when the capture recorded no
    /// timer interrupts and `w` is at most LATE_EXPIRY_NS past the timer's
    /// hard expiry. None: woken otherwise (by another task, in an interrupt
    /// of another kind while timer interrupts were recorded, too late).
    fn late_until(&self, cpu: Option<i64>, th: &Thread, a: i64, w: i64) -> Option<i64> {
        let cv = self.cpus.get(&cpu?)?;
        let j = upper(&th.hs_t, a);
        let armed = (j > 0 && ((th.hs_soft[j - 1] - a).abs() <= SLACK_MATCH_NS || (th.hs_exp[j - 1] - a).abs() <= SLACK_MATCH_NS)).then(|| th.hs_exp[j - 1]);
        let timer = self.labels.map.get(TIMER_IRQ).copied();
        let k = upper(&cv.irq_s, w);
        if k > 0 && cv.irq_e[k - 1] > w {
            let mut i = k - 1;
            while i > 0 && cv.irq_e[i - 1] == cv.irq_s[i] {
                i -= 1;
            }
            let in_timer = timer.is_some_and(|l| cv.irq_label[i..k].contains(&l));
            let first = lower(&cv.irq_s, a + 1);
            let timer_between = timer.is_some_and(|l| cv.irq_label[first.min(i)..i].contains(&l));
            return ((armed.is_some() || in_timer) && !timer_between).then_some(cv.irq_s[i]);
        }
        match (armed, timer) {
            (Some(hard), None) if w <= hard.max(a) + LATE_EXPIRY_NS => Some(w),
            _ => None,
        }
    }

    /// For a sleep from `t` to its wake-up `w`: the soft and hard expiry of
    /// the timer armed as it went to sleep, when the wake-up came after its
    /// soft expiry and at most LATE_EXPIRY_NS after its hard one (later, the
    /// sleep ended for another reason).
    fn slept_on_slack(th: &Thread, t: i64, w: i64) -> Option<(i64, i64)> {
        let j = upper(&th.hs_t, t + JOIN_NS);
        if j == 0 || th.hs_t[j - 1] < t - 1_000_000 {
            return None;
        }
        let (soft, hard) = (th.hs_soft[j - 1], th.hs_exp[j - 1]);
        if hard <= soft || !(t <= soft && soft < w && w <= hard + LATE_EXPIRY_NS) {
            return None;
        }
        Some((soft, hard))
    }

    /// `blocked: <task>` and when, when another task woke the thread out of
    /// the sleep that began at `t` (before its next run at `x`); when that
    /// task itself spent most of the wait preempted on its CPU by one other
    /// task, the chain: `blocked: <task> ← preempted by <other>` (a priority
    /// inversion when the blocked thread outranks the one that ran).
    fn blocked_by(&mut self, tid: i64, t: i64, x: i64) -> Option<(String, i64)> {
        let th = self.threads.get(&tid)?;
        let i = lower(&th.wk_t, t);
        if i >= th.wk_t.len() || th.wk_t[i] > x {
            return None;
        }
        let (by, at, cpu) = (th.wk_by[i], th.wk_t[i], th.wk_cpu[i]);
        if by == 0 || by == tid || by == NONE {
            return None;
        }
        let name = self.name_of(by);
        let who = name.strip_prefix("thread: ").unwrap_or(&name).to_string();
        match self.preempted(by, cpu, t, at) {
            Some(other) => Some((format!("blocked: {who} \u{2190} preempted by {other}"), at)),
            None => Some((format!("blocked: {who}"), at)),
        }
    }

    /// The one task that ran on `cpu` for at least half of [t, at) while
    /// task `by` (which ran there at `at`) did not: what held `by` up.
    fn preempted(&self, by: i64, cpu: i64, t: i64, at: i64) -> Option<String> {
        let cv = self.cpus.get(&cpu)?;
        if at - t < CHAIN_MIN_NS {
            return None;
        }
        let mut by_label: FxHashMap<usize, i64> = FxHashMap::default();
        for (j, a, b) in overlaps(&cv.run_s, &cv.run_e, t, at) {
            if cv.run_pid[j] != by {
                *by_label.entry(cv.run_label[j]).or_default() += b - a;
            }
        }
        let (&lab, &ns) = by_label.iter().max_by_key(|e| *e.1)?;
        (2 * ns >= at - t).then(|| self.labels.list[lab].clone())
    }

    /// Split the wake-up window [a, b) of thread `tid`.
    pub fn attribute(&mut self, w: &Window) -> Split {
        let (tid, a, b) = (w.tid, w.a, w.b);
        let mut s = self.info(w.id, a, b);
        let mut out = Acc::default();
        if b <= a {
            s.causes = out.0;
            return s;
        }
        let th = self.threads.get(&tid).expect("threads of every window are built");
        let (mut s_in, mut cpu) = switch_in(th, a, b);
        if let Some(seen) = s_in.and_then(|x| guessed(th, x)) {
            // the switches placed the switch-in at the wake-up: where it came up to the first event showing the
            // thread run, nothing says (the interrupts and the idle exit there were not recorded either)
            s.complete = false;
            and(&mut s.missing, "the thread's switch-in was not recorded (it came between its wake-up and its first recorded event)");
            s_in = Some(seen.min(b));
        }
        let s_in = match s_in {
            Some(x) => x,
            None => {
                // (a CPU that records no switch out of its idle task, and nothing else in the thread's
                // context: a recording of the switches and wake-ups alone) the window's end is the
                // program's own; the thread waited on the CPU it last ran on (a pinned thread surely)
                s.complete = false;
                and(&mut s.missing, "the thread's switch-in was not recorded (the CPU it last ran on is assumed, to the window's end)");
                let j = lower(&th.re, a);
                cpu = if j > 0 { Some(th.rc[j - 1]) } else { th.rc.get(j).copied() };
                b
            }
        }
        .min(b)
        .max(a);
        s.cpu = cpu;
        s.rule = Some(self.rule(cpu, a, tid));
        let wi = lower(&th.wake, a);
        let woke = if wi < th.wake.len() && th.wake[wi] <= s_in { Some(th.wake[wi]) } else { None };
        s.migrations = count_in(&th.migr, a, b);
        s.page_faults = count_in(&th.pf, a, b);
        // a fault in the window is the thread's own, so after its wake-up
        // (recorded or not); a thread still waiting at `a` for a page it
        // faulted on before the window waits on that fault from `a`
        let fi = lower(&th.pf, a);
        let fault = if Self::in_fault_sleep(th, a) {
            Some(a)
        } else if fi < th.pf.len() && th.pf[fi] < s_in {
            Some(th.pf[fi])
        } else {
            None
        };
        let slack = Self::slack(th, a);
        let wt = Wait { woke, slack, fault, late: None };
        match woke {
            // the part before the wake-up (the timer's expiry to its wake-up) and the part after, each with its causes
            Some(w) if w > a => {
                let mut pre = Acc::default();
                let late = self.late_until(cpu, th, a, w.min(s_in));
                self.activity(cpu, a, w.min(s_in), tid, Wait { late, ..wt }, &mut pre);
                // a fault taken before the wake-up is still waited on after it
                let fault_after = fault.map(|f| f.max(w.min(s_in)));
                self.activity(cpu, w.min(s_in), s_in, tid, Wait { fault: fault_after, ..wt }, &mut out);
                s.before = Some(pre.0.clone());
                for (k, ns) in pre.0 {
                    out.add(&k, ns);
                }
            }
            Some(_) => {
                s.before = Some(Vec::new());
                self.activity(cpu, a, s_in, tid, wt, &mut out);
            }
            None => self.activity(cpu, a, s_in, tid, wt, &mut out),
        }
        if b > s_in {
            let mut ret = Acc::default();
            self.activity(cpu, s_in, b, tid, Wait::woken(None), &mut ret);
            // on its own CPU after the switch-in, idle means the thread itself was running
            let own = ret.take("CPU idle") + ret.take("scheduling latency");
            for (k, ns) in ret.0 {
                out.add(&k, ns);
            }
            if own > 0 {
                out.add("return to user space", own);
            }
        }
        s.causes = out.0;
        s
    }

    /// Split [a, b), any stretch of thread `tid`'s time: its runs (less the
    /// interrupts inside them) are `running`, and each stretch between them
    /// is what kept it off the CPU (`gap`).
    pub fn attribute_span(&mut self, w: &Window) -> Split {
        let (tid, a, b) = (w.tid, w.a, w.b);
        let mut s = self.info(w.id, a, b);
        let mut out = Acc::default();
        if b <= a {
            s.causes = out.0;
            return s;
        }
        let th = self.threads.get(&tid).expect("threads of every window are built");
        let segs = run_segments(th, a, b);
        let last_cpu = match segs.last() {
            Some(seg) => seg.2,
            None => {
                s.complete = false;
                // (a recording of the switches and wake-ups alone, on a CPU that records no switch out of its
                // idle task) what kept the thread off the CPU is still said, on the CPU it last ran on
                let j = lower(&th.re, a);
                let Some(c) = (if j > 0 { Some(th.rc[j - 1]) } else { th.rc.get(j).copied() }) else {
                    and(&mut s.missing, "no run of the thread was recorded in the window");
                    s.causes = vec![("unexplained".into(), b - a)];
                    return s;
                };
                and(&mut s.missing, "no run of the thread was recorded in the window (the CPU it last ran on is assumed)");
                c
            }
        };
        s.cpu = Some(last_cpu);
        s.rule = Some(self.rule(Some(segs.first().map_or(last_cpu, |seg| seg.2)), a, tid));
        let n_segs = segs.len();
        let mut all = segs;
        all.push((b, b, last_cpu));
        let mut t = a;
        for (n, &(x, y, c)) in all.iter().enumerate() {
            if x > t {
                self.gap(tid, a, t, x, c, n < n_segs, &mut out);
            }
            if y > x {
                self.running(c, x, y, &mut out);
            }
            t = t.max(y);
        }
        let th = self.threads.get(&tid).expect("built");
        s.migrations = count_in(&th.migr, a, b);
        s.page_faults = count_in(&th.pf, a, b);
        s.causes = out.0;
        s
    }

    /// rtla's rule for a window that began at `t` on `cpu`: whoever ran
    /// there then; the CPU idle: `CPU idle`; the thread itself: the task
    /// that ran there last before it.
    fn rule(&self, cpu: Option<i64>, t: i64, tid: i64) -> String {
        let Some(cv) = cpu.and_then(|c| self.cpus.get(&c)) else {
            return "CPU idle".into();
        };
        let mut j = upper(&cv.run_e, t);
        // runs are sorted by end: step back over any that still cover t
        while j > 0 && cv.run_e[j - 1] > t {
            j -= 1;
        }
        let covering = (j..cv.run_s.len()).take_while(|&k| cv.run_s[k] <= t).find(|&k| cv.run_e[k] > t);
        match covering {
            Some(k) if cv.run_pid[k] != tid => self.labels.list[cv.run_label[k]].clone(),
            Some(_) => (0..j).rev().find(|&k| cv.run_pid[k] != tid).map_or("CPU idle".into(), |k| self.labels.list[cv.run_label[k]].clone()),
            None => "CPU idle".into(),
        }
    }

    /// [x, y) the thread ran on CPU `c`: `running`, less the interrupts.
    fn running(&self, c: i64, x: i64, y: i64, out: &mut Acc) {
        let mut irq_ns = 0;
        if let Some(cv) = self.cpus.get(&c) {
            for (jj, aa, bb) in overlaps(&cv.irq_s, &cv.irq_e, x, y) {
                out.add(&self.labels.list[cv.irq_label[jj]], bb - aa);
                irq_ns += bb - aa;
            }
        }
        out.add("running", (y - x) - irq_ns);
    }

    /// [t, x) the thread did not run (it ran next on CPU `c`; `more`: a run
    /// of it follows inside the window): runnable, what ran instead; asleep,
    /// what it waited for (another task that woke it, a page, its timer's
    /// slack), then the wake-up's own delay.
    #[allow(clippy::too_many_arguments)]
    fn gap(&mut self, tid: i64, a: i64, t: i64, x: i64, c: i64, more: bool, out: &mut Acc) {
        let th = self.threads.get(&tid).expect("built");
        // the thread ran until `t`: only a switch-out where that run ended can have put it to sleep
        let i = lower(&th.so_t, a.max(t - 50_000) - JOIN_NS);
        let state: String = if i < th.so_t.len() && th.so_t[i] <= x {
            match th.so_state[i] {
                0 => String::new(),
                b => char::from(b).to_string(),
            }
        } else {
            "R".into()
        };
        let wi = lower(&th.wake, t);
        let wk = if wi < th.wake.len() && th.wake[wi] <= x { Some(th.wake[wi]) } else { None };
        let faulted = count_in(&th.pf, t - FAULT_BEFORE_NS, t + JOIN_NS) > 0;
        if state == "R" || state == "W" {
            self.activity(Some(c), t, x, tid, Wait::woken(Some(t)), out);
        } else if state.is_empty() {
            self.activity(Some(c), t, x, tid, Wait::woken(wk), out);
        } else {
            self.asleep(tid, t, x, c, &state, wk, faulted, more, out);
        }
    }

    /// The thread slept in `state` from `t` (`wk`: its recorded wake-up).
    #[allow(clippy::too_many_arguments)]
    fn asleep(&mut self, tid: i64, t: i64, x: i64, c: i64, state: &str, woken: Option<i64>, faulted: bool, more: bool, out: &mut Acc) {
        let by = self.blocked_by(tid, t, x);
        let th = self.threads.get(&tid).expect("built");
        let mut label = match &by {
            Some((l, _)) => l.clone(),
            None => blocked_label(state),
        };
        if state == "D" && by.is_none() && faulted {
            label = "page faults".into(); // it blocked in the fault: waiting for the page
        }
        let mut wk = woken;
        if let Some((_, at)) = &by {
            if wk.is_none_or(|w| *at < w) {
                // blocked until the other task woke it; from there to the wake-up taking effect, the wake-up's own delay
                wk = Some(*at);
            }
        }
        let Some(w) = wk else {
            if more {
                label.push_str(" (wake-up not recorded)");
            }
            out.add(&label, x - t);
            return;
        };
        match if by.is_none() { Self::slept_on_slack(th, t, w) } else { None } {
            Some((soft, hard)) => {
                // asleep to its deadline, held by the slack to the hard
                // expiry; a wake-up later than that came late (idle exit)
                out.add(&label, soft - t);
                out.add("timer slack", w.min(hard) - soft);
                if w > hard {
                    out.add("CPU idle", w - hard);
                }
            }
            None => out.add(&label, w - t),
        }
        let effect = match woken {
            Some(x0) if x0 >= w => x0,
            _ => w,
        };
        self.activity(Some(c), w, x, tid, Wait::woken(Some(effect)), out);
    }
}

/// The thread's switch-in that ran it at `b` and its CPU, when found: from
/// its runs (the one that contains `b`, chained back to where it began), else
/// from its recorded switch-ins in [a, b].
fn switch_in(th: &Thread, a: i64, b: i64) -> (Option<i64>, Option<i64>) {
    let i = lower(&th.re, b);
    if i < th.re.len() && th.rs[i] <= b {
        let c = th.rc[i];
        let mut i = i;
        let mut sin = th.rs[i];
        while i > 0 && th.rc[i - 1] == c && (th.re[i - 1] - sin).abs() < JOIN_NS && sin > a {
            i -= 1;
            sin = th.rs[i];
        }
        return (Some(sin), Some(c));
    }
    let (j0, j1) = (lower(&th.sw_t, a), upper(&th.sw_t, b));
    // a recorded switch-in the thread left again before b (held by a CPU limit on its way to user
    // space, preempted) is not the one that ran it at b: that one was not recorded
    if j1 > j0 && upper(&th.so_t, th.sw_t[j1 - 1]) == upper(&th.so_t, b) {
        return (Some(th.sw_t[j1 - 1]), Some(th.sw_c[j1 - 1]));
    }
    (None, None)
}

/// Where a run of the thread that begins at `x` is first seen running, when
/// the switches placed its start at its wake-up (None: `x` was recorded).
fn guessed(th: &Thread, x: i64) -> Option<i64> {
    let k = th.guess.partition_point(|g| g.0 < x);
    th.guess.get(k).filter(|g| g.0 == x).map(|g| g.1)
}

/// The thread's runs inside [a, b), clipped to it, per CPU; runs on one CPU
/// less than JOIN_NS apart are joined.
fn run_segments(th: &Thread, a: i64, b: i64) -> Vec<(i64, i64, i64)> {
    let mut segs: Vec<(i64, i64, i64)> = Vec::new();
    let mut j = upper(&th.re, a);
    while j < th.rs.len() && th.rs[j] < b {
        // a run placed at the wake-up is known to have begun by its first recorded event, or by the span's
        // start where it began before it (the program logged a while running)
        let start = match guessed(th, th.rs[j]) {
            Some(seen) if th.rs[j] > a => seen.min(b),
            _ => th.rs[j],
        };
        let (x, y, c) = (start.max(a), th.re[j].min(b), th.rc[j]);
        if y > x {
            match segs.last_mut() {
                Some(last) if last.2 == c && x - last.1 < JOIN_NS => last.1 = last.1.max(y),
                _ => segs.push((x, y, c)),
            }
        }
        j += 1;
    }
    segs
}

fn and(missing: &mut Option<String>, why: &str) {
    *missing = Some(match missing.take() {
        Some(m) => format!("{m}; {why}"),
        None => why.to_string(),
    });
}

/// (index, start, end) of segments overlapping [u, v), clipped to it.
/// Segments are sorted by end; starts almost so: step back over stragglers.
fn overlaps(s: &[i64], e: &[i64], u: i64, v: i64) -> Vec<(usize, i64, i64)> {
    let mut out = Vec::new();
    let mut i = upper(e, u);
    while i > 0 && e[i - 1] > u {
        i -= 1;
    }
    for j in i..s.len() {
        if s[j] >= v {
            break;
        }
        let (a, b) = (s[j].max(u), e[j].min(v));
        if b > a {
            out.push((j, a, b));
        }
    }
    out
}

/// Every window of a cluster split into causes; what no cause explains of a
/// window is `unexplained`, so each window's causes add up to its length.
pub fn attribute_many<'a>(ev: &Events<'a>, ctx: &'a Context, windows: &[Window]) -> Vec<Split> {
    Kernel::new(ev, ctx, &tids_of(windows)).split_all(windows)
}

/// The threads of `windows`, each once (what `Kernel::start` takes).
pub fn tids_of(windows: &[Window]) -> Vec<i64> {
    let mut tids: Vec<i64> = windows.iter().map(|w| w.tid).collect();
    tids.sort();
    tids.dedup();
    tids
}

/// One CPU's picture as the windows are split by it, in time order: the
/// task runs (start, end, thread, its label as a cause) and the interrupt
/// segments (start, end, the innermost open handler's label).
pub struct Picture {
    pub cpu: i64,
    pub runs: Vec<(i64, i64, i64, String)>,
    pub irqs: Vec<(i64, i64, String)>,
}

impl Kernel<'_> {
    /// Every CPU's picture, by CPU (the pass ended first if it has not):
    /// what a timeline draws, the runs' starts clamped and the runs the
    /// switches fill in as attribution reads them. Where runtime accounting
    /// has two runs overlap (the next task's clock read before the switch
    /// is traced), the run that ends later starts where the other ended, as
    /// `activity` counts such a stretch once (runs are in the order they
    /// end); a run left with nothing is left out. So a CPU's task track
    /// never shows two tasks at once.
    pub fn pictures(&mut self) -> Vec<Picture> {
        self.end();
        let l = &self.labels.list;
        let mut out: Vec<Picture> = self
            .cpus
            .iter()
            .map(|(&cpu, c)| {
                let mut runs = Vec::with_capacity(c.run_s.len());
                let mut prev_end = i64::MIN;
                for j in 0..c.run_s.len() {
                    let s = c.run_s[j].max(prev_end);
                    if c.run_e[j] > s {
                        runs.push((s, c.run_e[j], c.run_pid[j], l[c.run_label[j]].clone()));
                    }
                    prev_end = prev_end.max(c.run_e[j]);
                }
                Picture { cpu, runs, irqs: (0..c.irq_s.len()).map(|j| (c.irq_s[j], c.irq_e[j], l[c.irq_label[j]].clone())).collect() }
            })
            .collect();
        out.sort_by_key(|p| p.cpu);
        out
    }
}

impl Kernel<'_> {
    /// Every window split (the pass ended first if it has not).
    pub fn split_all(&mut self, windows: &[Window]) -> Vec<Split> {
        self.end();
        let k = self;
        windows
            .iter()
            .map(|w| {
                let mut s = if w.span { k.attribute_span(w) } else { k.attribute(w) };
                let total = w.b - w.a;
                if s.causes.is_empty() {
                    s.causes.push(("unexplained".into(), total));
                }
                let left = total - s.causes.iter().map(|c| c.1).sum::<i64>();
                if left > 0 {
                    match s.causes.iter_mut().find(|c| c.0 == "unexplained") {
                        Some(c) => c.1 += left,
                        None => s.causes.push(("unexplained".into(), left)),
                    }
                }
                s
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn another_task_running_before_the_switch_in_is_named_and_the_rest_is_return_to_user_space() {
        // task 7 (hog) runs 0..900 on CPU 1; thread 42 was woken at 100, runs 900..1000
        let names = table(&["sched_stat_runtime", "sched_wakeup"]);
        let comms = table(&["hog", "t"]);
        let empty: Vec<String> = vec![];
        let n = NONE;
        let ev = Events {
            t_ns: &[100, 900, 1000],
            cpu: &[1, 1, 1],
            event: &[1, 0, 0],
            pid: &[7, 7, 42],
            target: &[42, 7, 42],
            target_comm: &[1, 0, 1],
            next_pid: &[n, n, n],
            next_comm: &[n, n, n],
            prev_state: &[n, n, n],
            name: &[n, n, n],
            runtime: &[n, 900, 100],
            expires: &[n, n, n],
            softexpires: &[n, n, n],
            prio: &[n, n, n],
            next_prio: &[n, n, n],
            event_names: &names,
            comms: &comms,
            states: &empty,
            names: &empty,
        };
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 2000, groups: HashMap::new() };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 50, b: 950, span: false }]);
        assert_eq!(out[0].causes, vec![("thread: hog".to_string(), 850), ("return to user space".to_string(), 50)]);
        assert!(out[0].complete);
    }

    #[test]
    fn runs_runtime_accounting_overlaps_are_drawn_one_after_the_other() {
        // hog (7) accounted 0..900 and spin (8) 800..1500 on CPU 1 (8's clock read 100 before 7's last update);
        // bit (9) accounted 1000..1200, inside 8's span: runs are taken in the order they end, each from where the
        // one before ended, as attribution counts them
        let n = NONE;
        // t, cpu, event, context pid, target, target comm, next pid, next comm, prev state
        let rows = [[900, 1, 0, 7, 7, 0, n, n, n], [1200, 1, 0, 9, 9, 2, n, n, n], [1500, 1, 0, 8, 8, 1, n, n, n]];
        let ev = Events { runtime: &[900, 200, 700], ..events(&rows, &["sched_stat_runtime"], &["hog", "spin", "bit"], &[]) };
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 2000, groups: HashMap::new() };
        let mut k = Kernel::new(&ev, &ctx, &[]);
        let p = k.pictures();
        let runs: Vec<(i64, i64, i64)> = p[0].runs.iter().map(|r| (r.0, r.1, r.2)).collect();
        assert_eq!(runs, vec![(0, 900, 7), (1000, 1200, 9), (1200, 1500, 8)]);
        assert!(p[0].runs.windows(2).all(|w| w[0].1 <= w[1].0));
    }

    /// Thread 42 sleeps at 50 µs and is woken at 100 onto idle CPU 1; a timer interrupt holds the CPU
    /// 200..600 µs; 42 is switched in at `switch_in` µs, and its runtime event at 620 says it ran from
    /// `from` µs (the run queue's clock read at the wake-up when stale). The window is 100..620 µs.
    fn switched_in_late(switch_in: i64, from: i64) -> Vec<(String, i64)> {
        let (n, us) = (NONE, 1000);
        let rows = [
            // t, cpu, event, context pid, target, target comm, next pid, next comm, prev state
            [50 * us, 1, 0, 42, 42, 0, 0, 1, 1],
            [100 * us, 1, 1, 0, 42, 0, n, n, n],
            [200 * us, 1, 3, 0, n, n, n, n, n],
            [600 * us, 1, 4, 0, n, n, n, n, n],
            [switch_in * us, 1, 0, 0, 0, 1, 42, 0, 0],
            [620 * us, 1, 2, 42, 42, 0, n, n, n],
        ];
        let names = ["sched_switch", "sched_wakeup", "sched_stat_runtime", "local_timer_entry", "local_timer_exit"];
        let ev =
            Events { runtime: Box::leak(vec![n, n, n, n, n, (620 - from) * us].into_boxed_slice()), ..events(&rows, &names, &["t", "swapper/1"], &["R", "S"]) };
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 1000 * us, groups: HashMap::new() };
        attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 100 * us, b: 620 * us, span: false }]).remove(0).causes
    }

    fn causes_us(v: &[(&str, i64)]) -> Vec<(String, i64)> {
        v.iter().map(|&(k, x)| (k.to_string(), x * 1000)).collect()
    }

    #[test]
    fn a_run_runtime_accounting_starts_at_the_wake_up_starts_at_the_recorded_switch_in() {
        // the idle CPU's 100 µs before the interrupt and its 10 after are its exit from idle to the woken thread
        let want = [("timer interrupt", 400), ("scheduling latency", 110), ("return to user space", 10)];
        assert_eq!(switched_in_late(610, 100), causes_us(&want));
    }

    #[test]
    fn a_run_accounted_from_moments_before_its_recorded_switch_in_keeps_its_start() {
        // the kernel reads the clock for the next task's run, then traces the switch: 5 µs apart here
        let want = [("timer interrupt", 400), ("scheduling latency", 105), ("return to user space", 15)];
        assert_eq!(switched_in_late(610, 605), causes_us(&want));
    }

    /// Thread 42 armed a timer for 100 at 10 (CPU 1); hog (7) runs 0..900 there; the timer interrupt comes
    /// at 400 (when `irqs`) and wakes 42 at 403; 42 runs 900..1000. With `tick`, a timer interrupt at
    /// 200..205 wakes nobody.
    fn late_timer(irqs: bool, tick: bool) -> Vec<(String, i64)> {
        let names = table(&["sched_stat_runtime", "sched_wakeup", "hrtimer_start", "local_timer_entry", "local_timer_exit"]);
        let comms = table(&["hog", "t"]);
        let empty: Vec<String> = vec![];
        let n = NONE;
        let mut rows: Vec<[i64; 6]> = vec![
            // t, event, pid, target, runtime, expires
            [10, 2, 42, n, n, 100],
            [400, 3, 7, n, n, n],
            [403, 1, 7, 42, n, n],
            [410, 4, 7, n, n, n],
            [900, 0, 7, 7, 900, n],
            [1000, 0, 42, 42, 100, n],
        ];
        if tick {
            rows.splice(1..1, [[200, 3, 7, n, n, n], [205, 4, 7, n, n, n]]);
        }
        if !irqs {
            rows.retain(|r| r[1] != 3 && r[1] != 4);
        }
        let col = |k: usize| rows.iter().map(|r| r[k]).collect::<Vec<i64>>();
        let (t, event, pid, target, runtime, expires) = (col(0), col(1), col(2), col(3), col(4), col(5));
        let comm: Vec<i64> = target
            .iter()
            .map(|&x| {
                if x == 7 {
                    0
                } else if x == 42 {
                    1
                } else {
                    n
                }
            })
            .collect();
        let none = vec![n; rows.len()];
        let ev = Events {
            t_ns: &t,
            cpu: &vec![1; rows.len()],
            event: &event,
            pid: &pid,
            target: &target,
            target_comm: &comm,
            next_pid: &none,
            next_comm: &none,
            prev_state: &none,
            name: &none,
            runtime: &runtime,
            expires: &expires,
            softexpires: &expires,
            prio: &none,
            next_prio: &none,
            event_names: &names,
            comms: &comms,
            states: &empty,
            names: &empty,
        };
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 2000, groups: HashMap::new() };
        let mut c = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 100, b: 1000, span: false }]).remove(0).causes;
        c.sort();
        c
    }

    #[test]
    fn a_task_running_while_the_timer_interrupt_came_late_is_not_named_for_that_part() {
        // before the interrupt's entry (100..400) the hog ran but could not hold the wake-up; after it, it held the CPU
        let want = [("return to user space", 100), ("thread: hog", 490), ("timer interrupt", 10), (LATE_IRQ, 300)];
        assert_eq!(late_timer(true, false), want.iter().map(|&(k, v)| (k.to_string(), v)).collect::<Vec<_>>());
    }

    #[test]
    fn a_timer_interrupt_that_came_between_and_woke_nobody_says_the_thread_slept_on_something_else() {
        // it would have expired a timer armed for 100: the hog's run before the wake-up is the hog's again
        let want = [("return to user space", 100), ("thread: hog", 785), ("timer interrupt", 15)];
        assert_eq!(late_timer(true, true), want.iter().map(|&(k, v)| (k.to_string(), v)).collect::<Vec<_>>());
    }

    #[test]
    fn without_interrupt_events_the_timer_is_late_up_to_the_wake_up() {
        let want = [("return to user space", 100), ("thread: hog", 497), (LATE_IRQ, 303)];
        assert_eq!(late_timer(false, false), want.iter().map(|&(k, v)| (k.to_string(), v)).collect::<Vec<_>>());
    }

    #[test]
    fn without_runtime_events_who_ran_comes_from_the_switches() {
        // no sched_stat_runtime: hog (7) is on CPU 1 from its first event; thread 42 is woken at 100, switched in at 900
        let names = table(&["sched_switch", "sched_wakeup", "sched_migrate_task"]);
        let comms = table(&["hog", "t"]);
        let states = table(&["R"]);
        let n = NONE;
        let ev = Events {
            t_ns: &[100, 900, 1000],
            cpu: &[1, 1, 1],
            event: &[1, 0, 2],
            pid: &[7, 7, 42],
            target: &[42, 7, n],
            target_comm: &[1, 0, n],
            next_pid: &[n, 42, n],
            next_comm: &[n, 1, n],
            prev_state: &[n, 0, n],
            name: &[n, n, n],
            runtime: &[n, n, n],
            expires: &[n, n, n],
            softexpires: &[n, n, n],
            prio: &[n, n, n],
            next_prio: &[n, n, n],
            event_names: &names,
            comms: &comms,
            states: &states,
            names: &[],
        };
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 2000, groups: HashMap::new() };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 100, b: 950, span: false }]);
        assert_eq!(out[0].causes, vec![("thread: hog".to_string(), 800), ("return to user space".to_string(), 50)]);
    }

    /// Switches on CPU 1: the spinner (7, FIFO 10: prio 89) is switched out runnable to a
    /// lower-class task at 300 (`cfs`: 120, 9) and real-time thread 42 (prio 19) is woken at 400,
    /// switched in at 6000; `to_rt` is whether what 7 gave way to was real-time.
    fn rt_events(names: &[String], comms: &[String], states: &[String], to_rt: bool) -> Events<'static> {
        let n = NONE;
        let leak = |v: Vec<i64>| -> &'static [i64] { Box::leak(v.into_boxed_slice()) };
        let (nm, cm, st): (&'static [String], &'static [String], &'static [String]) =
            (Box::leak(names.to_vec().into_boxed_slice()), Box::leak(comms.to_vec().into_boxed_slice()), Box::leak(states.to_vec().into_boxed_slice()));
        Events {
            t_ns: leak(vec![100, 300, 400, 6000, 6500]),
            cpu: leak(vec![1, 1, 1, 1, 1]),
            event: leak(vec![0, 0, 1, 0, 0]),
            pid: leak(vec![42, 7, 9, 9, 42]),
            target: leak(vec![42, 7, 42, 9, 42]),
            target_comm: leak(vec![1, 0, 1, 2, 1]),
            next_pid: leak(vec![7, 9, n, 42, 7]),
            next_comm: leak(vec![0, 2, n, 1, 0]),
            prev_state: leak(vec![1, 0, n, 0, 1]),
            name: leak(vec![n; 5]),
            runtime: leak(vec![n; 5]),
            expires: leak(vec![n; 5]),
            softexpires: leak(vec![n; 5]),
            prio: leak(vec![19, 89, 19, 120, 19]),
            next_prio: leak(vec![89, if to_rt { 50 } else { 120 }, n, 19, 89]),
            event_names: nm,
            comms: cm,
            states: st,
            names: &[],
        }
    }

    #[test]
    fn a_real_time_thread_held_after_a_real_time_task_gave_way_to_a_lower_class_is_throttled_rt() {
        let ev = rt_events(&table(&["sched_switch", "sched_wakeup"]), &table(&["spin", "t", "cfs"]), &table(&["R", "S"]), false);
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 10_000, groups: HashMap::new() };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 400, b: 6000, span: false }]);
        assert_eq!(out[0].causes, vec![("throttled: RT".to_string(), 5600)]);
    }

    #[test]
    fn a_cpu_idling_while_a_preempted_real_time_task_waits_holds_the_next_real_time_thread() {
        // what RT throttling looks like on a CPU that never records its switch out of idle: the spinner (7)
        // is preempted by thread 42 at 100; 42 sleeps at 200 and the CPU idles though 7 is runnable;
        // 42 is woken at 1000 and its runtime event at 9000 says it ran from 8900
        let names = table(&["sched_switch", "sched_wakeup", "sched_stat_runtime"]);
        let comms = table(&["spin", "t", "swapper/1"]);
        let states = table(&["R", "S"]);
        let n = NONE;
        let ev = Events {
            t_ns: &[100, 200, 1000, 9000, 9010],
            cpu: &[1, 1, 1, 1, 1],
            event: &[0, 0, 1, 2, 0],
            pid: &[7, 42, 0, 42, 42],
            target: &[7, 42, 42, 42, 42],
            target_comm: &[0, 1, 1, 1, 1],
            next_pid: &[42, 0, n, n, 7],
            next_comm: &[1, 2, n, n, 0],
            prev_state: &[0, 1, n, n, 1],
            name: &[n; 5],
            runtime: &[n, n, n, 100, n],
            expires: &[n; 5],
            softexpires: &[n; 5],
            prio: &[89, 19, 19, n, 19],
            next_prio: &[19, 120, n, n, 89],
            event_names: &names,
            comms: &comms,
            states: &states,
            names: &[],
        };
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 10_000, groups: HashMap::new() };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 1000, b: 8900, span: false }]);
        assert_eq!(out[0].causes, vec![("throttled: RT".to_string(), 7900)]);
    }

    #[test]
    fn a_real_time_task_preempted_by_a_higher_one_holds_nothing() {
        let ev = rt_events(&table(&["sched_switch", "sched_wakeup"]), &table(&["spin", "t", "cfs"]), &table(&["R", "S"]), true);
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 10_000, groups: HashMap::new() };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 400, b: 6000, span: false }]);
        assert!(out[0].causes.iter().all(|c| c.0 != "throttled: RT"), "{:?}", out[0].causes);
        assert_eq!(out[0].causes[0].0, "thread: cfs");
    }

    #[test]
    fn a_runnable_thread_on_a_cpu_idled_by_its_groups_limit_is_throttled() {
        // 9 (the group's busy sibling) is switched out runnable to idle at 300: the group is out of its limit;
        // thread 42, woken at 400, waits with the CPU idle until the quota comes back (9000)
        let names = table(&["sched_switch", "sched_wakeup"]);
        let comms = table(&["busy", "t", "swapper/1"]);
        let states = table(&["R", "S"]);
        let n = NONE;
        let ev = Events {
            t_ns: &[100, 300, 400, 9000, 9500],
            cpu: &[1, 1, 1, 1, 1],
            event: &[0, 0, 1, 0, 0],
            pid: &[42, 9, 0, 0, 42],
            target: &[42, 9, 42, 0, 42],
            target_comm: &[1, 0, 1, 2, 1],
            next_pid: &[9, 0, n, 42, 9],
            next_comm: &[0, 2, n, 1, 0],
            prev_state: &[1, 0, n, 0, 1],
            name: &[n, n, n, n, n],
            runtime: &[n, n, n, n, n],
            expires: &[n, n, n, n, n],
            softexpires: &[n, n, n, n, n],
            prio: &[n, n, n, n, n],
            next_prio: &[n, n, n, n, n],
            event_names: &names,
            comms: &comms,
            states: &states,
            names: &[],
        };
        let groups = HashMap::from([(42, "/loop".to_string())]);
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 10_000, groups };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 400, b: 9000, span: false }]);
        assert_eq!(out[0].causes, vec![("throttled: /loop".to_string(), 8600)]);
    }

    /// A test's events from rows of (t, cpu, event, context pid, target, target comm, next pid,
    /// next comm, prev state), indexes into `names`, `comms` and `states`; no runtimes, no priorities.
    fn events(rows: &[[i64; 9]], names: &[&str], comms: &[&str], states: &[&str]) -> Events<'static> {
        let col = |k: usize| -> &'static [i64] { Box::leak(rows.iter().map(|r| r[k]).collect::<Vec<_>>().into_boxed_slice()) };
        let none: &'static [i64] = Box::leak(vec![NONE; rows.len()].into_boxed_slice());
        let strings = |v: &[&str]| -> &'static [String] { Box::leak(table(v).into_boxed_slice()) };
        Events {
            t_ns: col(0),
            cpu: col(1),
            event: col(2),
            pid: col(3),
            target: col(4),
            target_comm: col(5),
            next_pid: col(6),
            next_comm: col(7),
            prev_state: col(8),
            name: none,
            runtime: none,
            expires: none,
            softexpires: none,
            prio: none,
            next_prio: none,
            event_names: strings(names),
            comms: strings(comms),
            states: strings(states),
            names: &[],
        }
    }

    #[test]
    fn a_thread_held_after_its_recorded_switch_in_waits_to_its_unrecorded_one() {
        // switches and wake-ups alone, and CPU 1 records no switch out of idle: thread 42, woken at 400, is
        // switched in at 500 and out runnable to idle at 520 (its group's limit holds it on its way to user
        // space); the switch that runs it again, when the quota comes back, went unrecorded (9000)
        let n = NONE;
        let ev = events(
            &[
                [100, 1, 0, 42, 42, 1, 9, 0, 1],
                [400, 1, 1, 9, 42, 1, n, n, n],
                [500, 1, 0, 9, 9, 0, 42, 1, 0],
                [520, 1, 0, 42, 42, 1, 0, 2, 0],
                [9500, 1, 0, 42, 42, 1, 9, 0, 1],
            ],
            &["sched_switch", "sched_wakeup"],
            &["busy", "t", "swapper/1"],
            &["R", "S"],
        );
        let groups = HashMap::from([(42, "/loop".to_string())]);
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 10_000, groups };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 400, b: 9050, span: false }]);
        let ns = |k: &str| out[0].causes.iter().find(|c| c.0 == k).map_or(0, |c| c.1);
        assert_eq!((ns("throttled: /loop"), ns("thread: busy"), ns("return to user space")), (9050 - 520, 100, 0), "{:?}", out[0].causes);
        assert!(!out[0].complete);
    }

    #[test]
    fn a_switch_in_placed_at_the_wake_up_leaves_the_wait_before_the_first_event_to_what_was_not_recorded() {
        // CPU 1 idles from 100; thread 42 is woken at 400 and runs (the switch out of idle unrecorded), its
        // program logs at 600, and it is first seen running at its switch-out (900)
        let n = NONE;
        let ev = events(
            &[[100, 1, 0, 42, 42, 0, 0, 1, 0], [400, 1, 1, 0, 42, 0, n, n, n], [900, 1, 0, 42, 42, 0, 0, 1, 0]],
            &["sched_switch", "sched_wakeup"],
            &["t", "swapper/1"],
            &["S"],
        );
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 1000, groups: HashMap::new() };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 400, b: 600, span: false }]);
        // after the wake-up, with nothing recorded on the CPU: scheduling latency (hedged where interrupts were not recorded)
        assert_eq!(out[0].causes, vec![("scheduling latency".to_string(), 200)]);
        assert!(!out[0].complete);
    }

    #[test]
    fn a_span_the_program_began_inside_a_run_placed_at_the_wake_up_is_running() {
        // CPU 1 idles from 100; thread 42 is woken at 400 and runs unrecorded until its switch-out at 900; its
        // program logged a span 450..800 (it was running at 450)
        let n = NONE;
        let ev = events(
            &[[100, 1, 0, 42, 42, 0, 0, 1, 0], [400, 1, 1, 0, 42, 0, n, n, n], [900, 1, 0, 42, 42, 0, 0, 1, 0]],
            &["sched_switch", "sched_wakeup"],
            &["t", "swapper/1"],
            &["S"],
        );
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 1000, groups: HashMap::new() };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 450, b: 800, span: true }]);
        assert_eq!(out[0].causes, vec![("running".to_string(), 350)]);
    }

    #[test]
    fn a_span_whose_runs_were_not_recorded_still_names_who_woke_the_thread() {
        // thread 42 blocks on CPU 1 at 100 (span from 90), holder 9 on CPU 0 wakes it at 300; its run on CPU 1
        // from there was not recorded (no switch out of idle), its program ends the span at 350
        let n = NONE;
        let ev = events(
            &[
                [50, 0, 0, 0, 0, 2, 9, 1, 0],
                [100, 1, 0, 42, 42, 0, 0, 2, 0],
                [299, 0, 2, 9, 42, 0, n, n, n],
                [300, 0, 1, 9, 42, 0, n, n, n],
                [900, 1, 0, 42, 42, 0, 0, 2, 0],
                [950, 0, 0, 9, 9, 1, 0, 2, 0],
            ],
            &["sched_switch", "sched_wakeup", "sched_waking"],
            &["t", "holder", "swapper"],
            &["S"],
        );
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 1000, groups: HashMap::new() };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 90, b: 350, span: true }]);
        let ns = |k: &str| out[0].causes.iter().find(|c| c.0 == k).map_or(0, |c| c.1);
        // blocked until the holder's waking (299), then the wake-up's own delay to the span's end
        assert_eq!((ns("blocked: holder"), ns("scheduling latency"), ns("unexplained")), (199, 50, 0), "{:?}", out[0].causes);
    }

    #[test]
    fn a_task_switched_out_runnable_that_runs_again_on_another_cpu_holds_nothing_after() {
        // 9 is switched out runnable to idle on CPU 1 at 300 and runs on CPU 0 from 400 (moved, not throttled);
        // thread 42, woken on CPU 1 at 5000, waits with CPU 1 idle until 5100: scheduling latency, not a throttle
        let names = table(&["sched_switch", "sched_wakeup"]);
        let comms = table(&["busy", "t", "swapper/1"]);
        let states = table(&["R", "S"]);
        let n = NONE;
        let ev = Events {
            t_ns: &[100, 300, 400, 5000, 5100, 5600],
            cpu: &[1, 1, 0, 1, 1, 1],
            event: &[0, 0, 0, 1, 0, 0],
            pid: &[42, 9, 0, 0, 0, 42],
            target: &[42, 9, 0, 42, 0, 42],
            target_comm: &[1, 0, 2, 1, 2, 1],
            next_pid: &[9, 0, 9, n, 42, 0],
            next_comm: &[0, 2, 0, n, 1, 2],
            prev_state: &[1, 0, 0, n, 0, 1],
            name: &[n; 6],
            runtime: &[n; 6],
            expires: &[n; 6],
            softexpires: &[n; 6],
            prio: &[n; 6],
            next_prio: &[n; 6],
            event_names: &names,
            comms: &comms,
            states: &states,
            names: &[],
        };
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 10_000, groups: HashMap::new() };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 5000, b: 5100, span: false }]);
        assert_eq!(out[0].causes, vec![("scheduling latency".to_string(), 100)]);
    }

    #[test]
    fn a_blocked_thread_whose_waker_was_preempted_names_the_chain() {
        // 42 runs on CPU 1 until it blocks at 1000; the lock's holder 8 is preempted on CPU 0 by hog 7
        // from 1000 to 900_000, runs, and wakes 42 at 950_000; 42 runs again at 960_000
        let names = table(&["sched_switch", "sched_waking", "sched_wakeup"]);
        let comms = table(&["hog", "t", "holder"]);
        let states = table(&["R", "S"]);
        let n = NONE;
        let ev = Events {
            t_ns: &[500, 1000, 1000, 900_000, 950_000, 950_001, 960_000, 990_000],
            cpu: &[1, 1, 0, 0, 0, 1, 1, 1],
            event: &[0, 0, 0, 0, 1, 2, 0, 0],
            pid: &[0, 42, 8, 7, 8, 0, 0, 42],
            target: &[0, 42, 8, 7, 42, 42, 0, 42],
            target_comm: &[n, 1, 2, 0, 1, 1, n, 1],
            next_pid: &[42, 0, 7, 8, n, n, 42, 0],
            next_comm: &[1, n, 0, 2, n, n, 1, n],
            prev_state: &[0, 1, 0, 0, n, n, 0, 1],
            name: &[n; 8],
            runtime: &[n; 8],
            expires: &[n; 8],
            softexpires: &[n; 8],
            prio: &[n; 8],
            next_prio: &[n; 8],
            event_names: &names,
            comms: &comms,
            states: &states,
            names: &[],
        };
        let ctx = Context { roles: HashMap::new(), perf_is_lab: false, lost: 0, lost_at: None, t_first: 0, t_last: 1_000_000, groups: HashMap::new() };
        let out = attribute_many(&ev, &ctx, &[Window { id: 1, tid: 42, a: 500, b: 990_000, span: true }]);
        let top = out[0].causes.iter().max_by_key(|c| c.1).unwrap();
        assert_eq!(top.0, "blocked: holder \u{2190} preempted by thread: hog");
    }

    #[test]
    fn the_lab_and_the_loads_are_named_by_their_own_names() {
        let roles = HashMap::from([(5, "load: hog".to_string())]);
        assert_eq!(task_label("stress-ng", 5, &roles, false), "load: hog");
        assert_eq!(task_label("ls-kcapture", 9, &roles, false), "lab: capture");
        assert_eq!(task_label("perf", 9, &roles, true), "lab: capture");
        assert_eq!(task_label("perf", 9, &roles, false), "thread: perf");
        assert_eq!(task_label("loopscope-wr", 9, &roles, false), "lab: writer");
        assert_eq!(task_label("ld:io", 9, &roles, false), "load: io");
    }
}
