//! loopscope's user-space link emulator.
//!
//! Where the kernel has no netem (this lab's machine), a router namespace
//! sits between the hosts' subnets with IP forwarding off, and this loop
//! forwards instead: it reads every frame arriving on the router's
//! interfaces from AF_PACKET sockets with the kernel's RX timestamp, finds
//! the destination host by subnet, applies the link's semantics and sends
//! the rewritten frame out of the destination's interface at its departure
//! time. Links are per ordered pair of hosts (a path through the router),
//! with netem's vocabulary:
//!
//! - **delay** plus **jitter** drawn from a distribution (uniform ±jitter,
//!   normal with sd = jitter, pareto with shape 3 shifted to mean 0 and
//!   scaled to sd = jitter); the sum is clamped at zero; as in netem, jitter
//!   can reorder packets;
//! - **loss**, **duplicate** (the copy gets its own jitter) and **reorder**
//!   (that fraction of packets leaves at once, overtaking the delayed ones),
//!   each an independent Bernoulli draw from a seeded generator;
//! - **rate**: a packet starts transmitting when the previous one on the
//!   link has finished and takes size × 8 / rate; at most **limit** packets
//!   wait per link (more are dropped and counted, netem's default is 1000).
//!
//! Frames come in and go out through PACKET_MMAP rings (`ring.rs`): no
//! system call per frame received, one per batch of frames sent, every
//! frame that is due leaving in the same pass. Departures are kept in a
//! heap; the thread sleeps in `ppoll` until a margin before the next one and
//! spins the rest, the margin being the 99th percentile of the wake-up
//! lateness it observes (capped, so it still sleeps at high rates: a
//! SCHED_FIFO thread that never sleeps is throttled). With `poll` it never
//! sleeps: pinned to a CPU of its own (`cpu`), at SCHED_OTHER for that
//! reason, it watches the rings and the clock and spends that CPU. Everything the
//! emulator does to a packet is counted per link, and with `records` each
//! forwarded packet is a trace record with its kernel RX time, the departure
//! it was given and the one it got, so the emulator's own lateness is told
//! apart from the hosts' noise. All times are CLOCK_REALTIME, the clock of
//! the kernel's packet timestamps.

pub mod error;
pub mod frame;
pub mod port;
pub mod ring;

pub use error::{NetemError, Result};
use loopscope_trace::hist::{LocalHistogram, Scale, Snapshot};
use loopscope_trace::{register, Entity, Kind};
use port::Port;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal, Pareto};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    Uniform,
    Normal,
    Pareto,
}

impl Dist {
    pub fn parse(s: &str) -> Result<Dist> {
        match s {
            "uniform" => Ok(Dist::Uniform),
            "normal" => Ok(Dist::Normal),
            "pareto" => Ok(Dist::Pareto),
            _ => Err(NetemError::Config(format!("unknown jitter distribution {s:?} (uniform, normal, pareto)"))),
        }
    }
}

/// What happens to packets from one host to another.
#[derive(Clone, Debug)]
pub struct LinkSpec {
    pub name: String,
    pub from: usize,
    pub to: usize,
    pub delay_ns: i64,
    pub jitter_ns: i64,
    pub dist: Dist,
    pub loss: f64,
    pub duplicate: f64,
    pub reorder: f64,
    pub rate_bps: Option<f64>,
    pub limit: usize,
}

impl LinkSpec {
    pub fn ideal(name: String, from: usize, to: usize) -> LinkSpec {
        LinkSpec { name, from, to, delay_ns: 0, jitter_ns: 0, dist: Dist::Normal, loss: 0.0, duplicate: 0.0, reorder: 0.0, rate_bps: None, limit: 1000 }
    }
}

/// One router interface and the host behind it.
#[derive(Clone, Debug)]
pub struct PortSpec {
    pub host: String,
    pub ifname: String,
    /// The host's MAC address (the next hop for its subnet).
    pub host_mac: [u8; 6],
    /// The router's own address on this interface (frames to it are the kernel's).
    pub router_ip: u32,
    pub net: u32,
    pub prefix: u8,
}

impl PortSpec {
    fn mask(&self) -> u32 {
        if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix as u32)
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub ports: Vec<PortSpec>,
    pub links: Vec<LinkSpec>,
    pub seed: u64,
    pub records: bool,
    pub duration_ns: Option<u64>,
    pub sockbuf: usize,
    /// SCHED_FIFO priority for the forwarding thread (0: leave the policy alone).
    pub priority: i32,
    /// Paths (from port, to port) the router's kernel forwards itself: the
    /// emulator filters their frames out at the socket and, where a filter
    /// could not be attached, skips them.
    pub kernel_paths: Vec<(usize, usize)>,
    /// PACKET_MMAP rings (false: one recvmsg/send per frame, the old way).
    pub rings: bool,
    /// Busy-poll: never sleep (use with `cpu`, a CPU nothing else needs).
    pub poll: bool,
    /// Pin the forwarding thread to this CPU.
    pub cpu: Option<usize>,
    /// The most it spins before a departure (the margin adapts below it).
    pub spin_max_ns: i64,
    /// Which quantile of its wake-up lateness the margin follows, per mille.
    pub spin_permille: usize,
}

impl Config {
    fn is_kernel(&self, from: usize, to: usize) -> bool {
        self.kernel_paths.contains(&(from, to))
    }

    /// The (net, prefix) destinations the emulator carries from port `i`;
    /// None when it carries every path (no filter needed).
    fn carried_from(&self, i: usize) -> Option<Vec<(u32, u8)>> {
        if self.kernel_paths.is_empty() {
            return None;
        }
        Some((0..self.ports.len()).filter(|&j| j != i && !self.is_kernel(i, j)).map(|j| (self.ports[j].net, self.ports[j].prefix)).collect())
    }
}

#[derive(Debug, Default, Clone)]
pub struct LinkStats {
    pub name: String,
    pub from: String,
    pub to: String,
    pub configured: bool,
    pub packets_in: u64,
    pub bytes_in: u64,
    pub forwarded: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub queue_drops: u64,
    pub send_errors: u64,
    pub pending_at_stop: u64,
    /// The router's kernel forwards this path; the emulator does not touch it.
    pub kernel: bool,
    /// Departure − kernel RX at the router: the delay the emulator applied.
    pub applied: Snapshot,
    /// Actual − scheduled departure: the emulator's own lateness.
    pub late: Snapshot,
    /// Time waiting behind earlier packets for the link's rate.
    pub queued: Snapshot,
}

#[derive(Debug, Default)]
pub struct PortStats {
    pub host: String,
    pub ifname: String,
    pub frames: u64,
    pub not_for_router: u64,
    pub not_ipv4: u64,
    pub to_router: u64,
    pub unrouted: u64,
    pub ttl_expired: u64,
    pub no_kernel_ts: u64,
    /// Frames of a path the kernel forwards that reached the emulator
    /// anyway (its socket filter could not be attached); left alone.
    pub kernel_path: u64,
    /// Frames the kernel dropped before the emulator read them (socket
    /// queue or RX ring full), from PACKET_STATISTICS.
    pub socket_drops: u64,
    /// Frames longer than a ring slot, dropped.
    pub truncated: u64,
    /// Frames the kernel refused from the TX ring.
    pub tx_refused: u64,
    /// "rings" or why not ("plain calls: …").
    pub io: String,
}

#[derive(Debug, Default)]
pub struct EmuResult {
    pub links: Vec<LinkStats>,
    pub ports: Vec<PortStats>,
    pub elapsed_ns: u64,
    pub interrupted: bool,
    pub final_margin_ns: i64,
    pub sleeps: u64,
    /// The SCHED_FIFO priority obtained (0: none; the reason is in `policy_note`).
    pub priority: i32,
    pub policy_note: String,
    pub hist_scale: Option<Scale>,
    /// How it waited: "sleep + spin" or "busy-poll on CPU n".
    pub wait: String,
    /// The CPU it was pinned to, if any (and the error if pinning failed).
    pub cpu_note: String,
    /// CPU time the forwarding thread used, ns (its cost to the machine).
    pub cpu_ns: i64,
    /// new settings that could not be taken (the old ones stayed)
    pub reload_errors: Vec<String>,
}

struct Pending {
    frame: Vec<u8>,
    len: usize,
    link: usize,
    krx: i64,
    ready: i64,
    sched: i64,
    queued: i64,
    flags: u32,
}

const LATE_RING: usize = 256;
/// Spinning longer than this before each departure would keep a CPU busy
/// at high packet rates (and a SCHED_FIFO thread that never sleeps is
/// throttled by the kernel for 50 ms a second): wake-ups later than this
/// show as lateness in the emulator's own records instead.
const MAX_MARGIN_NS: i64 = 150_000;
const MIN_MARGIN_NS: i64 = 5_000;

/// The spin margin: a quantile (per mille) of recent wake-up lateness plus
/// a little, within [MIN_MARGIN_NS, cap]. The median (the default) makes
/// the typical departure punctual for little spinning; the 99th percentile
/// also cuts the tail, for a CPU the probes share. A quantile, so one
/// outlier (a VM stall) does not make the emulator spin for good.
fn spin_margin(late: &[i64], cap: i64, permille: usize) -> i64 {
    let mut v: Vec<i64> = late.to_vec();
    let k = (v.len() * permille / 1000).min(v.len().saturating_sub(1));
    let (_, q, _) = v.select_nth_unstable(k);
    (*q + 5_000).clamp(MIN_MARGIN_NS.min(cap), cap)
}

fn thread_cpu_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

const FLAG_DUP: u32 = 1;
const FLAG_REORDERED: u32 = 2;
const MAX_FRAME: usize = 65536 + 14;

pub use loopscope_os::realtime_ns;

fn hist() -> LocalHistogram {
    LocalHistogram::new(Scale::Log { sub_bits: 7, max: 60_000_000_000 }).expect("layout")
}

struct Sampler {
    rng: SmallRng,
    normal: Normal<f64>,
    pareto: Pareto<f64>,
}

impl Sampler {
    fn new(seed: u64) -> Sampler {
        Sampler { rng: SmallRng::seed_from_u64(seed), normal: Normal::new(0.0, 1.0).expect("normal"), pareto: Pareto::new(1.0, 3.0).expect("pareto") }
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random::<f64>() < p
    }

    /// The link's delay for one packet, jitter included, never negative.
    fn delay(&mut self, l: &LinkSpec) -> i64 {
        if l.jitter_ns == 0 {
            return l.delay_ns;
        }
        let j = l.jitter_ns as f64;
        let x = match l.dist {
            Dist::Uniform => self.rng.random_range(-1.0..=1.0) * j,
            Dist::Normal => self.normal.sample(&mut self.rng) * j,
            // Pareto(1, 3): mean 1.5, sd sqrt(3)/2.
            Dist::Pareto => (self.pareto.sample(&mut self.rng) - 1.5) / 0.866_025_4 * j,
        };
        (l.delay_ns as f64 + x).max(0.0) as i64
    }
}

struct Ents {
    forward: &'static Entity,
    drop: &'static Entity,
    reconfigure: &'static Entity,
}

fn ents() -> Ents {
    Ents {
        forward: register(
            "netem",
            "forward",
            Kind::Event,
            "a packet the emulator forwarded (tag: link index); payload: kernel RX at the router, ready (RX + delay), scheduled departure (after the rate queue), actual departure (i64 CLOCK_REALTIME ns), length u32, flags u32 (1 duplicate, 2 reordered)",
            None,
        )
        .expect("entity"),
        drop: register("netem", "drop", Kind::Event, "a packet the emulator dropped (tag: link index); value: 1 loss, 2 queue limit, 3 send error", None).expect("entity"),
        reconfigure: register("netem", "reconfigure", Kind::Event, "a link took new settings (tag: link index); value: its delay, ns", None).expect("entity"),
    }
}

/// Open the router's interfaces (frames queue in the sockets from here on).
/// With kernel paths, each socket keeps only the frames the emulator
/// carries; the second value lists the ports where that filter could not be
/// attached (their kernel frames are then skipped in the loop, counted as
/// `kernel_path` in the port's counts).
pub fn open_ports(cfg: &Config) -> Result<(Vec<Port>, Vec<String>)> {
    let mut ports = Vec::new();
    let mut unfiltered = Vec::new();
    for (i, p) in cfg.ports.iter().enumerate() {
        let only = cfg.carried_from(i);
        let (port, err) = Port::open_filtered(&p.ifname, cfg.sockbuf, only.as_deref(), cfg.rings)?;
        unfiltered.extend(err);
        ports.push(port);
    }
    Ok((ports, unfiltered))
}

/// Set (from a signal handler, say) to make a running emulator take new
/// link settings from its `reload` callback at its next turn of the loop.
pub static RELOAD: AtomicBool = AtomicBool::new(false);

/// New settings for some links, matched by direction (from → to).
pub type Reload = Box<dyn Fn() -> Result<Vec<LinkSpec>> + Send>;

/// Forward until `stop` is set (or the duration passes).
pub fn run(cfg: &Config, ports: Vec<Port>, stop: Arc<AtomicBool>) -> Result<EmuResult> {
    run_with(cfg, ports, stop, None)
}

/// `run`, taking new link settings whenever [`RELOAD`] is set: the links keep
/// their counts and their packets in flight keep the delay they were given;
/// packets arriving from then on get the new settings. Each change is a
/// `netem/reconfigure` event in the trace (tag: the link's index).
pub fn run_with(cfg: &Config, ports: Vec<Port>, stop: Arc<AtomicBool>, reload: Option<Reload>) -> Result<EmuResult> {
    if ports.len() != cfg.ports.len() {
        return Err(NetemError::Config(format!("{} ports opened for {} interfaces", ports.len(), cfg.ports.len())));
    }
    let (links, table, configured) = links_of(cfg)?;
    loopscope_trace::prepare_thread();
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    let placed = Placement::apply(cfg);
    let mut fw = Forwarder::new(cfg, ports, links, table, configured);
    let mut waiter = Waiter::new(cfg, &fw.ports);
    let cpu0 = thread_cpu_ns();
    let t0 = realtime_ns();
    let end = cfg.duration_ns.map(|d| t0 + d as i64);
    let mut reload_errors = Vec::new();
    while !stop.load(Ordering::Relaxed) && !end.is_some_and(|e| realtime_ns() >= e) {
        if RELOAD.swap(false, Ordering::Relaxed) {
            if let Some(f) = reload.as_ref() {
                match f() {
                    Ok(specs) => fw.reconfigure(specs),
                    Err(e) => reload_errors.push(e.to_string()),
                }
            }
        }
        for pi in 0..fw.ports.len() {
            fw.take_in(pi);
        }
        let now = fw.send_due();
        waiter.wait(fw.next_departure(), now, end);
    }
    let mut result = fw.finish();
    result.interrupted = stop.load(Ordering::Relaxed);
    result.elapsed_ns = (realtime_ns() - t0).max(0) as u64;
    result.wait = match (cfg.poll, cfg.cpu) {
        (true, Some(c)) => format!("busy-poll on CPU {c}"),
        (true, None) => "busy-poll (not pinned)".into(),
        _ => "sleep in ppoll, spin the last margin".into(),
    };
    result.cpu_note = placed.cpu_note;
    result.cpu_ns = thread_cpu_ns() - cpu0;
    result.final_margin_ns = waiter.margin;
    result.sleeps = waiter.sleeps;
    result.priority = placed.priority;
    result.policy_note = placed.policy_note;
    result.reload_errors = reload_errors;
    Ok(result)
}

/// One link per ordered pair of ports: the configured ones first, then an
/// ideal one for every other pair; `table[from * n + to]` is the link's index.
fn links_of(cfg: &Config) -> Result<(Vec<LinkSpec>, Vec<usize>, usize)> {
    let n = cfg.ports.len();
    let mut links: Vec<LinkSpec> = Vec::new();
    let mut table = vec![usize::MAX; n * n];
    for l in &cfg.links {
        if l.from >= n || l.to >= n || l.from == l.to {
            return Err(NetemError::Config(format!("link {}: bad port indices {} -> {}", l.name, l.from, l.to)));
        }
        table[l.from * n + l.to] = links.len();
        links.push(l.clone());
    }
    let configured = links.len();
    for a in 0..n {
        for b in 0..n {
            if a != b && table[a * n + b] == usize::MAX {
                table[a * n + b] = links.len();
                links.push(LinkSpec::ideal(format!("{}->{}", cfg.ports[a].host, cfg.ports[b].host), a, b));
            }
        }
    }
    Ok((links, table, configured))
}

/// Where and how the forwarding thread runs: pinned to `cpu` if asked;
/// SCHED_FIFO at `priority` when it sleeps between departures, SCHED_OTHER
/// nice -20 when it busy-polls (a SCHED_FIFO thread that never sleeps is
/// throttled by the kernel, 50 ms of every second by default).
struct Placement {
    cpu_note: String,
    priority: i32,
    policy_note: String,
}

impl Placement {
    fn apply(cfg: &Config) -> Placement {
        let cpu_note = match cfg.cpu {
            Some(c) => unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(c, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 {
                    format!("pinned to CPU {c}")
                } else {
                    format!("not pinned: CPU {c} refused ({})", std::io::Error::last_os_error())
                }
            },
            None => String::new(),
        };
        let (priority, policy_note) = if cfg.poll {
            // nice -20: ahead of ordinary work on its CPU, short of SCHED_FIFO.
            let ok = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -20) } == 0;
            (0, format!("SCHED_OTHER nice {} (busy-polling)", if ok { "-20" } else { "0" }))
        } else if cfg.priority > 0 {
            let sp = libc::sched_param { sched_priority: cfg.priority };
            if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &sp) } == 0 {
                (cfg.priority, format!("SCHED_FIFO {}", cfg.priority))
            } else {
                (0, format!("SCHED_OTHER (SCHED_FIFO {} refused: {})", cfg.priority, std::io::Error::last_os_error()))
            }
        } else {
            (0, "SCHED_OTHER (no priority requested)".to_string())
        };
        Placement { cpu_note, priority, policy_note }
    }
}

/// A link's three histograms: the delay applied, the emulator's own
/// lateness, the time queued behind earlier packets for the rate.
struct LinkHists {
    applied: LocalHistogram,
    late: LocalHistogram,
    queued: LocalHistogram,
}

/// The packets waiting to leave, by departure time (ties in arrival order);
/// their frames live in a slab of reused buffers.
#[derive(Default)]
struct Departures {
    slab: Vec<Pending>,
    free: Vec<usize>,
    heap: BinaryHeap<Reverse<(i64, u64, usize)>>,
    order: u64,
}

impl Departures {
    fn push(&mut self, frame: &[u8], p: Pending) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slab.push(Pending { frame: Vec::new(), len: 0, link: 0, krx: 0, ready: 0, sched: 0, queued: 0, flags: 0 });
            self.slab.len() - 1
        });
        let pd = &mut self.slab[slot];
        let mut buf = std::mem::take(&mut pd.frame);
        buf.clear();
        buf.extend_from_slice(frame);
        *pd = Pending { frame: buf, ..p };
        self.order += 1;
        self.heap.push(Reverse((pd.sched, self.order, slot)));
    }

    /// The next due slot (departure at or before `now`), taken off the heap.
    fn pop_due(&mut self, now: i64) -> Option<usize> {
        match self.heap.peek() {
            Some(&Reverse((t, _, slot))) if t <= now => {
                self.heap.pop();
                Some(slot)
            }
            _ => None,
        }
    }
}

/// The forwarding loop's state: the links and their counts, the ports, the
/// packets waiting to leave.
struct Forwarder<'a> {
    cfg: &'a Config,
    ports: Vec<Port>,
    links: Vec<LinkSpec>,
    table: Vec<usize>,
    stats: Vec<LinkStats>,
    pstats: Vec<PortStats>,
    hists: Vec<LinkHists>,
    busy_until: Vec<i64>,
    waiting: Vec<usize>,
    rng: Sampler,
    due: Departures,
    batch: Vec<(usize, i64)>,
    buf: Vec<u8>,
    payload: [u8; 40],
    e: Ents,
}

impl<'a> Forwarder<'a> {
    fn new(cfg: &'a Config, ports: Vec<Port>, links: Vec<LinkSpec>, table: Vec<usize>, configured: usize) -> Forwarder<'a> {
        let stats = links
            .iter()
            .enumerate()
            .map(|(i, l)| LinkStats {
                name: l.name.clone(),
                from: cfg.ports[l.from].host.clone(),
                to: cfg.ports[l.to].host.clone(),
                configured: i < configured,
                kernel: cfg.is_kernel(l.from, l.to),
                ..Default::default()
            })
            .collect();
        let pstats = cfg
            .ports
            .iter()
            .zip(ports.iter())
            .map(|(p, q)| PortStats {
                host: p.host.clone(),
                ifname: p.ifname.clone(),
                io: match (&q.rings, &q.ring_error) {
                    (Some(_), _) => "PACKET_MMAP rings".into(),
                    (None, Some(e)) => format!("one system call per frame (rings refused: {e})"),
                    (None, None) => "one system call per frame".into(),
                },
                ..Default::default()
            })
            .collect();
        let n = links.len();
        Forwarder {
            cfg,
            ports,
            hists: links.iter().map(|_| LinkHists { applied: hist(), late: hist(), queued: hist() }).collect(),
            links,
            table,
            stats,
            pstats,
            busy_until: vec![0; n],
            waiting: vec![0; n],
            rng: Sampler::new(cfg.seed),
            due: Departures::default(),
            batch: Vec::new(),
            buf: vec![0u8; MAX_FRAME],
            payload: [0u8; 40],
            e: ents(),
        }
    }

    /// New settings for the links they name (by direction).
    fn reconfigure(&mut self, specs: Vec<LinkSpec>) {
        let n = self.ports.len();
        for sp in specs {
            if sp.from < n && sp.to < n && sp.from != sp.to {
                let li = self.table[sp.from * n + sp.to];
                let name = self.links[li].name.clone();
                self.links[li] = LinkSpec { name, ..sp };
                self.stats[li].configured = true;
                self.e.reconfigure.event_value(li as u32, self.links[li].delay_ns);
            }
        }
    }

    /// Take in what arrived on port `pi` (up to 256 frames a turn).
    fn take_in(&mut self, pi: usize) {
        if !self.ports[pi].ready() {
            return;
        }
        for _ in 0..256 {
            let Some((len, krx0)) = self.ports[pi].recv(&mut self.buf, &mut self.pstats[pi].not_for_router) else { break };
            let ps = &mut self.pstats[pi];
            ps.frames += 1;
            let krx = if krx0 == 0 {
                ps.no_kernel_ts += 1;
                realtime_ns()
            } else {
                krx0
            };
            if let Some((li, ip)) = self.route(pi, len) {
                self.admit(pi, li, len, krx, &ip);
            }
        }
    }

    /// The link a frame that came in on `pi` takes, or None (counted: not
    /// IPv4, for the router itself, no route, a path the kernel forwards).
    fn route(&mut self, pi: usize, len: usize) -> Option<(usize, frame::Ipv4)> {
        let ps = &mut self.pstats[pi];
        let Some(ip) = frame::ipv4(&self.buf[..len]) else {
            ps.not_ipv4 += 1;
            return None;
        };
        if self.cfg.ports.iter().any(|q| q.router_ip == ip.dst) {
            ps.to_router += 1;
            return None;
        }
        let out = match self.cfg.ports.iter().position(|q| ip.dst & q.mask() == q.net & q.mask()) {
            Some(out) if out != pi => out,
            _ => {
                ps.unrouted += 1;
                return None;
            }
        };
        if self.cfg.is_kernel(pi, out) {
            ps.kernel_path += 1;
            return None;
        }
        Some((self.table[pi * self.ports.len() + out], ip))
    }

    /// The link's semantics for one frame: loss, the rewrite for its next
    /// hop, duplication, reordering or delay, the rate queue; each copy that
    /// survives waits for its departure.
    fn admit(&mut self, pi: usize, li: usize, len: usize, krx: i64, ip: &frame::Ipv4) {
        let l = &self.links[li];
        let st = &mut self.stats[li];
        st.packets_in += 1;
        st.bytes_in += len as u64;
        if self.rng.chance(l.loss) {
            st.lost += 1;
            self.e.drop.event_value(li as u32, 1);
            return;
        }
        let out = l.to;
        if !frame::forward(&mut self.buf[..len], ip, &self.ports[out].mac, &self.cfg.ports[out].host_mac) {
            self.pstats[pi].ttl_expired += 1;
            return;
        }
        let copies = if self.rng.chance(l.duplicate) { 2 } else { 1 };
        for c in 0..copies {
            let st = &mut self.stats[li];
            if self.waiting[li] >= l.limit {
                st.queue_drops += 1;
                self.e.drop.event_value(li as u32, 2);
                continue;
            }
            let mut flags = if c == 1 { FLAG_DUP } else { 0 };
            if c == 1 {
                st.duplicated += 1;
            }
            let ready = if self.rng.chance(l.reorder) {
                st.reordered += 1;
                flags |= FLAG_REORDERED;
                krx
            } else {
                krx + self.rng.delay(l)
            };
            let (sched, queued) = match l.rate_bps {
                Some(r) if r > 0.0 => {
                    let tx = (len as f64 * 8.0 * 1e9 / r) as i64;
                    let start = ready.max(self.busy_until[li]);
                    self.busy_until[li] = start + tx;
                    (start + tx, start - ready)
                }
                _ => (ready, 0),
            };
            self.waiting[li] += 1;
            self.due.push(&self.buf[..len], Pending { frame: Vec::new(), len, link: li, krx, ready, sched, queued, flags });
        }
    }

    /// Send what is due: every due frame into its port's TX ring, then one
    /// flush per port; the departure is the flush's time. Returns the time after.
    fn send_due(&mut self) -> i64 {
        let mut now = realtime_ns();
        self.batch.clear();
        while let Some(slot) = self.due.pop_due(now) {
            let pd = &self.due.slab[slot];
            let out = self.links[pd.link].to;
            let direct = self.ports[out].rings.is_none();
            let t_direct = if direct { realtime_ns() } else { 0 };
            let ok = self.ports[out].send(&pd.frame[..pd.len]);
            self.batch.push((slot, if ok { t_direct } else { -1 }));
            if direct {
                now = realtime_ns();
            }
        }
        if self.batch.is_empty() {
            return now;
        }
        let t_flush = realtime_ns();
        for p in self.ports.iter_mut() {
            p.flush();
        }
        for i in 0..self.batch.len() {
            let (slot, t) = self.batch[i];
            self.sent(
                slot,
                if t > 0 {
                    t
                } else if t == 0 {
                    t_flush
                } else {
                    -1
                },
            );
            self.due.free.push(slot);
        }
        realtime_ns()
    }

    /// Count one frame that left at `sent` (-1: the send failed), and trace it.
    fn sent(&mut self, slot: usize, sent: i64) {
        let pd = &self.due.slab[slot];
        let li = pd.link;
        self.waiting[li] -= 1;
        let st = &mut self.stats[li];
        if sent < 0 {
            st.send_errors += 1;
            self.e.drop.event_value(li as u32, 3);
            return;
        }
        st.forwarded += 1;
        let h = &mut self.hists[li];
        h.applied.add(sent - pd.krx);
        h.late.add(sent - pd.sched);
        h.queued.add(pd.queued);
        if self.cfg.records {
            let p = &mut self.payload;
            p[0..8].copy_from_slice(&pd.krx.to_le_bytes());
            p[8..16].copy_from_slice(&pd.ready.to_le_bytes());
            p[16..24].copy_from_slice(&pd.sched.to_le_bytes());
            p[24..32].copy_from_slice(&sent.to_le_bytes());
            p[32..36].copy_from_slice(&(pd.len as u32).to_le_bytes());
            p[36..40].copy_from_slice(&pd.flags.to_le_bytes());
            self.e.forward.event_payload(li as u32, p);
        }
    }

    fn next_departure(&self) -> Option<i64> {
        self.due.heap.peek().map(|r| r.0 .0)
    }

    /// The counts, with what was still waiting and what the ports dropped.
    fn finish(mut self) -> EmuResult {
        for Reverse((_, _, slot)) in self.due.heap.drain() {
            self.stats[self.due.slab[slot].link].pending_at_stop += 1;
        }
        for (st, h) in self.stats.iter_mut().zip(&self.hists) {
            st.applied = h.applied.snapshot();
            st.late = h.late.snapshot();
            st.queued = h.queued.snapshot();
        }
        for (ps, p) in self.pstats.iter_mut().zip(self.ports.iter()) {
            ps.socket_drops = p.drops();
            ps.truncated = p.truncated;
            ps.tx_refused = p.tx_refused;
        }
        EmuResult { links: self.stats, ports: self.pstats, hist_scale: Some(hist().scale), ..Default::default() }
    }
}

/// How the loop waits for the next departure: in `ppoll` on the ports until
/// a margin before it, spinning the rest; the margin follows a quantile of
/// the wake-up lateness it sees (`spin_margin`). With `poll` it never sleeps.
struct Waiter {
    pfds: Vec<libc::pollfd>,
    poll: bool,
    spin_cap: i64,
    permille: usize,
    margin: i64,
    ring: [i64; LATE_RING],
    seen: usize,
    sleeps: u64,
}

impl Waiter {
    fn new(cfg: &Config, ports: &[Port]) -> Waiter {
        let spin_cap = cfg.spin_max_ns.clamp(0, MAX_MARGIN_NS);
        Waiter {
            pfds: ports.iter().map(|p| libc::pollfd { fd: p.fd, events: libc::POLLIN, revents: 0 }).collect(),
            poll: cfg.poll,
            spin_cap,
            permille: cfg.spin_permille.clamp(1, 999),
            margin: 50_000.min(spin_cap),
            ring: [0; LATE_RING],
            seen: 0,
            sleeps: 0,
        }
    }

    fn wait(&mut self, next: Option<i64>, now: i64, end: Option<i64>) {
        let wait = match next {
            _ if self.poll => 0,
            Some(t) => t - now - self.margin,
            None => 100_000_000,
        };
        if wait <= 0 {
            std::hint::spin_loop();
            return;
        }
        let wait = end.map_or(wait, |e| wait.min((e - now).max(0))).min(100_000_000);
        let ts = libc::timespec { tv_sec: wait / 1_000_000_000, tv_nsec: wait % 1_000_000_000 };
        let target = now + wait;
        let r = unsafe { libc::ppoll(self.pfds.as_mut_ptr(), self.pfds.len() as libc::nfds_t, &ts, std::ptr::null()) };
        self.sleeps += 1;
        if r == 0 && next.is_some() {
            // Woken by the timeout: learn how late wake-ups are.
            self.ring[self.seen % LATE_RING] = realtime_ns() - target;
            self.seen += 1;
            if self.seen % 64 == 0 {
                self.margin = spin_margin(&self.ring[..self.seen.min(LATE_RING)], self.spin_cap, self.permille);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(delay: i64, jitter: i64, dist: Dist) -> LinkSpec {
        LinkSpec { jitter_ns: jitter, delay_ns: delay, dist, ..LinkSpec::ideal("t".into(), 0, 1) }
    }

    #[test]
    fn jitter_distributions_have_the_requested_mean_and_spread() {
        for dist in [Dist::Uniform, Dist::Normal, Dist::Pareto] {
            let mut s = Sampler::new(7);
            let l = link(10_000_000, 1_000_000, dist);
            let xs: Vec<f64> = (0..200_000).map(|_| s.delay(&l) as f64).collect();
            let mean = xs.iter().sum::<f64>() / xs.len() as f64;
            let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64).sqrt();
            assert!((mean - 10e6).abs() < 20e3, "{dist:?} mean {mean}");
            let want = if dist == Dist::Uniform { 1e6 / 3f64.sqrt() } else { 1e6 };
            // Pareto's sample sd converges slowly (infinite fourth moment).
            let tol = if dist == Dist::Pareto { 0.2 } else { 0.02 };
            assert!((sd / want - 1.0).abs() < tol, "{dist:?} sd {sd} want {want}");
        }
    }

    #[test]
    fn delay_never_goes_negative() {
        let mut s = Sampler::new(1);
        let l = link(100, 1_000_000, Dist::Normal);
        assert!((0..10_000).all(|_| s.delay(&l) >= 0));
    }

    #[test]
    fn loss_draws_match_the_requested_probability() {
        let mut s = Sampler::new(3);
        let n = 100_000;
        let k = (0..n).filter(|_| s.chance(0.01)).count() as f64;
        // Binomial sd = sqrt(n p (1-p)) ~ 31.5; allow 5 sd.
        assert!((k - 1000.0).abs() < 160.0, "{k}");
        assert_eq!((0..n).filter(|_| s.chance(0.0)).count(), 0);
    }

    #[test]
    fn the_spin_margin_ignores_a_rare_stall_and_stays_capped() {
        let mut late = vec![20_000i64; 256];
        late[7] = 5_000_000;
        late[8] = 5_000_000;
        assert_eq!(spin_margin(&late, MAX_MARGIN_NS, 990), 25_000);
        assert_eq!(spin_margin(&[1_000_000; 256], MAX_MARGIN_NS, 990), MAX_MARGIN_NS);
        assert_eq!(spin_margin(&[0; 10], MAX_MARGIN_NS, 990), MIN_MARGIN_NS);
        assert_eq!(spin_margin(&[1_000_000; 256], 20_000, 990), 20_000);
        assert_eq!(spin_margin(&[0; 10], 0, 990), 0);
    }

    #[test]
    fn the_median_margin_follows_the_typical_wake_up_not_the_tail() {
        let late: Vec<i64> = (0..256).map(|i| if i % 4 == 0 { 90_000 } else { 20_000 }).collect();
        assert_eq!(spin_margin(&late, MAX_MARGIN_NS, 500), 25_000);
        assert_eq!(spin_margin(&late, MAX_MARGIN_NS, 990), 95_000);
    }

    #[test]
    fn a_subnet_mask_covers_its_prefix() {
        let p = PortSpec { host: "a".into(), ifname: "x".into(), host_mac: [0; 6], router_ip: 0, net: 0x0a4d0100, prefix: 24 };
        assert_eq!(p.mask(), 0xffffff00);
    }
}
