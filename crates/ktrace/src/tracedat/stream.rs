//! One CPU's page data of a trace.dat, read a chunk (version 7,
//! compressed) or 64 pages (uncompressed) at a time, skipping past damage.

use super::{Codec, CpuData, FileError, R};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// One CPU's pages, read (and decompressed) a chunk at a time. A chunk
/// that does not decompress is skipped, and one whose header does not fit
/// ends the CPU's data there: each is said in `damage` (taken by the
/// reader, which opens a loss window of unknown size on the CPU), never an
/// error that would lose the rest of the file.
pub struct CpuStream {
    pub cpu: i32,
    pos: u64,
    end: u64,
    codec: Option<Codec>,
    chunks_left: u32,
    page: usize,
    buf: Vec<u8>,
    at: usize,
    pub damage: Vec<String>,
    /// A compressed chunk as read, and the zstd context, kept from one chunk to the next.
    raw: Vec<u8>,
    zstd: Option<zstd::bulk::Decompressor<'static>>,
}

/// Pages read at once from an uncompressed file.
const READ_PAGES: usize = 64;

impl CpuStream {
    pub fn new(f: &File, c: &CpuData, page_size: usize, codec: Option<Codec>) -> R<Self> {
        let mut s = CpuStream {
            cpu: c.cpu,
            pos: c.offset,
            end: c.offset + c.size,
            codec,
            chunks_left: 0,
            page: page_size,
            buf: Vec::new(),
            at: 0,
            damage: Vec::new(),
            raw: Vec::new(),
            zstd: None,
        };
        if codec.is_some() && c.size > 0 {
            let mut b = [0u8; 4];
            f.read_exact_at(&mut b, s.pos).map_err(|e| FileError(format!("CPU {}'s chunk count: {e}", c.cpu)))?;
            s.chunks_left = u32::from_le_bytes(b);
            // the size trace-cmd records leaves the chunk count out
            s.pos += 4;
            s.end += 4;
        }
        Ok(s)
    }

    fn fill(&mut self, f: &File) -> R<()> {
        if self.at < self.buf.len() {
            return Ok(());
        }
        self.buf.clear();
        self.at = 0;
        if let Some(codec) = self.codec {
            while self.buf.is_empty() && self.chunks_left > 0 {
                let mut h = [0u8; 8];
                let fits = self.pos + 8 <= self.end && f.read_exact_at(&mut h, self.pos).is_ok();
                let (csize, usize_) = (u32::from_le_bytes(h[..4].try_into().unwrap()) as u64, u32::from_le_bytes(h[4..].try_into().unwrap()) as usize);
                if !fits || self.pos + 8 + csize > self.end {
                    let left = self.chunks_left;
                    self.damage.push(format!("CPU {}'s chunk header at offset {} is damaged: its last {left} chunk(s) are not read", self.cpu, self.pos));
                    self.chunks_left = 0;
                    break;
                }
                self.raw.resize(csize as usize, 0);
                f.read_exact_at(&mut self.raw, self.pos + 8).map_err(|e| FileError(format!("CPU {}'s chunk at offset {}: {e}", self.cpu, self.pos)))?;
                if let Err(e) = self.decompress(codec, usize_) {
                    self.buf.clear();
                    self.damage.push(format!("CPU {}'s chunk at offset {} is skipped: {e}", self.cpu, self.pos));
                }
                self.pos += 8 + csize;
                self.chunks_left -= 1;
            }
        } else {
            let n = ((self.end - self.pos) as usize).min(self.page * READ_PAGES);
            if n == 0 {
                return Ok(());
            }
            self.buf.resize(n, 0);
            f.read_exact_at(&mut self.buf, self.pos).map_err(|e| FileError(format!("CPU {}'s pages at offset {}: {e}", self.cpu, self.pos)))?;
            self.pos += n as u64;
        }
        Ok(())
    }

    /// `raw` into `buf` (`size` bytes, as the chunk's header says): a zstd
    /// chunk with the stream's one context into the buffer of the chunk
    /// before (a context made for every chunk was a tenth of an import).
    fn decompress(&mut self, codec: Codec, size: usize) -> R<()> {
        match codec {
            Codec::Zstd => {
                let z = match &mut self.zstd {
                    Some(z) => z,
                    None => self.zstd.insert(zstd::bulk::Decompressor::new().map_err(|e| FileError(format!("no zstd context: {e}")))?),
                };
                self.buf.clear();
                self.buf.reserve(size);
                // (at most `size` bytes, as a fresh context's `decompress(data, size)` gives)
                z.decompress_to_buffer(&self.raw[..], &mut self.buf).map_err(|e| FileError(format!("a zstd chunk does not decompress: {e}")))?;
                Ok(())
            }
            Codec::Zlib => {
                self.buf = codec.decompress(&self.raw, size)?;
                Ok(())
            }
        }
    }

    /// The time in the next page's header (None: no pages left).
    pub fn front(&mut self, f: &File) -> R<Option<u64>> {
        self.fill(f)?;
        Ok(self.buf.get(self.at..self.at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap())))
    }

    /// The next page (shorter at the end of a CPU's data: the decoder counts it as damaged).
    pub fn take(&mut self) -> &[u8] {
        let a = self.at;
        let b = (a + self.page).min(self.buf.len());
        self.at = b;
        &self.buf[a..b]
    }
}
