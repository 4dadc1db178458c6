//! Where the activations pass puts what it closes: every activation as a
//! row (`Out`, columns by thread then activation), or folded (`Summary`).

use super::Summary;

/// One activation's figures (`NULL` for none), as `Out` holds them.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub tid: i64,
    pub act: i64,
    pub woken: i64,
    pub on: i64,
    pub off: i64,
    pub wakeup_latency: i64,
    pub timer_expires: i64,
    pub timer_lateness: i64,
    pub runtime: i64,
    pub preemptions: i64,
    pub migrations: i64,
    pub period: i64,
    pub on_bound: i64,
    pub complete: bool,
}

/// Where closed activations go: rows kept, or folded (`summary`).
// one per pass, never in a collection: its size does not matter
#[allow(clippy::large_enum_variant)]
pub enum Sink {
    Rows(Out),
    Summary(Summary),
}

impl Sink {
    pub(super) fn push(&mut self, r: Row) {
        match self {
            Sink::Rows(o) => o.push(r),
            Sink::Summary(s) => s.add(r),
        }
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

impl Out {
    pub(super) fn push(&mut self, r: Row) {
        self.tid.push(r.tid);
        self.act.push(r.act);
        self.woken.push(r.woken);
        self.on.push(r.on);
        self.off.push(r.off);
        self.wakeup_latency.push(r.wakeup_latency);
        self.timer_expires.push(r.timer_expires);
        self.timer_lateness.push(r.timer_lateness);
        self.runtime.push(r.runtime);
        self.preemptions.push(r.preemptions);
        self.migrations.push(r.migrations);
        self.period.push(r.period);
        self.on_bound.push(r.on_bound);
        self.complete.push(r.complete);
    }

    /// The rows by (thread, activation), a column at a time (memory: the
    /// rows, one column more and the order).
    pub(super) fn sorted(mut self) -> Out {
        let n = self.tid.len();
        if (1..n).all(|i| (self.tid[i - 1], self.act[i - 1]) <= (self.tid[i], self.act[i])) {
            return self;
        }
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by_key(|&i| (self.tid[i as usize], self.act[i as usize]));
        fn pick<T: Copy>(v: &mut Vec<T>, order: &[u32]) {
            let new: Vec<T> = order.iter().map(|&i| v[i as usize]).collect();
            *v = new;
        }
        for v in [
            &mut self.tid,
            &mut self.act,
            &mut self.woken,
            &mut self.on,
            &mut self.off,
            &mut self.wakeup_latency,
            &mut self.timer_expires,
            &mut self.timer_lateness,
            &mut self.runtime,
            &mut self.preemptions,
            &mut self.migrations,
            &mut self.period,
            &mut self.on_bound,
        ] {
            pick(v, &order);
        }
        pick(&mut self.complete, &order);
        self
    }
}
