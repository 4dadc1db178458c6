//! trace-cmd's `trace.dat` files, versions 6 and 7, read for their event
//! descriptions and their per-CPU ring-buffer pages.
//!
//! A file starts with a magic, its version, the byte order, the size of a
//! `long` and the page size. Version 6 then lays the metadata out in one fixed
//! order (header_page, header_event, ftrace formats, event formats, kallsyms,
//! printk formats, saved command lines, the CPU count, options) and ends with
//! `flyrecord` and one (offset, size) of page data per CPU. Version 7 names a
//! compression algorithm, points at a chain of option sections, and each
//! option points at a section of its own (each may be compressed); the page
//! data of each buffer is named by a BUFFER option and, when compressed, is a
//! run of chunks (compressed size, uncompressed size, data).
//!
//! `perf.data`'s TRACING_DATA feature holds the same metadata as version 6 up
//! to the command lines; [`tracing_data`] reads it for both.
//!
//! Nothing here trusts a size: a size past the file's end, an unknown section
//! or a short read is an error naming the offset and what was being read. The
//! pages themselves are read a few at a time ([`CpuStream`]), so memory is
//! bounded by a chunk, not by the file.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;

pub const MAGIC: &[u8; 10] = b"\x17\x08\x44tracing";

/// The most CPUs a Linux machine has (the kernel's largest `NR_CPUS`): a
/// file naming a CPU past it is damaged. (Columns and per-CPU tables are
/// indexed by CPU: a damaged id must not size them.)
pub const MAX_CPUS: u32 = 8192;

/// `cpu`, when a machine can have it.
fn cpu_id(cpu: u32, what: &str) -> R<u32> {
    if cpu >= MAX_CPUS {
        return Err(FileError(format!("{what} is {cpu}, past the {MAX_CPUS} CPUs a Linux machine can have: the file is damaged")));
    }
    Ok(cpu)
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FileError(pub String);

type R<T> = Result<T, FileError>;

fn err<T>(s: impl Into<String>) -> R<T> {
    Err(FileError(s.into()))
}

/// How a file's (or section's) data is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Zstd,
    Zlib,
}

impl Codec {
    fn named(name: &str) -> R<Option<Codec>> {
        match name {
            "none" | "" => Ok(None),
            "zstd" => Ok(Some(Codec::Zstd)),
            "zlib" => Ok(Some(Codec::Zlib)),
            other => err(format!("its data is compressed with {other:?}, which loopscope does not read (zstd and zlib are read); `trace-cmd convert --compression none` writes an uncompressed copy")),
        }
    }

    pub fn decompress(self, data: &[u8], size: usize) -> R<Vec<u8>> {
        match self {
            Codec::Zstd => zstd::bulk::decompress(data, size).map_err(|e| FileError(format!("a zstd chunk does not decompress: {e}"))),
            Codec::Zlib => {
                let mut out = Vec::with_capacity(size);
                flate2::read::ZlibDecoder::new(data).read_to_end(&mut out).map_err(|e| FileError(format!("a zlib chunk does not decompress: {e}")))?;
                Ok(out)
            }
        }
    }
}

/// One CPU's page data in the file.
#[derive(Debug, Clone)]
pub struct CpuData {
    pub cpu: i32,
    pub offset: u64,
    pub size: u64,
}

/// One buffer (trace instance) of recorded pages.
#[derive(Debug, Clone, Default)]
pub struct Buffer {
    pub name: String,
    pub clock: Option<String>,
    pub page_size: usize,
    pub cpus: Vec<CpuData>,
}

/// What a file says about itself.
#[derive(Debug, Default)]
pub struct Meta {
    pub version: u32,
    pub page_size: usize,
    pub long_size: u8,
    pub compression: Option<Codec>,
    pub header_page: String,
    /// (system, format file text), every event the file describes.
    pub formats: Vec<(String, String)>,
    /// /proc/kallsyms of the recording machine (names a timer's function).
    pub kallsyms: String,
    /// saved_cmdlines: pid → comm.
    pub cmdlines: Vec<(i32, String)>,
    pub clock: Option<String>,
    pub uname: Option<String>,
    pub tool_version: Option<String>,
    pub cpu_count: u32,
    pub cpustats: Vec<String>,
    /// The buffers with page data; the first is the one imported (the one with the most data).
    pub buffers: Vec<Buffer>,
    /// A time the recorder adds to every stamp (OFFSET option), in ns.
    pub offset_ns: i64,
    /// TSC2NSEC: (mult, shift, offset) when stamps are in cycles.
    pub tsc2nsec: Option<(u32, u32, u64)>,
    /// Optional metadata that did not read (a damaged section), each said; what needs it goes without.
    pub damage: Vec<String>,
}

/// A cursor over bytes in memory (a section, a feature) or over the file.
trait Src {
    fn bytes(&mut self, n: usize, what: &str) -> R<Vec<u8>>;
    fn skip(&mut self, n: u64, what: &str) -> R<()>;
    fn cstr(&mut self, what: &str) -> R<String>;
    fn u16(&mut self, what: &str) -> R<u16> {
        Ok(u16::from_le_bytes(self.bytes(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &str) -> R<u32> {
        Ok(u32::from_le_bytes(self.bytes(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> R<u64> {
        Ok(u64::from_le_bytes(self.bytes(8, what)?.try_into().unwrap()))
    }
    fn text(&mut self, n: u64, what: &str) -> R<String> {
        let n = usize::try_from(n).map_err(|_| FileError(format!("{what}: a size of {n} bytes")))?;
        Ok(String::from_utf8_lossy(&self.bytes(n, what)?).into_owned())
    }
}

pub struct Mem<'a> {
    b: &'a [u8],
    pos: usize,
    name: &'a str,
}

impl<'a> Mem<'a> {
    pub fn new(b: &'a [u8], name: &'a str) -> Self {
        Mem { b, pos: 0, name }
    }
}

impl Src for Mem<'_> {
    fn bytes(&mut self, n: usize, what: &str) -> R<Vec<u8>> {
        match self.b.get(self.pos..self.pos.saturating_add(n)) {
            Some(s) => {
                self.pos += n;
                Ok(s.to_vec())
            }
            None => {
                err(format!("{} is cut short: {what} needs {n} bytes at offset {}, {} are left", self.name, self.pos, self.b.len().saturating_sub(self.pos)))
            }
        }
    }
    fn skip(&mut self, n: u64, what: &str) -> R<()> {
        if self.pos as u64 + n > self.b.len() as u64 {
            return err(format!("{} is cut short: {what} needs {n} bytes at offset {}", self.name, self.pos));
        }
        self.pos += n as usize;
        Ok(())
    }
    fn cstr(&mut self, what: &str) -> R<String> {
        let rest = &self.b[self.pos.min(self.b.len())..];
        let Some(end) = rest.iter().position(|&c| c == 0) else { return err(format!("{} is cut short inside {what}", self.name)) };
        self.pos += end + 1;
        Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
    }
}

struct Disk<'a> {
    f: &'a File,
    pos: u64,
    len: u64,
}

impl Src for Disk<'_> {
    fn bytes(&mut self, n: usize, what: &str) -> R<Vec<u8>> {
        if self.pos + n as u64 > self.len {
            return err(format!("the file is cut short: {what} needs {n} bytes at offset {}, the file has {}", self.pos, self.len));
        }
        let mut v = vec![0u8; n];
        self.f.read_exact_at(&mut v, self.pos).map_err(|e| FileError(format!("reading {what} at offset {}: {e}", self.pos)))?;
        self.pos += n as u64;
        Ok(v)
    }
    fn skip(&mut self, n: u64, what: &str) -> R<()> {
        if self.pos + n > self.len {
            return err(format!("the file is cut short: {what} needs {n} bytes at offset {}, the file has {}", self.pos, self.len));
        }
        self.pos += n;
        Ok(())
    }
    fn cstr(&mut self, what: &str) -> R<String> {
        let mut out = Vec::new();
        loop {
            let mut b = [0u8; 64];
            let n = self.f.read_at(&mut b, self.pos).map_err(|e| FileError(format!("reading {what}: {e}")))?;
            if n == 0 {
                return err(format!("the file is cut short inside {what}"));
            }
            if let Some(end) = b[..n].iter().position(|&c| c == 0) {
                out.extend_from_slice(&b[..end]);
                self.pos += end as u64 + 1;
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(&b[..n]);
            self.pos += n as u64;
            if out.len() > 4096 {
                return err(format!("{what} at offset {} is not a string", self.pos));
            }
        }
    }
}

fn expect(s: &mut dyn Src, tag: &[u8], what: &str) -> R<()> {
    let b = s.bytes(tag.len(), what)?;
    if b != tag {
        return err(format!("{what}: expected {:?}, found {:?}", String::from_utf8_lossy(tag), String::from_utf8_lossy(&b)));
    }
    Ok(())
}

fn header_info(s: &mut dyn Src, m: &mut Meta) -> R<()> {
    expect(s, b"header_page\0", "the header_page description")?;
    let n = s.u64("header_page's size")?;
    m.header_page = s.text(n, "header_page")?;
    expect(s, b"header_event\0", "the header_event description")?;
    let n = s.u64("header_event's size")?;
    s.skip(n, "header_event")
}

fn ftrace_formats(s: &mut dyn Src, m: &mut Meta) -> R<()> {
    let count = s.u32("the count of ftrace formats")?;
    for _ in 0..count {
        let n = s.u64("an ftrace format's size")?;
        m.formats.push(("ftrace".into(), s.text(n, "an ftrace format")?));
    }
    Ok(())
}

fn event_formats(s: &mut dyn Src, m: &mut Meta) -> R<()> {
    let systems = s.u32("the count of event systems")?;
    for _ in 0..systems {
        let sys = s.cstr("an event system's name")?;
        let count = s.u32("the count of a system's events")?;
        for _ in 0..count {
            let n = s.u64("an event format's size")?;
            m.formats.push((sys.clone(), s.text(n, &format!("a {sys} event format"))?));
        }
    }
    Ok(())
}

fn cmdlines(text: &str) -> Vec<(i32, String)> {
    text.lines()
        .filter_map(|l| {
            let (p, c) = l.trim().split_once(' ')?;
            Some((p.parse().ok()?, c.to_string()))
        })
        .collect()
}

/// The initial bytes: magic, version, byte order, long size, page size.
fn initial(s: &mut dyn Src, m: &mut Meta) -> R<()> {
    let magic = s.bytes(10, "the magic")?;
    if magic != MAGIC {
        return err("not a trace-cmd trace.dat file (its first bytes are not trace-cmd's magic)");
    }
    let v = s.cstr("the version")?;
    m.version = v.trim_start_matches("0.").parse().map_err(|_| FileError(format!("a version {v:?} that is not a number")))?;
    let endian = s.bytes(2, "the byte order and long size")?;
    if endian[0] != 0 {
        return err("a big-endian recording: loopscope reads little-endian files only");
    }
    m.long_size = endian[1];
    m.page_size = s.u32("the page size")? as usize;
    if !(1024..=1 << 20).contains(&m.page_size) {
        return err(format!("a page size of {} bytes", m.page_size));
    }
    Ok(())
}

/// perf.data's TRACING_DATA feature: the event descriptions and command lines.
pub fn tracing_data(b: &[u8]) -> R<Meta> {
    let mut m = Meta::default();
    let s = &mut Mem::new(b, "perf.data's tracing data");
    initial(s, &mut m)?;
    header_info(s, &mut m)?;
    ftrace_formats(s, &mut m)?;
    event_formats(s, &mut m)?;
    let n = s.u32("kallsyms' size")?;
    m.kallsyms = s.text(n as u64, "kallsyms")?;
    let n = s.u32("printk formats' size")?;
    s.skip(n as u64, "printk formats")?;
    if let Ok(n) = s.u64("the command lines' size") {
        m.cmdlines = cmdlines(&s.text(n, "the command lines")?);
    }
    Ok(m)
}

fn option_text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim().to_string()
}

/// The clock a TRACECLOCK option names: the one in brackets when it is the whole trace_clock file.
fn selected_clock(t: &str) -> String {
    match (t.find('['), t.find(']')) {
        (Some(a), Some(b)) if a < b => t[a + 1..b].to_string(),
        _ => t.trim().to_string(),
    }
}

/// The options that mean the same in both versions.
fn common_option(m: &mut Meta, id: u16, b: &[u8]) {
    match id {
        2 => m.cpustats.push(option_text(b)),
        4 => m.clock = Some(selected_clock(&option_text(b))),
        5 => m.uname = Some(option_text(b)),
        7 => m.offset_ns = option_text(b).parse().unwrap_or(0),
        8 if b.len() >= 4 => m.cpu_count = u32::from_le_bytes(b[..4].try_into().unwrap()),
        9 => m.tool_version = Some(option_text(b)),
        14 if b.len() >= 16 => {
            m.tsc2nsec = Some((
                u32::from_le_bytes(b[0..4].try_into().unwrap()),
                u32::from_le_bytes(b[4..8].try_into().unwrap()),
                u64::from_le_bytes(b[8..16].try_into().unwrap()),
            ))
        }
        _ => {}
    }
}

/// Open a trace.dat and read everything but the pages.
pub fn open(f: &File) -> R<Meta> {
    let len = f.metadata().map_err(|e| FileError(format!("cannot stat it: {e}")))?.len();
    let mut m = Meta::default();
    let s = &mut Disk { f, pos: 0, len };
    initial(s, &mut m)?;
    match m.version {
        6 => v6(s, &mut m)?,
        7 => v7(s, &mut m)?,
        v => return err(format!("trace.dat version {v}: loopscope reads versions 6 and 7")),
    }
    for b in &m.buffers {
        for c in &b.cpus {
            if c.offset.saturating_add(c.size) > len {
                return err(format!("the file is cut short: CPU {}'s data runs to byte {} of a {len}-byte file", c.cpu, c.offset + c.size));
            }
        }
    }
    // the buffer with the most data first (the top instance on a tie): it is the one imported
    m.buffers.sort_by_key(|b| (std::cmp::Reverse(b.cpus.iter().map(|c| c.size).sum::<u64>()), !b.name.is_empty()));
    Ok(m)
}

fn v6(s: &mut Disk<'_>, m: &mut Meta) -> R<()> {
    header_info(s, m)?;
    ftrace_formats(s, m)?;
    event_formats(s, m)?;
    let n = s.u32("kallsyms' size")?;
    m.kallsyms = s.text(n as u64, "kallsyms")?;
    let n = s.u32("printk formats' size")?;
    s.skip(n as u64, "printk formats")?;
    let n = s.u64("the command lines' size")?;
    m.cmdlines = cmdlines(&s.text(n, "the command lines")?);
    m.cpu_count = s.u32("the CPU count")?;
    let mut tag = s.bytes(10, "the data's kind")?;
    let mut instances: Vec<(u64, String)> = Vec::new();
    if tag == b"options  \0" {
        loop {
            let id = s.u16("an option's id")?;
            if id == 0 {
                break;
            }
            let n = s.u32("an option's size")?;
            let b = s.bytes(n as usize, "an option")?;
            if id == 3 && b.len() > 8 {
                instances.push((u64::from_le_bytes(b[..8].try_into().unwrap()), option_text(&b[8..])));
            }
            common_option(m, id, &b);
        }
        tag = s.bytes(10, "the data's kind")?;
    }
    match &tag[..] {
        b"flyrecord\0" => {}
        b"latency  \0" => return err("a latency trace (text from the trace file), not recorded events: record with trace-cmd record or extract"),
        _ => return err(format!("the data's kind is {:?}, neither flyrecord nor latency", String::from_utf8_lossy(&tag))),
    }
    let top = v6_cpus(s, m, String::new())?;
    m.buffers.push(top);
    // each instance's buffer: "flyrecord" and its CPUs' (offset, size) at the option's offset;
    // version 6 keeps one clock for the file
    for (off, name) in instances {
        s.pos = off;
        expect(s, b"flyrecord\0", &format!("instance {name}'s data"))?;
        let b = v6_cpus(s, m, name)?;
        m.buffers.push(b);
    }
    Ok(())
}

fn v6_cpus(s: &mut Disk<'_>, m: &Meta, name: String) -> R<Buffer> {
    let mut b = Buffer { name, clock: m.clock.clone(), page_size: m.page_size, cpus: Vec::new() };
    if m.cpu_count > MAX_CPUS {
        return Err(FileError(format!("its CPU count is {}, past the {MAX_CPUS} CPUs a Linux machine can have: the file is damaged", m.cpu_count)));
    }
    for cpu in 0..m.cpu_count {
        let offset = s.u64("a CPU's data offset")?;
        let size = s.u64("a CPU's data size")?;
        b.cpus.push(CpuData { cpu: cpu as i32, offset, size });
    }
    Ok(b)
}

/// A version 7 section at `off`: its id and its (decompressed) contents.
fn section(s: &mut Disk<'_>, off: u64, codec: Option<Codec>) -> R<(u16, Vec<u8>)> {
    s.pos = off;
    let id = s.u16("a section's id")?;
    let flags = s.u16("a section's flags")?;
    s.u32("a section's description")?;
    let size = s.u64("a section's size")?;
    if flags & 1 != 0 {
        let Some(c) = codec else { return err(format!("section {id} at offset {off} is compressed, but the file names no compression")) };
        let csize = s.u32("a compressed section's size")?;
        let usize_ = s.u32("a section's uncompressed size")?;
        let data = s.bytes(csize as usize, "a compressed section")?;
        let body = c.decompress(&data, usize_ as usize).map_err(|e| FileError(format!("section {id} at offset {off}: {}", e.0)))?;
        Ok((id, body))
    } else {
        Ok((id, s.bytes(usize::try_from(size).map_err(|_| FileError("a section too large".into()))?, &format!("section {id}"))?))
    }
}

fn v7(s: &mut Disk<'_>, m: &mut Meta) -> R<()> {
    let name = s.cstr("the compression's name")?;
    let _version = s.cstr("the compression's version")?;
    m.compression = Codec::named(&name)?;
    let mut next = s.u64("the first options section's offset")?;
    let mut seen = std::collections::HashSet::new();
    let mut pointers: Vec<(u16, u64)> = Vec::new();
    while next != 0 {
        if !seen.insert(next) {
            return err(format!("the options sections loop back to offset {next}"));
        }
        let (id, body) = section(s, next, m.compression)?;
        if id != 0 {
            return err(format!("offset {next} should hold an options section, holds section {id}"));
        }
        let o = &mut Mem::new(&body, "an options section");
        loop {
            let id = o.u16("an option's id")?;
            let n = o.u32("an option's size")?;
            let b = o.bytes(n as usize, "an option")?;
            match id {
                0 => {
                    next = b.get(..8).map(|x| u64::from_le_bytes(x.try_into().unwrap())).unwrap_or(0);
                    break;
                }
                3 => m.buffers.push(buffer_option(&b)?),
                16..=21 if b.len() >= 8 => pointers.push((id, u64::from_le_bytes(b[..8].try_into().unwrap()))),
                _ => common_option(m, id, &b),
            }
        }
    }
    for (want, off) in pointers {
        let got = section(s, off, m.compression).and_then(|(id, body)| {
            if id != want {
                return err(format!("option {want} points at offset {off}, which holds section {id}"));
            }
            let b = &mut Mem::new(&body, "a metadata section");
            match id {
                16 => header_info(b, m),
                17 => ftrace_formats(b, m),
                18 => event_formats(b, m),
                19 => {
                    let n = b.u32("kallsyms' size")?;
                    m.kallsyms = b.text(n as u64, "kallsyms")?;
                    Ok(())
                }
                21 => {
                    let n = b.u64("the command lines' size")?;
                    m.cmdlines = cmdlines(&b.text(n, "the command lines")?);
                    Ok(())
                }
                _ => Ok(()),
            }
        });
        match got {
            Ok(()) => {}
            // the kernel's own formats, the symbols and the command lines only name things: without them, less is named
            Err(e) if matches!(want, 17 | 19 | 21) => {
                let what = match want {
                    17 => "the ftrace formats",
                    19 => "kallsyms (timer functions are not named)",
                    _ => "the saved command lines",
                };
                m.damage.push(format!("{what} at offset {off} did not read: {e}"));
            }
            Err(e) => return Err(e),
        }
    }
    if m.header_page.is_empty() {
        return err("it has no header_page description (no HEADER_INFO section)");
    }
    Ok(())
}

fn buffer_option(b: &[u8]) -> R<Buffer> {
    let o = &mut Mem::new(b, "a BUFFER option");
    let _section = o.u64("the buffer's section offset")?;
    let name = o.cstr("the buffer's name")?;
    let clock = o.cstr("the buffer's clock")?;
    let page_size = o.u32("the buffer's page size")? as usize;
    let n = o.u32("the buffer's CPU count")?;
    let mut cpus = Vec::new();
    for _ in 0..n {
        let cpu = cpu_id(o.u32("a CPU's id")?, "a CPU's id")? as i32;
        let offset = o.u64("a CPU's data offset")?;
        let size = o.u64("a CPU's data size")?;
        cpus.push(CpuData { cpu, offset, size });
    }
    Ok(Buffer { name, clock: Some(clock), page_size, cpus })
}

mod stream;
pub use stream::CpuStream;

#[cfg(test)]
mod tests;
