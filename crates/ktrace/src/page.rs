//! One ring-buffer page: its header, its compressed event headers, its losses.
//!
//! A page (`trace_pipe_raw` gives one per read) starts with the time of its
//! first event and a commit word: the bytes of data in the low bits, and two
//! flags in bits 31 and 30: events were dropped before this page, and their
//! count is stored after the data. Then come events, each behind a 32-bit
//! header: 5 bits of type, 27 bits of time delta from the previous one. Type
//! 1–28 is a record of that many 4-byte words; 0 a record whose length is in
//! the next word; 29 padding (a discarded record, or the empty rest of the
//! page); 30 a time extend (the delta's upper bits); 31 an absolute stamp.

use crate::format::PageLayout;

pub const MISSED_EVENTS: u64 = 1 << 31;
pub const MISSED_STORED: u64 = 1 << 30;
const LEN_MASK: u64 = (1 << 27) - 1;
const TS_MSB: u64 = 0xf8 << 56;

/// What dropped before a page: nothing, some (unknown count) or a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    None,
    Unknown,
    Count(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub t_ns: u64,
    pub data: &'a [u8],
}

#[derive(Debug)]
pub struct Page<'a> {
    pub ts: u64,
    pub missed: Missed,
    pub records: Vec<Record<'a>>,
    /// Why the walk stopped early (the rest of the page is lost), if it did.
    pub damaged: Option<String>,
}

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    b.get(o..o + 4).map(|s| u32::from_le_bytes(s.try_into().unwrap()))
}

fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    b.get(o..o + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap()))
}

/// Walk one page. Never panics: a page cut short or with a length past its
/// end keeps the records before the fault and says why in `damaged`.
pub fn walk<'a>(buf: &'a [u8], l: &PageLayout) -> Page<'a> {
    let mut p = Page { ts: 0, missed: Missed::None, records: Vec::new(), damaged: None };
    let (Some(ts), Some(commit)) =
        (u64_at(buf, l.ts_off), if l.commit_size == 8 { u64_at(buf, l.commit_off) } else { u32_at(buf, l.commit_off).map(u64::from) })
    else {
        p.damaged = Some(format!("a page of {} bytes has no complete header", buf.len()));
        return p;
    };
    p.ts = ts;
    let len = (commit & LEN_MASK) as usize;
    let data = match buf.get(l.data_off..l.data_off + len) {
        Some(d) => d,
        None => {
            p.damaged = Some(format!("the page says {len} bytes of data; {} are there", buf.len().saturating_sub(l.data_off)));
            &buf[l.data_off.min(buf.len())..]
        }
    };
    if commit & MISSED_EVENTS != 0 {
        p.missed = if commit & MISSED_STORED != 0 {
            match u64_at(buf, l.data_off + len) {
                Some(n) => Missed::Count(n),
                None => Missed::Unknown,
            }
        } else {
            Missed::Unknown
        };
    }
    read_records(data, ts, &mut p);
    p
}

/// The records of a page's data, from the page's time stamp on: each
/// record's time is its delta added to the one before (time extends and
/// absolute stamps included); where a record runs past the data, the page is
/// marked damaged and the walk stops.
#[inline]
fn read_records<'a>(data: &'a [u8], ts: u64, p: &mut Page<'a>) {
    let mut t = ts;
    let mut o = 0usize;
    while o + 4 <= data.len() {
        let h = u32_at(data, o).unwrap();
        let kind = h & 31;
        let delta = u64::from(h >> 5);
        match kind {
            29 => {
                // Padding: the empty rest of the page (no delta, no length),
                // or a discarded record that keeps its time delta.
                let Some(n) = u32_at(data, o + 4) else { break };
                if delta == 0 && n == 0 {
                    break;
                }
                t = t.wrapping_add(delta);
                o += 4 + n as usize;
            }
            30 => {
                let Some(n) = u32_at(data, o + 4) else {
                    p.damaged = Some("a time extend cut short".into());
                    break;
                };
                t = t.wrapping_add((u64::from(n) << 27) | delta);
                o += 8;
            }
            31 => {
                let Some(n) = u32_at(data, o + 4) else {
                    p.damaged = Some("an absolute time stamp cut short".into());
                    break;
                };
                t = ((u64::from(n) << 27) | delta) | (t & TS_MSB);
                o += 8;
            }
            0 => {
                let Some(n) = u32_at(data, o + 4) else {
                    p.damaged = Some("a long record's length cut short".into());
                    break;
                };
                let n = n as usize;
                if n < 4 || o + 4 + n > data.len() {
                    p.damaged = Some(format!("a record of {n} bytes runs past the page's end"));
                    break;
                }
                t = t.wrapping_add(delta);
                p.records.push(Record { t_ns: t, data: &data[o + 8..o + 4 + n] });
                o += 4 + n;
            }
            n => {
                let n = n as usize * 4;
                if o + 4 + n > data.len() {
                    p.damaged = Some(format!("a record of {n} bytes runs past the page's end"));
                    break;
                }
                t = t.wrapping_add(delta);
                p.records.push(Record { t_ns: t, data: &data[o + 4..o + 4 + n] });
                o += 4 + n;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A page as the kernel lays it out, for tests: (time delta, payload) records.
    pub(crate) fn page(ts: u64, recs: &[(u32, Vec<u8>)], missed: Option<u64>) -> Vec<u8> {
        let mut data = Vec::new();
        for (d, payload) in recs {
            let mut pl = payload.clone();
            while pl.len() % 4 != 0 {
                pl.push(0);
            }
            if *d >= 1 << 27 {
                data.extend_from_slice(&(30 | ((d & ((1 << 27) - 1)) << 5)).to_le_bytes());
                data.extend_from_slice(&(d >> 27).to_le_bytes());
                data.extend_from_slice(&(((pl.len() / 4) as u32) | 0).to_le_bytes());
            } else {
                data.extend_from_slice(&((pl.len() / 4) as u32 | (d << 5)).to_le_bytes());
            }
            data.extend_from_slice(&pl);
        }
        let mut commit = data.len() as u64;
        let mut out = Vec::new();
        out.extend_from_slice(&ts.to_le_bytes());
        if let Some(n) = missed {
            commit |= MISSED_EVENTS | MISSED_STORED;
            out.extend_from_slice(&commit.to_le_bytes());
            out.extend_from_slice(&data);
            out.extend_from_slice(&n.to_le_bytes());
        } else {
            out.extend_from_slice(&commit.to_le_bytes());
            out.extend_from_slice(&data);
        }
        out.resize(4096, 0);
        out
    }

    #[test]
    fn records_carry_the_sum_of_their_time_deltas() {
        let b = page(1000, &[(0, vec![1; 8]), (5, vec![2; 12]), (7, vec![3; 4])], None);
        let p = walk(&b, &PageLayout::default());
        let ts: Vec<u64> = p.records.iter().map(|r| r.t_ns).collect();
        assert_eq!(ts, vec![1000, 1005, 1012]);
        assert_eq!(p.records[1].data, &[2; 12][..]);
        assert_eq!((p.missed, p.damaged), (Missed::None, None));
    }

    #[test]
    fn a_time_extend_adds_the_upper_bits_of_a_long_gap() {
        let b = page(0, &[(0, vec![1; 4]), ((3 << 27) + 9, vec![2; 4])], None);
        let p = walk(&b, &PageLayout::default());
        assert_eq!(p.records[1].t_ns, (3 << 27) + 9);
    }

    #[test]
    fn a_stored_count_of_dropped_events_is_read_after_the_data() {
        let b = page(5, &[(0, vec![1; 4])], Some(42));
        assert_eq!(walk(&b, &PageLayout::default()).missed, Missed::Count(42));
    }

    #[test]
    fn a_page_cut_short_keeps_what_came_before_and_says_so() {
        let b = page(5, &[(0, vec![1; 8]), (1, vec![2; 40])], None);
        let p = walk(&b[..16 + 12 + 20], &PageLayout::default());
        assert_eq!(p.records.len(), 1);
        assert!(p.damaged.is_some());
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..2000 {
            let mut b = vec![0u8; 256];
            for v in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = x as u8;
            }
            let _ = walk(&b, &PageLayout::default());
            let _ = walk(&b[..(x % 40) as usize], &PageLayout::default());
        }
    }
}
