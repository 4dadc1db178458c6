//! A segment file's INT32 column chunks encoded here, not by the `parquet`
//! crate's column writer.
//!
//! Thirteen of the capture's seventeen columns are INT32 codes with few
//! distinct values in a row group (CPUs, thread ids, event codes, string
//! indices), dictionary-encoded. The crate's writer interns each value
//! through its generic interner (a hash of the value, then a comparison
//! through its storage) and measures every mini-batch for page limits: a
//! profile of `loopscope import` put a quarter of the CPU in its column
//! writers. Here a row group's values are interned by an open-addressing
//! table of `i32` keys (Fibonacci hashing; a group holds at most `GROUP`
//! distinct values, so half the slots stay free), and the chunk is laid out
//! as the crate lays it out with the same settings: one PLAIN dictionary
//! page (zstd), then Parquet 2.0 data pages of `PAGE_ROWS` rows whose
//! definition levels (uncompressed) precede the indices (zstd unless that
//! does not shrink them), both in Parquet's RLE/bit-packed hybrid, encoded
//! here too (`hybrid`: the crate's encoder is public only under a feature
//! that builds Arrow's crates as well). The pages' headers are
//! written by the crate's page writer and the chunk handed to its row group
//! writer whole (`append_column`), which places it and records its metadata;
//! the INT64 columns still go through the crate's column writer. Readers
//! (polars, DuckDB, the crate's own) see the same kind of file: a test here
//! decodes the hybrid by the format's own rules, one in `segment`'s tests
//! reads every kind of chunk back through the crate's reader, and the store's
//! tests read imported and captured files through polars as before.

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, EncodingMask, PageType};
use parquet::column::page::{CompressedPage, Page, PageWriteSpec, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, PageEncodingStats};
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

/// The least share of a page's indices zstd must save for the chunk's next
/// pages to be compressed too: the codes of task names and priorities,
/// packed into few bits, seldom shrink (a tenth of the writers' zstd time
/// went to pages then stored as they were).
const WORTH: f64 = 0.02;

/// Rows per data page: the crate's 20,000-row page limit, checked after each
/// of its 8,192-value mini-batches, closes pages at 24,576 rows.
pub const PAGE_ROWS: usize = 24_576;
/// log2 of the interning table's slots: twice the most values a row group holds.
const BITS: u32 = 17;
const MASK: usize = (1 << BITS) - 1;

fn perr(e: std::io::Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

/// `v` as an unsigned LEB128 varint (a hybrid run's header).
fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// `vals` bit-packed at `width` bits each (at most 16: a dictionary of a
/// row group's values), least significant bit first, the last group of 8
/// padded with zeros, as one bit-packed run of the hybrid. A group of 8 is
/// `width` bytes, packed in one 128-bit word.
fn packed<T: Copy>(vals: &[T], width: u8, out: &mut Vec<u8>, f: impl Fn(T) -> u32) {
    if vals.is_empty() {
        return;
    }
    let groups = vals.len().div_ceil(8);
    varint((groups as u64) << 1 | 1, out);
    let w = width as usize;
    let word = |g: &mut dyn Iterator<Item = u32>| g.enumerate().fold(0u128, |acc, (k, v)| acc | (v as u128) << (k * w));
    let mut chunks = vals.chunks_exact(8);
    for g in &mut chunks {
        out.extend_from_slice(&word(&mut g.iter().map(|&v| f(v))).to_le_bytes()[..w]);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        out.extend_from_slice(&word(&mut rest.iter().map(|&v| f(v))).to_le_bytes()[..w]);
    }
}

/// `vals` in Parquet's RLE/bit-packed hybrid at `width` bits (at most 16):
/// where a group of 8 (counted from the end of the last RLE run) holds one
/// value, that value's whole run is one RLE run (its count, then the value in
/// `width` rounded up to bytes); the rest is bit-packed in groups of 8.
/// Readers take the count of values from the page, so the last group's
/// padding is not read.
pub fn hybrid<T: Copy + PartialEq>(vals: &[T], width: u8, out: &mut Vec<u8>, f: impl Fn(T) -> u32 + Copy) {
    debug_assert!(width <= 16);
    let (n, bytes) = (vals.len(), (width as usize).div_ceil(8));
    let (mut start, mut i) = (0, 0); // the pending bit-packed values are vals[start..i], whole groups
    while i + 8 <= n {
        let v = vals[i];
        if vals[i + 1..i + 8].iter().all(|&x| x == v) {
            let run = 8 + vals[i + 8..].iter().take_while(|&&x| x == v).count();
            packed(&vals[start..i], width, out, f);
            varint((run as u64) << 1, out);
            out.extend_from_slice(&f(v).to_le_bytes()[..bytes]);
            i += run;
            start = i;
        } else {
            i += 8;
        }
    }
    packed(&vals[start..n], width, out, f);
}

/// Where a chunk's pages went: sizes as the column's metadata sums them.
#[derive(Default)]
struct Placed {
    compressed: i64,
    uncompressed: i64,
    written: u64,
    dict_at: i64,
    data_at: Option<i64>,
    pages: i32,
}

impl Placed {
    fn add(&mut self, spec: PageWriteSpec) {
        self.compressed += spec.compressed_size as i64;
        self.uncompressed += spec.uncompressed_size as i64;
        self.written += spec.bytes_written;
        if spec.page_type == PageType::DICTIONARY_PAGE {
            self.dict_at = spec.offset as i64;
        } else {
            self.data_at.get_or_insert(spec.offset as i64);
            self.pages += 1;
        }
    }
}

/// The encoder of one writer thread: its interning table, buffers and zstd
/// context, kept from one column chunk to the next.
pub struct DictWriter {
    /// slot → the key's dictionary index + 1 (0: free)
    slot_idx: Vec<u32>,
    slot_key: Vec<i32>,
    used: Vec<u32>,
    dict: Vec<i32>,
    idx: Vec<u32>,
    zstd: zstd::bulk::Compressor<'static>,
    codec: Compression,
    out: Vec<u8>,
}

impl DictWriter {
    /// A writer compressing at zstd `level` (`codec`: the same, as the file's metadata names it).
    pub fn new(level: i32, codec: Compression) -> Result<Self, ParquetError> {
        Ok(DictWriter {
            slot_idx: vec![0; 1 << BITS],
            slot_key: vec![0; 1 << BITS],
            used: Vec::new(),
            dict: Vec::new(),
            idx: Vec::new(),
            zstd: zstd::bulk::Compressor::new(level).map_err(perr)?,
            codec,
            out: Vec::new(),
        })
    }

    /// Each value's dictionary index into `idx`, the dictionary (in order of first appearance) into `dict`.
    fn intern(&mut self, values: &[i32]) {
        for &s in &self.used {
            self.slot_idx[s as usize] = 0;
        }
        self.used.clear();
        self.dict.clear();
        self.idx.clear();
        self.idx.reserve(values.len());
        for &v in values {
            let mut s = ((v as u32).wrapping_mul(0x9E37_79B1) >> (32 - BITS)) as usize;
            loop {
                let e = self.slot_idx[s];
                if e == 0 {
                    self.dict.push(v);
                    self.slot_idx[s] = self.dict.len() as u32;
                    self.slot_key[s] = v;
                    self.used.push(s as u32);
                    self.idx.push(self.dict.len() as u32 - 1);
                    break;
                }
                if self.slot_key[s] == v {
                    self.idx.push(e - 1);
                    break;
                }
                s = (s + 1) & MASK;
            }
        }
    }

    /// zstd of `raw` into `self.out` (cleared first).
    fn compress(&mut self, raw: &[u8]) -> Result<(), ParquetError> {
        self.out.clear();
        self.out.reserve(zstd::zstd_safe::compress_bound(raw.len()));
        self.zstd.compress_to_buffer(raw, &mut self.out).map_err(perr)?;
        Ok(())
    }

    /// The dictionary page: its values PLAIN (little-endian), zstd.
    fn dictionary_page(&mut self) -> Result<CompressedPage, ParquetError> {
        let plain: Vec<u8> = self.dict.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.compress(&plain)?;
        let page =
            Page::DictionaryPage { buf: Bytes::copy_from_slice(&self.out), num_values: self.dict.len() as u32, encoding: Encoding::PLAIN, is_sorted: false };
        Ok(CompressedPage::new(page, plain.len()))
    }

    /// A data page of `rows` rows: their definition levels `def` (a nullable
    /// column's), then the indices of the `idx` values present among them.
    ///
    /// With `try_zstd` false the indices are stored as they are; the second
    /// value returned says whether zstd shrank them by `WORTH` at least.
    fn data_page(
        &mut self,
        rows: usize,
        def: Option<&[i16]>,
        idx: std::ops::Range<usize>,
        width: u8,
        try_zstd: bool,
    ) -> Result<(CompressedPage, bool), ParquetError> {
        let mut buf = Vec::new();
        if let Some(d) = def {
            hybrid(d, 1, &mut buf, |x| x as u32);
        }
        let levels_len = buf.len();
        let mut indices = vec![width];
        hybrid(&self.idx[idx.clone()], width, &mut indices, |x| x);
        if try_zstd {
            self.compress(&indices)?;
        }
        // the crate's threshold (1.0): the values stay uncompressed unless zstd shrinks the page
        let is_compressed = try_zstd && self.out.len() < indices.len() + levels_len;
        let worth = is_compressed && (self.out.len() as f64) < (1.0 - WORTH) * indices.len() as f64;
        buf.extend_from_slice(if is_compressed { &self.out } else { &indices });
        let page = Page::DataPageV2 {
            buf: buf.into(),
            num_values: rows as u32,
            encoding: Encoding::RLE_DICTIONARY,
            num_nulls: (rows - idx.len()) as u32,
            num_rows: rows as u32,
            def_levels_byte_len: levels_len as u32,
            rep_levels_byte_len: 0,
            is_compressed,
            statistics: None,
        };
        Ok((CompressedPage::new(page, levels_len + indices.len()), worth))
    }

    /// The column chunk of `rows` rows whose present values are `values` (in
    /// row order) and, for a nullable column, whose definition levels are `def`
    /// (1: present): its bytes as they go into the file, and what the row
    /// group writer needs to place them. With `stats`, the chunk's minimum and
    /// maximum (and null count) go into its metadata.
    pub fn chunk(
        &mut self,
        descr: ColumnDescPtr,
        rows: usize,
        values: &[i32],
        def: Option<&[i16]>,
        stats: bool,
    ) -> Result<(Bytes, ColumnCloseResult), ParquetError> {
        if values.len() > 1 << (BITS - 1) {
            return Err(ParquetError::General(format!("{} values in one column chunk: at most {}", values.len(), 1 << (BITS - 1))));
        }
        self.intern(values);
        let width = match self.dict.len() {
            0 | 1 => 0u8,
            n => (u32::BITS - (n as u32 - 1).leading_zeros()) as u8,
        };
        let mut sink = TrackedWrite::new(Vec::with_capacity(values.len() / 2 + 1024));
        let mut at = Placed::default();
        {
            let mut pw = SerializedPageWriter::new(&mut sink);
            at.add(pw.write_page(self.dictionary_page()?)?);
            let (mut v0, mut try_zstd) = (0, true);
            for r0 in (0..rows).step_by(PAGE_ROWS) {
                let r1 = (r0 + PAGE_ROWS).min(rows);
                let d = def.map(|d| &d[r0..r1]);
                let present = d.map_or(r1 - r0, |d| d.iter().filter(|&&x| x > 0).count());
                let (page, worth) = self.data_page(r1 - r0, d, v0..v0 + present, width, try_zstd)?;
                at.add(pw.write_page(page)?);
                // a chunk's first page that zstd did not shrink says its others will not either
                try_zstd &= worth;
                v0 += present;
            }
        }
        let mut meta = ColumnChunkMetaData::builder(descr)
            .set_compression(self.codec)
            .set_encodings_mask(EncodingMask::new_from_encodings([Encoding::PLAIN, Encoding::RLE, Encoding::RLE_DICTIONARY].iter()))
            .set_page_encoding_stats(vec![
                PageEncodingStats { page_type: PageType::DICTIONARY_PAGE, encoding: Encoding::PLAIN, count: 1 },
                PageEncodingStats { page_type: PageType::DATA_PAGE_V2, encoding: Encoding::RLE_DICTIONARY, count: at.pages },
            ])
            .set_total_compressed_size(at.compressed)
            .set_total_uncompressed_size(at.uncompressed)
            .set_num_values(rows as i64)
            .set_data_page_offset(at.data_at.unwrap_or(at.dict_at))
            .set_dictionary_page_offset(Some(at.dict_at));
        if stats {
            let (lo, hi) = (values.iter().min().copied(), values.iter().max().copied());
            let s = ValueStatistics::<i32>::new(lo, hi, None, Some((rows - values.len()) as u64), false).with_backwards_compatible_min_max(true);
            meta = meta.set_statistics(Statistics::Int32(s));
        }
        let bytes = Bytes::from(sink.into_inner()?);
        let close = ColumnCloseResult {
            bytes_written: at.written,
            rows_written: rows as u64,
            metadata: meta.build()?,
            bloom_filter: None,
            column_index: None,
            offset_index: None,
        };
        Ok((bytes, close))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hybrid decoded as the format says (a reference written from the spec, for the test).
    fn decode(b: &[u8], width: u8, n: usize) -> Vec<u32> {
        let (mut out, mut i) = (Vec::new(), 0);
        while out.len() < n {
            let (mut h, mut shift) = (0u64, 0);
            loop {
                h |= ((b[i] & 0x7f) as u64) << shift;
                shift += 7;
                i += 1;
                if b[i - 1] < 0x80 {
                    break;
                }
            }
            if h & 1 == 1 {
                let count = (h >> 1) as usize * 8;
                let mut bit = 0usize;
                for _ in 0..count {
                    let mut v = 0u32;
                    for k in 0..width as usize {
                        v |= (((b[i + (bit + k) / 8] >> ((bit + k) % 8)) & 1) as u32) << k;
                    }
                    bit += width as usize;
                    out.push(v);
                }
                i += count * width as usize / 8;
            } else {
                let bytes = (width as usize).div_ceil(8);
                let mut v = [0u8; 4];
                v[..bytes].copy_from_slice(&b[i..i + bytes]);
                i += bytes;
                out.extend(std::iter::repeat_n(u32::from_le_bytes(v), (h >> 1) as usize));
            }
        }
        out.truncate(n);
        out
    }

    #[test]
    fn the_hybrid_decodes_to_its_values_whatever_the_runs_and_the_width() {
        let mut rnd = crate::segment::xorshift(0x2545_f491_4f6c_dd1du64);
        for width in [0u8, 1, 3, 8, 13, 16] {
            for _ in 0..200 {
                let mut vals = Vec::new();
                while vals.len() < rnd(300) as usize {
                    let v = if width == 0 { 0 } else { rnd(1 << width) as u32 };
                    let longest = if rnd(2) == 0 { 3 } else { 40 };
                    vals.extend(std::iter::repeat_n(v, 1 + rnd(longest) as usize));
                }
                let mut b = Vec::new();
                hybrid(&vals, width, &mut b, |x| x);
                assert_eq!(decode(&b, width, vals.len()), vals, "width {width}");
            }
        }
    }

    #[test]
    fn a_run_that_fills_a_group_is_one_rle_run_from_that_group_on() {
        // 3 values, then 21 of one: 5 of them end the first group, the next group is all 7: an RLE run of the 16 left
        let vals: Vec<u32> = [1, 2, 3].into_iter().chain(std::iter::repeat_n(7, 21)).collect();
        let mut b = Vec::new();
        hybrid(&vals, 3, &mut b, |x| x);
        // one group bit-packed (header 1 << 1 | 1; 3 bits a value, least significant first), then 16 × 7
        assert_eq!(b, vec![0b11, 0b11_010_001, 0b1_111_111_0, 0b111_111_11, 16 << 1, 7]);
    }
}
