//! Pages of one capture into the columns attribution reads.
//!
//! Only what attribution needs is kept: the time, the CPU, the event, the
//! task that was current, and per event a few fields (who switched out and
//! in and in what state, who was woken or migrated and where, how long a task
//! ran, which interrupt or soft interrupt, which device). Task names and
//! labels are interned: the columns hold indices into one string table.
//!
//! Losses are placed. A page whose header says events were dropped before it
//! becomes a window on its CPU from the last event that CPU delivered (in
//! this batch or an earlier one: the decoder keeps that per CPU) to the
//! page's first event, with the kernel's count when it stored one. A damaged
//! page is a window of unknown count from the last good event to the next
//! page's first one.

use crate::format::{Format, Loc, PageLayout};
use crate::intern::Interner;
use crate::page::{self, Missed};

/// A column that holds a number, or -1 where the event has no such field.
pub const NONE: i64 = -1;

/// The columns a field can fill, in the order of `Decoder::record`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Target = 0,
    TargetComm,
    NextPid,
    NextComm,
    PrevState,
    Irq,
    Name,
    DestCpu,
    Runtime,
    Expires,
    SoftExpires,
    /// A function pointer, named through the recording's kallsyms (into `Name`; none without them).
    Func,
    /// The kernel's priority of the target task (0-99 real-time, 100-139 the others; sched_switch's prev_prio)
    Prio,
    /// sched_switch's next_prio
    NextPrio,
}

/// Per event: which of its fields fill which column.
fn plan(name: &str) -> &'static [(&'static str, Col)] {
    use Col::*;
    match name {
        "sched_switch" => &[
            ("prev_pid", Target),
            ("prev_comm", TargetComm),
            ("prev_state", PrevState),
            ("next_pid", NextPid),
            ("next_comm", NextComm),
            ("prev_prio", Prio),
            ("next_prio", NextPrio),
        ],
        "sched_wakeup" | "sched_waking" | "sched_wakeup_new" => &[("pid", Target), ("comm", TargetComm), ("target_cpu", DestCpu), ("prio", Prio)],
        "sched_migrate_task" => &[("pid", Target), ("comm", TargetComm), ("dest_cpu", DestCpu)],
        "sched_stat_runtime" => &[("pid", Target), ("comm", TargetComm), ("runtime", Runtime)],
        "irq_handler_entry" => &[("irq", Irq), ("name", Name)],
        "irq_handler_exit" => &[("irq", Irq)],
        "softirq_entry" | "softirq_exit" | "softirq_raise" => &[("vec", Name)],
        "netif_receive_skb" => &[("name", Name)],
        "napi_poll" => &[("dev_name", Name)],
        "hrtimer_start" => &[("expires", Expires), ("softexpires", SoftExpires), ("function", Func)],
        // the function a cross-CPU call ran (named where the recording has the kernel's symbols)
        "csd_function_entry" => &[("func", Func)],
        // the timer base's clock when it fired (CLOCK_MONOTONIC for most timers): places expiries on a capture of another clock
        "hrtimer_expire_entry" => &[("now", Expires)],
        // a task moved into a cgroup: which (its path in hierarchy `dst_root`), so a CPU limit's group is named
        "cgroup_attach_task" => &[("pid", Target), ("comm", TargetComm), ("dst_path", Name), ("dst_root", Irq)],
        _ => &[],
    }
}

/// How to read one field into one column (copied per record, so no allocation).
#[derive(Clone, Copy)]
struct Ext {
    offset: usize,
    size: usize,
    signed: bool,
    loc: Loc,
    is_string: bool,
    col: Col,
}

struct Known {
    event: u16,
    fields: Vec<Ext>,
    /// The print format's symbols, interned: (value, string index).
    symbols: Vec<(u64, i64)>,
}

/// Columns of decoded events (one entry per event in each vector).
#[derive(Debug, Default)]
pub struct Columns {
    pub t_ns: Vec<i64>,
    pub cpu: Vec<i32>,
    pub event: Vec<i32>,
    pub pid: Vec<i32>,
    pub target: Vec<i32>,
    pub target_comm: Vec<i32>,
    pub next_pid: Vec<i32>,
    pub next_comm: Vec<i32>,
    pub prev_state: Vec<i32>,
    pub irq: Vec<i32>,
    pub name: Vec<i32>,
    pub dest_cpu: Vec<i32>,
    pub runtime: Vec<i64>,
    /// hrtimer_start: the hard expiry and the soft one (the slack is between them).
    pub expires: Vec<i64>,
    pub softexpires: Vec<i64>,
    /// sched_switch: the tasks' kernel priorities (prev, next); the wake-ups: the woken task's
    pub prio: Vec<i32>,
    pub next_prio: Vec<i32>,
}

/// Batches' columns handed back once written (`Columns::recycle`), for the
/// next batch to fill: their vectors keep their room, so a batch is not
/// grown again from nothing (each growth a copy, and fresh pages the kernel
/// faults in and zeroes: half the import's page faults were the decoder's
/// pushes). At most `SPARES` are kept; `Columns::drop_spares` frees them.
static SPARE: std::sync::Mutex<Vec<Columns>> = std::sync::Mutex::new(Vec::new());
const SPARES: usize = 2;

impl Columns {
    /// Columns to fill: spare ones, empty but with their room, when some were handed back.
    pub fn spare() -> Columns {
        SPARE.lock().ok().and_then(|mut s| s.pop()).unwrap_or_default()
    }

    /// Hand `self` back, emptied, for a later batch (dropped when `SPARES` are kept already).
    pub fn recycle(mut self) {
        self.each(Vec::clear, Vec::clear);
        if let Ok(mut s) = SPARE.lock() {
            if s.len() < SPARES {
                s.push(self);
            }
        }
    }

    /// Free the spare columns (a writer that recycled them is done).
    pub fn drop_spares() {
        if let Ok(mut s) = SPARE.lock() {
            s.clear();
        }
    }

    /// `f` on each INT64 column, `g` on each INT32 one.
    fn each(&mut self, f: impl Fn(&mut Vec<i64>), g: impl Fn(&mut Vec<i32>)) {
        for v in [&mut self.t_ns, &mut self.runtime, &mut self.expires, &mut self.softexpires] {
            f(v);
        }
        for v in [
            &mut self.cpu,
            &mut self.event,
            &mut self.pid,
            &mut self.target,
            &mut self.target_comm,
            &mut self.next_pid,
            &mut self.next_comm,
            &mut self.prev_state,
            &mut self.irq,
            &mut self.name,
            &mut self.dest_cpu,
            &mut self.prio,
            &mut self.next_prio,
        ] {
            g(v);
        }
    }

    fn reserve(&mut self, n: usize) {
        self.each(|v| v.reserve(n), |v| v.reserve(n));
    }
}

/// Loss windows: on `cpu`, between `start_ns` and `end_ns`, `events` dropped
/// (-1: the kernel did not say how many).
#[derive(Debug, Default)]
pub struct Losses {
    pub cpu: Vec<i32>,
    pub start_ns: Vec<i64>,
    pub end_ns: Vec<i64>,
    pub events: Vec<i64>,
    pub why: Vec<String>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub pages: u64,
    pub records: u64,
    pub kept: u64,
    pub unknown_type: u64,
    pub damaged_pages: u64,
}

pub struct Decoder {
    layout: PageLayout,
    /// By event id.
    known: Vec<Option<Known>>,
    /// Event names, indexed by `Columns::event`.
    pub events: Vec<String>,
    strings: Interner,
    /// Per CPU: the time of the last event delivered, and whether the page
    /// before was damaged (the next page's first event ends its window).
    last: rustc_hash::FxHashMap<i32, (i64, bool)>,
    pub cols: Columns,
    pub lost: Losses,
    pub counts: Counts,
    /// Function addresses → interned names (a recording's kallsyms; empty for a live capture).
    /// Interned when a record first names the function (NONE until then):
    /// a kallsyms holds some 120 k code symbols, a trace uses a few hundred,
    /// and the string table travels with the capture (its index, every
    /// table derived from it).
    ksyms: rustc_hash::FxHashMap<u64, (i64, Box<str>)>,
}

impl Decoder {
    pub fn new(layout: PageLayout, formats: Vec<Format>) -> Self {
        let mut d = Decoder {
            layout,
            known: Vec::new(),
            events: Vec::new(),
            strings: Interner::default(),
            last: Default::default(),
            cols: Columns::default(),
            lost: Losses::default(),
            counts: Counts::default(),
            ksyms: Default::default(),
        };
        d.strings.get(b"R");
        for f in formats {
            let fields = plan(&f.name)
                .iter()
                .filter_map(|(n, c)| f.field(n).map(|x| Ext { offset: x.offset, size: x.size, signed: x.signed, loc: x.loc, is_string: x.is_string, col: *c }))
                .collect();
            let symbols = f.symbols.iter().map(|(v, n)| (*v, d.strings.get(n.as_bytes()))).collect();
            let event = d.events.len() as u16;
            d.events.push(f.name.clone());
            let id = f.id as usize;
            if d.known.len() <= id {
                d.known.resize_with(id + 1, || None);
            }
            d.known[id] = Some(Known { event, fields, symbols });
        }
        d
    }

    /// The last event time delivered per CPU (carried into the next batch).
    pub fn last_times(&self) -> Vec<(i32, i64)> {
        let mut v: Vec<(i32, i64)> = self.last.iter().map(|(c, (t, _))| (*c, *t)).collect();
        v.sort();
        v
    }

    pub fn set_last_time(&mut self, cpu: i32, t_ns: i64) {
        self.last.insert(cpu, (t_ns, false));
    }

    /// The string table the text columns index.
    pub fn strings(&self) -> &[String] {
        &self.strings.list
    }

    fn lose(&mut self, cpu: i32, end: i64, events: i64, why: &str) {
        let start = self.last.get(&cpu).map(|x| x.0).filter(|&t| t != NONE).unwrap_or(end).min(end);
        self.lost.cpu.push(cpu);
        self.lost.start_ns.push(start);
        self.lost.end_ns.push(end);
        self.lost.events.push(events);
        self.lost.why.push(why.to_string());
    }

    /// Name function pointers (a timer's `function`) from a /proc/kallsyms text:
    /// its code symbols only.
    pub fn set_kallsyms(&mut self, text: &str) {
        for l in text.lines() {
            let mut it = l.split_ascii_whitespace();
            let (Some(a), Some(t), Some(n)) = (it.next(), it.next(), it.next()) else { continue };
            if !matches!(t, "t" | "T") {
                continue;
            }
            if let Ok(addr) = u64::from_str_radix(a, 16) {
                self.ksyms.entry(addr).or_insert_with(|| (NONE, n.into()));
            }
        }
    }

    /// Room for `n` more events (a reader that knows its batch size asks once).
    pub fn reserve(&mut self, n: usize) {
        if self.cols.t_ns.capacity() == 0 {
            // a new batch: into spare columns, if a written one was handed back meanwhile
            self.cols = Columns::spare();
        }
        self.cols.reserve(n);
    }

    /// Decode `buf`, whole pages of `page_size` bytes read from `cpu`'s buffer, in order.
    pub fn pages(&mut self, cpu: i32, buf: &[u8], page_size: usize) {
        // Records are 16 bytes and more: reserve once instead of growing fifteen vectors.
        self.reserve(buf.len() / 24);
        for chunk in buf.chunks(page_size.max(64)) {
            self.page(cpu, chunk);
        }
    }

    fn page(&mut self, cpu: i32, buf: &[u8]) {
        let layout = self.layout;
        let p = page::walk(buf, &layout);
        self.counts.pages += 1;
        let first = p.records.first().map(|r| r.t_ns as i64).unwrap_or(p.ts as i64);
        let prev_damaged = self.last.get(&cpu).map(|x| x.1).unwrap_or(false);
        if prev_damaged {
            self.lose(cpu, first, NONE, "a damaged page");
        }
        match p.missed {
            Missed::None => {}
            Missed::Unknown => self.lose(cpu, first, NONE, "the kernel dropped events (count not stored)"),
            Missed::Count(n) => self.lose(cpu, first, n as i64, "the kernel dropped events"),
        }
        for r in &p.records {
            self.counts.records += 1;
            self.record(cpu, r.t_ns as i64, r.data);
        }
        let last_t = p.records.last().map(|r| r.t_ns as i64).or_else(|| self.last.get(&cpu).map(|x| x.0)).unwrap_or(first);
        if p.damaged.is_some() {
            self.counts.damaged_pages += 1;
        }
        self.last.insert(cpu, (last_t, p.damaged.is_some()));
    }

    /// Data of `cpu` was damaged past reading (a compressed chunk, a file's
    /// records): its next page opens a loss window of unknown size from its
    /// last event, as a damaged page does.
    pub fn damaged(&mut self, cpu: i32) {
        let e = self.last.entry(cpu).or_insert((NONE, false));
        e.1 = true;
    }

    /// The CPUs events came from so far.
    pub fn cpus(&self) -> Vec<i32> {
        self.last.keys().copied().collect()
    }

    /// The latest event's time so far, on any CPU (None: none yet).
    pub fn latest(&self) -> Option<i64> {
        self.last.values().map(|x| x.0).filter(|&t| t != NONE).max()
    }

    /// A CPU whose last page was damaged and that delivered nothing after it:
    /// its window runs to `end_ns` (the end of the capture).
    pub fn finish(&mut self, end_ns: i64) {
        let open: Vec<i32> = self.last.iter().filter(|(_, v)| v.1).map(|(c, _)| *c).collect();
        for c in open {
            self.lose(c, end_ns.max(self.last[&c].0), NONE, "a damaged page at the end");
            if let Some(v) = self.last.get_mut(&c) {
                v.1 = false;
            }
        }
    }

    /// One record that came outside a page (a perf sample's raw payload):
    /// counted, kept, and its CPU's last time moved on.
    pub fn event(&mut self, cpu: i32, t: i64, d: &[u8]) {
        self.counts.records += 1;
        self.record(cpu, t, d);
        self.last.insert(cpu, (t, false));
    }

    /// A loss a recorder reported at `end` on `cpu` (from that CPU's last event).
    pub fn lose_at(&mut self, cpu: i32, end: i64, events: i64, why: &str) {
        self.lose(cpu, end, events, why);
    }

    fn record(&mut self, cpu: i32, t: i64, d: &[u8]) {
        let Some(id) = d.get(0..2).map(|s| u16::from_le_bytes([s[0], s[1]])) else { return };
        let Some(Some(k)) = self.known.get(id as usize) else {
            self.counts.unknown_type += 1;
            return;
        };
        let event = k.event as i32;
        let pid = d.get(4..8).map(|s| i32::from_le_bytes(s.try_into().unwrap())).unwrap_or(-1);
        let mut vals = [NONE; 14];
        let strings = &mut self.strings;
        for f in &k.fields {
            let v = if f.is_string {
                match string_of(d, f) {
                    Some(s) => strings.get(s),
                    None => NONE,
                }
            } else {
                let Some(x) = int_of(d, f) else { continue };
                match f.col {
                    Col::Func => match self.ksyms.get_mut(&(x as u64)) {
                        Some((i, name)) => {
                            if *i == NONE {
                                *i = strings.get(name.as_bytes());
                            }
                            *i
                        }
                        None => continue,
                    },
                    Col::PrevState => state_code(x as u64, &k.symbols),
                    Col::Name if !k.symbols.is_empty() => match k.symbols.iter().find(|(v, _)| *v == x as u64) {
                        Some((_, i)) => *i,
                        None => strings.get(x.to_string().as_bytes()),
                    },
                    Col::Name => strings.get(x.to_string().as_bytes()),
                    _ => x,
                }
            };
            let col = if f.col == Col::Func { Col::Name } else { f.col };
            vals[col as usize] = v;
        }
        let c = &mut self.cols;
        c.t_ns.push(t);
        c.cpu.push(cpu);
        c.event.push(event);
        c.pid.push(pid);
        c.target.push(narrow(vals[0]));
        c.target_comm.push(narrow(vals[1]));
        c.next_pid.push(narrow(vals[2]));
        c.next_comm.push(narrow(vals[3]));
        c.prev_state.push(narrow(vals[4]));
        c.irq.push(narrow(vals[5]));
        c.name.push(narrow(vals[6]));
        c.dest_cpu.push(narrow(vals[7]));
        c.runtime.push(vals[8]);
        c.expires.push(vals[9]);
        c.softexpires.push(vals[10]);
        c.prio.push(narrow(vals[12]));
        c.next_prio.push(narrow(vals[13]));
        self.counts.kept += 1;
    }

    /// Hand over what was decoded so far (the string table and per-CPU state stay).
    pub fn take(&mut self) -> (Columns, Losses) {
        (std::mem::take(&mut self.cols), std::mem::take(&mut self.lost))
    }
}

/// A value of a column kept as 32 bits (ids, string codes, CPUs, states,
/// priorities): -1 stays "none" (any negative is), and one that does not
/// fit is 0, never wrapped (as the segment files store it). Half the width
/// of the others: a batch is some 40 % less memory to fill and to read.
#[inline]
fn narrow(v: i64) -> i32 {
    if v < 0 {
        -1
    } else {
        i32::try_from(v).unwrap_or(0)
    }
}

/// sched_switch's prev_state as one letter (an index into the string
/// table): R (index 0) when no state bit is set, else the print format's name
/// of the lowest bit that is.
fn state_code(v: u64, symbols: &[(u64, i64)]) -> i64 {
    if v == 0 {
        return 0;
    }
    for bit in 0..64 {
        let b = 1u64 << bit;
        if v & b != 0 {
            if let Some((_, n)) = symbols.iter().find(|(x, _)| *x == b) {
                return *n;
            }
        }
    }
    0
}

fn int_of(d: &[u8], f: &Ext) -> Option<i64> {
    let b = d.get(f.offset..f.offset + f.size)?;
    Some(match (f.size, f.signed) {
        (1, true) => b[0] as i8 as i64,
        (1, false) => b[0] as i64,
        (2, true) => i16::from_le_bytes([b[0], b[1]]) as i64,
        (2, false) => u16::from_le_bytes([b[0], b[1]]) as i64,
        (4, true) => i32::from_le_bytes(b.try_into().ok()?) as i64,
        (4, false) => u32::from_le_bytes(b.try_into().ok()?) as i64,
        (8, _) => i64::from_le_bytes(b.try_into().ok()?),
        _ => return None,
    })
}

fn string_of<'a>(d: &'a [u8], f: &Ext) -> Option<&'a [u8]> {
    match f.loc {
        Loc::Inline => d.get(f.offset..f.offset + f.size),
        Loc::Data | Loc::Rel => {
            let w = u32::from_le_bytes(d.get(f.offset..f.offset + 4)?.try_into().ok()?);
            let (len, off) = ((w >> 16) as usize, (w & 0xffff) as usize);
            let off = if f.loc == Loc::Rel { f.offset + 4 + off } else { off };
            d.get(off..off + len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::format::parse;
    use crate::page::tests::page;

    const RUNTIME: &str = "name: sched_stat_runtime\nID: 363\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\tfield:__data_loc char[] comm;\toffset:8;\tsize:4;\tsigned:0;\n\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;\n\tfield:u64 runtime;\toffset:16;\tsize:8;\tsigned:0;\n\nprint fmt: \"comm=%s\"\n";
    const SOFTIRQ: &str = "name: softirq_entry\nID: 20\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\tfield:unsigned int vec;\toffset:8;\tsize:4;\tsigned:0;\n\nprint fmt: \"vec=%u [action=%s]\", REC->vec, __print_symbolic(REC->vec, { 0, \"HI\" }, { 3, \"NET_RX\" })\n";

    fn runtime_rec(pid: i32, comm: &str, runtime: u64) -> Vec<u8> {
        let mut r = vec![0u8; 24];
        r[0..2].copy_from_slice(&363u16.to_le_bytes());
        r[4..8].copy_from_slice(&pid.to_le_bytes());
        let loc = ((comm.len() as u32 + 1) << 16) | 24;
        r[8..12].copy_from_slice(&loc.to_le_bytes());
        r[12..16].copy_from_slice(&pid.to_le_bytes());
        r[16..24].copy_from_slice(&runtime.to_le_bytes());
        r.extend_from_slice(comm.as_bytes());
        r.push(0);
        r
    }

    fn decoder() -> Decoder {
        Decoder::new(PageLayout::default(), vec![parse("sched", RUNTIME).unwrap(), parse("irq", SOFTIRQ).unwrap()])
    }

    #[test]
    fn a_runtime_record_gives_its_task_name_and_runtime() {
        let mut d = decoder();
        d.pages(1, &page(100, &[(0, runtime_rec(42, "kdamond.0", 5000))], None), 4096);
        let (c, _) = d.take();
        assert_eq!((c.t_ns[0], c.cpu[0], c.target[0], c.runtime[0]), (100, 1, 42, 5000));
        assert_eq!(d.strings()[c.target_comm[0] as usize], "kdamond.0");
        assert_eq!(d.events[c.event[0] as usize], "sched_stat_runtime");
    }

    #[test]
    fn a_soft_interrupt_is_named_by_the_print_formats_symbol() {
        let mut d = decoder();
        let mut r = vec![0u8; 12];
        r[0..2].copy_from_slice(&20u16.to_le_bytes());
        r[8..12].copy_from_slice(&3u32.to_le_bytes());
        d.pages(0, &page(7, &[(0, r)], None), 4096);
        let (c, _) = d.take();
        assert_eq!(d.strings()[c.name[0] as usize], "NET_RX");
    }

    #[test]
    fn dropped_events_are_placed_after_the_last_event_of_their_cpu() {
        let mut d = decoder();
        d.pages(0, &page(100, &[(0, runtime_rec(1, "a", 1)), (50, runtime_rec(1, "a", 1))], None), 4096);
        d.pages(1, &page(120, &[(0, runtime_rec(2, "b", 1))], None), 4096);
        d.pages(0, &page(900, &[(0, runtime_rec(1, "a", 1))], Some(17)), 4096);
        let (_, l) = d.take();
        assert_eq!((l.cpu[0], l.start_ns[0], l.end_ns[0], l.events[0]), (0, 150, 900, 17));
    }

    #[test]
    fn a_damaged_page_is_a_loss_of_unknown_size_up_to_the_next_page() {
        let mut d = decoder();
        d.pages(0, &page(100, &[(0, runtime_rec(1, "a", 1))], None), 4096);
        let mut bad = page(200, &[(0, runtime_rec(1, "a", 1))], None);
        bad[16] = 0x1f; // an absolute stamp cut short at the end of a two-word page
        d.pages(0, &bad[..20], 4096);
        d.pages(0, &page(300, &[(0, runtime_rec(1, "a", 1))], None), 4096);
        let (_, l) = d.take();
        assert_eq!(d.counts.damaged_pages, 1);
        assert_eq!((l.start_ns[0], l.end_ns[0], l.events[0]), (100, 300, NONE));
    }

    #[test]
    fn records_of_unknown_events_are_counted_not_kept() {
        let mut d = decoder();
        let mut r = vec![0u8; 8];
        r[0..2].copy_from_slice(&999u16.to_le_bytes());
        d.pages(0, &page(7, &[(0, r)], None), 4096);
        assert_eq!((d.counts.unknown_type, d.counts.kept), (1, 0));
    }

    #[test]
    fn a_switch_state_is_the_lowest_named_bit_or_r() {
        let s = vec![(1, 5), (2, 6)];
        assert_eq!(state_code(0, &s), 0);
        assert_eq!(state_code(2, &s), 6);
        assert_eq!(state_code(3, &s), 5);
    }
}
