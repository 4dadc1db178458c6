//! The datagrams loopscope's network probes exchange.
//!
//! Every datagram starts with a 48-byte header (little-endian), the rest is
//! padding up to the requested size:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `LSPK` |
//! | 4 | 1 | version (1) |
//! | 5 | 1 | kind: 1 data, 2 request, 3 response |
//! | 6 | 2 | header length (48) |
//! | 8 | 4 | flow id |
//! | 12 | 4 | sending worker |
//! | 16 | 8 | sequence number |
//! | 24 | 8 | scheduled send time, CLOCK_REALTIME ns |
//! | 32 | 8 | actual send time (just before the send call), CLOCK_REALTIME ns |
//! | 40 | 8 | reserved (0) |
//!
//! A response echoes the request's header (kind 3) and appends 24 bytes: the
//! server's kernel RX timestamp of the request, its user receive time and its
//! user send time (CLOCK_REALTIME ns). Anything else arriving on a probe's
//! socket is counted as malformed and ignored.

pub const MAGIC: [u8; 4] = *b"LSPK";
pub const VERSION: u8 = 1;
pub const HEADER: usize = 48;
pub const RESPONSE: usize = HEADER + 24;

pub const DATA: u8 = 1;
pub const REQUEST: u8 = 2;
pub const REPLY: u8 = 3;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    pub flow: u32,
    pub worker: u32,
    pub seq: u64,
    pub sched_ns: i64,
    pub sent_ns: i64,
}

impl Header {
    pub fn write(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.kind;
        b[6..8].copy_from_slice(&(HEADER as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.flow.to_le_bytes());
        b[12..16].copy_from_slice(&self.worker.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.sched_ns.to_le_bytes());
        b[32..40].copy_from_slice(&self.sent_ns.to_le_bytes());
        b[40..48].fill(0);
    }

    /// Write only the actual send time into an already-written header.
    #[inline]
    pub fn stamp_sent(b: &mut [u8], sent_ns: i64) {
        b[32..40].copy_from_slice(&sent_ns.to_le_bytes());
    }

    /// Parse a datagram; None when it is not one of ours.
    pub fn read(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER || b[0..4] != MAGIC || b[4] != VERSION || u16::from_le_bytes([b[6], b[7]]) as usize != HEADER {
            return None;
        }
        let kind = b[5];
        if !(DATA..=REPLY).contains(&kind) || (kind == REPLY && b.len() < RESPONSE) {
            return None;
        }
        let u32at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let i64at = |i: usize| i64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Some(Header { kind, flow: u32at(8), worker: u32at(12), seq: i64at(16) as u64, sched_ns: i64at(24), sent_ns: i64at(32) })
    }
}

/// The server's times appended to a response.
pub fn reply_times(b: &[u8]) -> (i64, i64, i64) {
    let i64at = |i: usize| i64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    (i64at(HEADER), i64at(HEADER + 8), i64at(HEADER + 16))
}

pub fn write_reply_times(b: &mut [u8], krx: i64, urx: i64, utx: i64) {
    b[HEADER..HEADER + 8].copy_from_slice(&krx.to_le_bytes());
    b[HEADER + 8..HEADER + 16].copy_from_slice(&urx.to_le_bytes());
    b[HEADER + 16..HEADER + 24].copy_from_slice(&utx.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_survives_the_wire() {
        let h = Header { kind: DATA, flow: 7, worker: 2, seq: 1 << 40, sched_ns: 123, sent_ns: -5 };
        let mut b = vec![0u8; 100];
        h.write(&mut b);
        assert_eq!(Header::read(&b), Some(h));
        Header::stamp_sent(&mut b, 99);
        assert_eq!(Header::read(&b).unwrap().sent_ns, 99);
    }

    #[test]
    fn foreign_and_short_datagrams_are_refused() {
        assert_eq!(Header::read(b"hello world"), None);
        let mut b = vec![0u8; HEADER];
        Header { kind: DATA, ..Default::default() }.write(&mut b);
        b[4] = 9;
        assert_eq!(Header::read(&b), None);
        let mut r = vec![0u8; HEADER];
        Header { kind: REPLY, ..Default::default() }.write(&mut r);
        assert_eq!(Header::read(&r), None, "a reply needs its server times");
    }
}
