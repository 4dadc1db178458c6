//! The distributed pipeline (Boie & Niehaus 2007 §3.3, `data_pipe`): source → nodes → sink.
//!
//! A message is a loopscope packet (kind 4) whose header carries the
//! source's scheduled and actual send times, followed at byte 48 by the
//! number of nodes it has crossed and, from byte 56, 24 bytes per node: the
//! node's kernel RX timestamp, its application receive time and its send
//! time (all CLOCK_REALTIME ns, the clock of the kernel's stamps, which time
//! namespaces do not shift). A node receives, optionally spins `work_ns` to
//! stand for processing, appends its stamps and sends the message on; the
//! sink adds its own kernel RX and receive times and writes one trace record
//! per message with every stamp, from which each hop's network time
//! (previous send → kernel RX), each node's kernel-to-application time and
//! processing time, and the end-to-end time follow. With the sink on the
//! source's host the pipeline is a control loop.
//!
//! Across namespaces of one machine the stamps share one clock; across
//! machines each host's REALTIME differs and the clock-sync step maps them.
//! Loss, duplicates and reordering are counted at the sink per pipeline;
//! a node counts what it could not forward (no room left in the message,
//! send errors).

use super::packet::{Header, HEADER, MAGIC, VERSION};
use super::recv::{Arrival, Flow};
use super::sock::{realtime_ns, realtime_offset_ns, recv_stamped, Udp};
use crate::error::Result;
use crate::os::{mono_ns, sleep_until};
use loopscope_trace::hist::{LocalHistogram, Scale, Snapshot};
use loopscope_trace::{register, Entity, Kind};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub const PIPE: u8 = 4;
pub const HOPS_AT: usize = HEADER;
pub const FIRST_HOP: usize = HEADER + 8;
pub const HOP: usize = 24;

/// Write a fresh message header (no hops yet).
pub fn write_message(b: &mut [u8], flow: u32, seq: u64, sched_ns: i64, sent_ns: i64) {
    Header { kind: PIPE, flow, worker: 0, seq, sched_ns, sent_ns }.write(b);
    b[HOPS_AT..FIRST_HOP].fill(0);
}

/// A pipeline message: header, hops recorded so far.
pub fn read_message(b: &[u8]) -> Option<(Header, usize)> {
    if b.len() < FIRST_HOP || b[0..4] != MAGIC || b[4] != VERSION || b[5] != PIPE {
        return None;
    }
    let mut h = [0u8; HEADER];
    h.copy_from_slice(&b[..HEADER]);
    h[5] = super::packet::DATA; // read the common header with the common parser
    let hdr = Header::read(&h)?;
    let hops = b[HOPS_AT] as usize;
    if b.len() < FIRST_HOP + hops * HOP {
        return None;
    }
    Some((Header { kind: PIPE, ..hdr }, hops))
}

/// Append one node's stamps; false when the message has no room left.
pub fn append_hop(b: &mut [u8], len: usize, krx: i64, urx: i64, utx: i64) -> bool {
    let hops = b[HOPS_AT] as usize;
    let at = FIRST_HOP + hops * HOP;
    if at + HOP > len || hops == 255 {
        return false;
    }
    b[at..at + 8].copy_from_slice(&krx.to_le_bytes());
    b[at + 8..at + 16].copy_from_slice(&urx.to_le_bytes());
    b[at + 16..at + 24].copy_from_slice(&utx.to_le_bytes());
    b[HOPS_AT] = hops as u8 + 1;
    true
}

pub fn hop(b: &[u8], i: usize) -> (i64, i64, i64) {
    let at = FIRST_HOP + i * HOP;
    let r = |o: usize| i64::from_le_bytes(b[at + o..at + o + 8].try_into().unwrap());
    (r(0), r(8), r(16))
}

fn hist() -> LocalHistogram {
    LocalHistogram::new(Scale::Log { sub_bits: 7, max: 60_000_000_000 }).expect("layout")
}

/// Receive one datagram with its kernel RX time; None on timeout.
fn recv_one(sock: &Udp, buf: &mut [u8], ctrl: &mut [u8]) -> Option<(usize, i64, bool)> {
    recv_stamped(sock.raw(), buf, ctrl).map(|r| (r.len, r.krx, r.truncated))
}

// ---- source -------------------------------------------------------------------------

#[derive(Debug, Default)]
pub struct SourceResult {
    pub sent: u64,
    pub send_errors: u64,
    /// Actual − scheduled send time.
    pub late: Snapshot,
    pub hist_scale: Option<Scale>,
    pub elapsed_ns: u64,
    pub interrupted: bool,
}

/// Send `size`-byte messages to `dest` at `pps_num/pps_den` per second (absolute deadlines).
#[allow(clippy::too_many_arguments)]
pub fn source(
    dest: &SocketAddr,
    flow: u32,
    pps_num: u128,
    pps_den: u128,
    size: usize,
    count: Option<u64>,
    duration_ns: Option<u64>,
    stop: Arc<AtomicBool>,
) -> Result<SourceResult> {
    let sock = Udp::connect(dest, 1 << 20)?;
    let sent_e =
        register("pipe", "sent", Kind::Event, "a pipeline message left the source (tag: seq); value: actual - scheduled send time, ns", None).expect("entity");
    loopscope_trace::prepare_thread();
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    let mut late = hist();
    let mut r = SourceResult { hist_scale: Some(late.scale), ..Default::default() };
    let mut buf = vec![0u8; size.max(FIRST_HOP)];
    let off = realtime_offset_ns();
    let t0 = mono_ns() + 1_000_000;
    let sched = super::schedule::Schedule::new(super::schedule::Pattern::Cbr, pps_num, pps_den, count, duration_ns);
    for (seq, at) in sched.enumerate() {
        if stop.load(Ordering::Relaxed) {
            r.interrupted = true;
            break;
        }
        let due = t0 + at as i64;
        sleep_until(due);
        let sched_rt = due + off;
        let now = realtime_ns();
        write_message(&mut buf, flow, seq as u64, sched_rt, now);
        let n = unsafe { libc::send(sock.raw(), buf.as_ptr() as *const libc::c_void, buf.len(), 0) };
        if n < 0 {
            r.send_errors += 1;
            continue;
        }
        r.sent += 1;
        late.add(now - sched_rt);
        sent_e.event_value(seq as u32, now - sched_rt);
    }
    r.elapsed_ns = (mono_ns() - t0).max(0) as u64;
    r.late = late.snapshot();
    Ok(r)
}

// ---- node ---------------------------------------------------------------------------

#[derive(Debug, Default)]
pub struct NodeResult {
    pub received: u64,
    pub forwarded: u64,
    pub malformed: u64,
    pub full: u64,
    pub send_errors: u64,
    pub no_kernel_ts: u64,
    /// Kernel RX → send, at this node.
    pub residence: Snapshot,
    pub hist_scale: Option<Scale>,
    pub elapsed_ns: u64,
}

pub fn bind(addr: &SocketAddr) -> Result<Udp> {
    let s = Udp::bind(addr, 4 << 20)?;
    s.enable_rx_timestamps()?;
    s.set_read_timeout_ms(50);
    Ok(s)
}

/// Forward messages from `sock` to `next`, spinning `work_ns` on each, until stopped.
pub fn node(sock: Udp, next: &SocketAddr, work_ns: i64, stop: Arc<AtomicBool>) -> Result<NodeResult> {
    let out = Udp::connect(next, 1 << 20)?;
    let res_e = register("pipe", "node", Kind::Event, "a message this node forwarded (tag: seq); value: kernel RX to send, ns", None).expect("entity");
    loopscope_trace::prepare_thread();
    let mut residence = hist();
    let mut r = NodeResult { hist_scale: Some(residence.scale), ..Default::default() };
    let mut buf = vec![0u8; 65536];
    let mut ctrl = [0u8; 256];
    let t0 = mono_ns();
    while !stop.load(Ordering::Relaxed) {
        let Some((len, krx, trunc)) = recv_one(&sock, &mut buf, &mut ctrl) else { continue };
        let urx = realtime_ns();
        r.received += 1;
        if trunc || read_message(&buf[..len]).is_none() {
            r.malformed += 1;
            continue;
        }
        if krx == 0 {
            r.no_kernel_ts += 1;
        }
        if work_ns > 0 {
            let end = urx + work_ns;
            while realtime_ns() < end {
                std::hint::spin_loop();
            }
        }
        let utx = realtime_ns();
        if !append_hop(&mut buf, len, krx, urx, utx) {
            r.full += 1;
            continue;
        }
        let n = unsafe { libc::send(out.raw(), buf.as_ptr() as *const libc::c_void, len, 0) };
        if n < 0 {
            r.send_errors += 1;
            continue;
        }
        r.forwarded += 1;
        let k = if krx != 0 { krx } else { urx };
        residence.add(utx - k);
        let seq = u64::from_le_bytes(buf[16..24].try_into().unwrap());
        res_e.event_value(seq as u32, utx - k);
    }
    r.elapsed_ns = (mono_ns() - t0) as u64;
    r.residence = residence.snapshot();
    Ok(r)
}

// ---- sink ---------------------------------------------------------------------------

#[derive(Debug, Default)]
pub struct SinkResult {
    pub received: u64,
    pub malformed: u64,
    pub truncated: u64,
    pub no_kernel_ts: u64,
    pub unique: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub reordered: u64,
    pub first_seq: u64,
    pub max_seq: u64,
    pub hops_seen: Vec<u64>,
    /// Source send → sink application receive.
    pub end_to_end: Snapshot,
    pub hist_scale: Option<Scale>,
    pub elapsed_ns: u64,
}

struct SinkEnts {
    msg: &'static Entity,
}

/// Receive messages until stopped, one trace record each.
pub fn sink(sock: Udp, flow: u32, stop: Arc<AtomicBool>) -> SinkResult {
    let e = SinkEnts {
        msg: register(
            "pipe",
            "message",
            Kind::Event,
            "a message at the sink (tag: seq); payload: seq u64, scheduled, sent (source), then per node kernel RX, application RX, send, then the sink's kernel RX and application RX (i64 CLOCK_REALTIME ns)",
            None,
        )
        .expect("entity"),
    };
    loopscope_trace::prepare_thread();
    let mut e2e = hist();
    let mut r = SinkResult { hist_scale: Some(e2e.scale), ..Default::default() };
    let mut flow_acc: Option<Flow> = None;
    let mut buf = vec![0u8; 65536];
    let mut ctrl = [0u8; 256];
    let mut payload: Vec<u8> = Vec::with_capacity(1024);
    let t0 = mono_ns();
    while !stop.load(Ordering::Relaxed) {
        let Some((len, krx, trunc)) = recv_one(&sock, &mut buf, &mut ctrl) else { continue };
        let urx = realtime_ns();
        r.received += 1;
        if trunc {
            r.truncated += 1;
            continue;
        }
        let Some((h, hops)) = read_message(&buf[..len]) else {
            r.malformed += 1;
            continue;
        };
        if h.flow != flow {
            r.malformed += 1;
            continue;
        }
        if krx == 0 {
            r.no_kernel_ts += 1;
        }
        if r.hops_seen.len() <= hops {
            r.hops_seen.resize(hops + 1, 0);
        }
        r.hops_seen[hops] += 1;
        match flow_acc.as_mut() {
            Some(f) => {
                if f.add(h.seq) == Arrival::Duplicate {
                    continue;
                }
            }
            None => flow_acc = Some(Flow::new(h.seq)),
        }
        e2e.add(urx - h.sent_ns);
        payload.clear();
        payload.extend_from_slice(&h.seq.to_le_bytes());
        payload.extend_from_slice(&h.sched_ns.to_le_bytes());
        payload.extend_from_slice(&h.sent_ns.to_le_bytes());
        payload.extend_from_slice(&buf[FIRST_HOP..FIRST_HOP + hops * HOP]);
        payload.extend_from_slice(&krx.to_le_bytes());
        payload.extend_from_slice(&urx.to_le_bytes());
        e.msg.event_payload(h.seq as u32, &payload);
    }
    r.elapsed_ns = (mono_ns() - t0) as u64;
    r.end_to_end = e2e.snapshot();
    if let Some(f) = flow_acc {
        r.unique = f.unique;
        r.lost = f.lost();
        r.duplicates = f.duplicates;
        r.reordered = f.reordered;
        r.first_seq = f.first_seq;
        r.max_seq = f.max_seq;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hops_are_appended_in_order_and_read_back() {
        let n = FIRST_HOP + 2 * HOP;
        let mut b = vec![0u8; n];
        write_message(&mut b, 3, 42, 100, 101);
        assert!(append_hop(&mut b, n, 1, 2, 3));
        assert!(append_hop(&mut b, n, 4, 5, 6));
        let (h, hops) = read_message(&b).unwrap();
        assert_eq!((h.flow, h.seq, h.sched_ns, h.sent_ns, hops), (3, 42, 100, 101, 2));
        assert_eq!(hop(&b, 0), (1, 2, 3));
        assert_eq!(hop(&b, 1), (4, 5, 6));
    }

    #[test]
    fn a_full_message_refuses_another_hop() {
        let n = FIRST_HOP + HOP;
        let mut b = vec![0u8; n];
        write_message(&mut b, 1, 0, 0, 0);
        assert!(append_hop(&mut b, n, 1, 2, 3));
        assert!(!append_hop(&mut b, n, 4, 5, 6));
    }

    #[test]
    fn other_packets_are_not_pipeline_messages() {
        let mut b = vec![0u8; 100];
        Header { kind: super::super::packet::DATA, ..Default::default() }.write(&mut b);
        assert!(read_message(&b).is_none());
    }
}
