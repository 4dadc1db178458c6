//! The on-disk trace format, shared by the writer and the reader.
//!
//! A trace is a 16-byte file header followed by chunks. Each chunk has a
//! 32-byte header that carries its own CRC-32C and one over its payload, so a
//! reader can skip a damaged chunk, resynchronise on the next intact header
//! (chunks start on 8-byte boundaries), and read every complete chunk of a file
//! cut off mid-write. Metadata chunks hold JSON (rare, self-describing,
//! versionable); data chunks hold binary records written straight from the
//! per-thread buffers. `docs/trace-format.md` documents every field; this
//! module is the single definition both sides compile against.

use serde::{Deserialize, Serialize};

pub const FILE_MAGIC: [u8; 8] = *b"LSTRACE\0";
pub const VERSION_MAJOR: u16 = 1;
pub const VERSION_MINOR: u16 = 0;
pub const FILE_HEADER_LEN: usize = 16;

pub const CHUNK_MAGIC: [u8; 4] = *b"LSCK";
pub const CHUNK_HEADER_LEN: usize = 32;
/// Largest payload a writer produces; readers treat anything larger as damage.
pub const MAX_CHUNK_PAYLOAD: usize = 16 << 20;

/// Size of the blocks per-thread buffers are cut into. A record never crosses
/// a block boundary, so every block start is a record start; a data chunk never
/// spans more than one block.
pub const BLOCK: u64 = 64 * 1024;

/// Chunk types.
pub mod chunk {
    pub const INFO: u8 = 1;
    pub const NAMESPACE: u8 = 2;
    pub const THREADS: u8 = 3;
    pub const CALIBRATION: u8 = 4;
    pub const DATA: u8 = 5;
    pub const DUMP: u8 = 6;
    pub const CONFIG: u8 = 7;
    pub const END: u8 = 8;

    pub fn name(t: u8) -> &'static str {
        match t {
            INFO => "info",
            NAMESPACE => "namespace",
            THREADS => "threads",
            CALIBRATION => "calibration",
            DATA => "data",
            DUMP => "dump",
            CONFIG => "config",
            END => "end",
            _ => "unknown",
        }
    }
}

/// Record types, bits 24..30 of a record's first word.
pub mod rec {
    pub const EVENT: u32 = 1;
    pub const EVENT_VALUE: u32 = 2;
    pub const EVENT_PAYLOAD: u32 = 3;
    pub const INTERVAL: u32 = 4;
    pub const COUNTER: u32 = 5;
    pub const HISTOGRAM: u32 = 6;
    /// The rest of the chunk is padding (written where a record did not fit
    /// before the end of a block).
    pub const PAD: u32 = 0x3f;
    /// Bit 31: the timestamp (and duration) are CLOCK_MONOTONIC ns, not raw.
    pub const MONO_FLAG: u32 = 1 << 31;
    pub const TYPE_SHIFT: u32 = 24;
    pub const TYPE_MASK: u32 = 0x3f;
    pub const ID_MASK: u32 = 0x00ff_ffff;
    /// Largest event payload: a payload record (24 bytes + payload) fills at most one block.
    pub const MAX_PAYLOAD: usize = 65_512;

    /// Counter record tags.
    pub const COUNTER_LOG: u32 = 0;
    pub const COUNTER_RESET: u32 = 1;

    /// The first word of a record: type and id in the low half, tag in the high half.
    #[inline(always)]
    pub const fn word0(ty: u32, id: u32, tag: u32) -> u64 {
        ((ty << TYPE_SHIFT) | id) as u64 | ((tag as u64) << 32)
    }
}

/// Entity kinds, as numbered in namespace chunks and the C header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Event = 1,
    Interval = 2,
    Counter = 3,
    Histogram = 4,
}

impl Kind {
    pub fn from_u32(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Event,
            2 => Kind::Interval,
            3 => Kind::Counter,
            4 => Kind::Histogram,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Event => "event",
            Kind::Interval => "interval",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }
    /// Whether a record type may be logged for an entity of this kind.
    pub fn accepts(self, ty: u32) -> bool {
        match self {
            Kind::Event => matches!(ty, rec::EVENT | rec::EVENT_VALUE | rec::EVENT_PAYLOAD),
            Kind::Interval => ty == rec::INTERVAL,
            Kind::Counter => ty == rec::COUNTER,
            Kind::Histogram => ty == rec::HISTOGRAM,
        }
    }
}

/// Chunk header, 32 bytes little-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub ty: u8,
    pub flags: u8,
    pub stream: u16,
    pub thread: u32,
    pub len: u32,
    pub payload_crc: u32,
    /// Data chunks: records this thread dropped in this stream since its
    /// previous data chunk (buffer full). Zero for other chunk types.
    pub lost: u64,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        b[0..4].copy_from_slice(&CHUNK_MAGIC);
        b[4] = self.ty;
        b[5] = self.flags;
        b[6..8].copy_from_slice(&self.stream.to_le_bytes());
        b[8..12].copy_from_slice(&self.thread.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.payload_crc.to_le_bytes());
        b[20..28].copy_from_slice(&self.lost.to_le_bytes());
        let hc = crc32c::crc32c(&b[0..28]);
        b[28..32].copy_from_slice(&hc.to_le_bytes());
        b
    }

    /// Decode a header; `None` when the magic or the header CRC is wrong.
    pub fn decode(b: &[u8]) -> Option<ChunkHeader> {
        if b.len() < CHUNK_HEADER_LEN || b[0..4] != CHUNK_MAGIC {
            return None;
        }
        let hc = u32::from_le_bytes(b[28..32].try_into().unwrap());
        if crc32c::crc32c(&b[0..28]) != hc {
            return None;
        }
        Some(ChunkHeader {
            ty: b[4],
            flags: b[5],
            stream: u16::from_le_bytes(b[6..8].try_into().unwrap()),
            thread: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            len: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            payload_crc: u32::from_le_bytes(b[16..20].try_into().unwrap()),
            lost: u64::from_le_bytes(b[20..28].try_into().unwrap()),
        })
    }
}

pub fn file_header() -> [u8; FILE_HEADER_LEN] {
    let mut b = [0u8; FILE_HEADER_LEN];
    b[0..8].copy_from_slice(&FILE_MAGIC);
    b[8..10].copy_from_slice(&VERSION_MAJOR.to_le_bytes());
    b[10..12].copy_from_slice(&VERSION_MINOR.to_le_bytes());
    b[12..16].copy_from_slice(&(FILE_HEADER_LEN as u32).to_le_bytes());
    b
}

/// Append one chunk (header + payload padded to 8 bytes) to `out`.
pub fn push_chunk(out: &mut Vec<u8>, mut h: ChunkHeader, payload: &[u8]) {
    let pad = (8 - payload.len() % 8) % 8;
    h.len = (payload.len() + pad) as u32;
    let mut crc = crc32c::crc32c(payload);
    if pad > 0 {
        crc = crc32c::crc32c_append(crc, &[0u8; 8][..pad]);
    }
    h.payload_crc = crc;
    out.extend_from_slice(&h.encode());
    out.extend_from_slice(payload);
    out.extend_from_slice(&[0u8; 8][..pad]);
}

/// Append a JSON metadata chunk. JSON payloads are padded with spaces, which
/// JSON treats as whitespace.
pub fn push_json<T: Serialize>(out: &mut Vec<u8>, ty: u8, stream: u16, thread: u32, v: &T) {
    let mut s = serde_json::to_vec(v).expect("metadata serialises");
    while s.len() % 8 != 0 {
        s.push(b' ');
    }
    push_chunk(out, ChunkHeader { ty, flags: 0, stream, thread, len: 0, payload_crc: 0, lost: 0 }, &s);
}

// ---- metadata chunk payloads -------------------------------------------------

/// INFO chunk: one per file, first.
#[derive(Clone, Debug, Serialize, Deserialize, Default)]
pub struct Info {
    pub format: String,
    pub version: [u16; 2],
    pub writer: String,
    pub host: String,
    pub pid: u32,
    pub process: String,
    pub clock: String,
    pub clock_reason: String,
    /// Raw ticks per second estimated at open (1e9 for the mono clock).
    pub raw_hz: f64,
    pub start_mono_ns: u64,
    pub start_realtime_ns: u64,
    pub streams: Vec<StreamInfo>,
    #[serde(default)]
    pub block_bytes: u64,
    /// `"mlockall"` when the process's memory was locked at open because
    /// `LOOPSCOPE_MLOCKALL=1` asked for it, `"mlockall failed: …"` when the
    /// kernel refused; absent when nobody asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_locked: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StreamInfo {
    pub id: u16,
    pub name: String,
    /// "normal" or "ring".
    pub kind: String,
    pub groups: Vec<String>,
    pub buffer_bytes: u64,
}

/// One entry of a NAMESPACE chunk.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EntityInfo {
    pub id: u32,
    pub group: String,
    pub name: String,
    pub kind: Kind,
    #[serde(default)]
    pub desc: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram: Option<crate::hist::Scale>,
}

/// One entry of a THREADS chunk.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ThreadInfo {
    pub index: u32,
    pub tid: u32,
    pub name: String,
}

/// A DUMP chunk announces that the following data chunks of `stream` are a
/// flight-recorder dump.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DumpInfo {
    pub stream: u16,
    pub dump: u32,
    pub tag: u32,
    pub trigger_raw: u64,
    /// Bytes of older records the ring had already overwritten, per thread.
    pub overwritten_bytes: u64,
}

/// A CONFIG chunk records a run-time change of which groups a stream logs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ConfigChange {
    pub raw: u64,
    pub stream: u16,
    pub group: String,
    pub enabled: bool,
}

/// The END chunk: totals written at close.
#[derive(Clone, Debug, Serialize, Deserialize, Default, PartialEq)]
pub struct End {
    pub end_mono_ns: u64,
    pub bytes_written: u64,
    pub lost_records: u64,
    pub lost_by_stream: Vec<u64>,
    pub dumps: u32,
    #[serde(default)]
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_header_survives_encoding() {
        let h = ChunkHeader { ty: chunk::DATA, flags: 3, stream: 2, thread: 7, len: 64, payload_crc: 9, lost: 11 };
        assert_eq!(ChunkHeader::decode(&h.encode()), Some(h));
    }

    #[test]
    fn a_flipped_header_bit_is_detected() {
        let h = ChunkHeader { ty: chunk::DATA, flags: 0, stream: 0, thread: 1, len: 64, payload_crc: 9, lost: 0 };
        let mut b = h.encode();
        b[13] ^= 0x10;
        assert_eq!(ChunkHeader::decode(&b), None);
    }

    #[test]
    fn json_chunks_are_padded_to_eight_bytes() {
        let mut out = Vec::new();
        push_json(&mut out, chunk::CONFIG, 0, 0, &ConfigChange { raw: 1, stream: 0, group: "g".into(), enabled: true });
        assert_eq!(out.len() % 8, 0);
        let h = ChunkHeader::decode(&out).unwrap();
        assert_eq!(h.len as usize, out.len() - CHUNK_HEADER_LEN);
        assert_eq!(crc32c::crc32c(&out[CHUNK_HEADER_LEN..]), h.payload_crc);
    }
}
