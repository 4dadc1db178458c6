//! Recordings made by other tools, decoded into the same columns as
//! loopscope's own capture.
//!
//! - [`TraceDat`]: trace-cmd's `trace.dat`. Each CPU's pages are read a chunk
//!   at a time and handed to the decoder in the order of their page stamps
//!   (a k-way merge over the CPUs), so a batch holds every CPU's events up to
//!   about the same time and memory stays that of a batch. Losses come from
//!   the pages themselves (the kernel's missed-events flags), as for a live
//!   capture; a CPU whose buffer wrapped lost its events from the recording's
//!   first stamp (on any CPU) to its own first one.
//! - [`Perf`]: `perf.data`'s structure (header, attributes, feature
//!   sections) through the linux-perf-data crate. Its records are walked in
//!   file order ([`crate::perfdata`]: the cut sorts them, up to what perf's
//!   rounds say is final) where the layout allows, else read through the
//!   crate's reader, which sorts them by time across its rounds. Each
//!   tracepoint sample's raw payload is the same record the ring buffer
//!   holds, decoded by the same formats (read from the file's TRACING_DATA).
//!   LOST and LOST_SAMPLES records become loss windows on their CPU, from the
//!   last event that reached it to the record.
//!
//! Every format the file describes is decoded (events attribution does not
//! read keep their time, CPU and task), so the count of events is the count
//! of records the recorder's own reader prints. Formats that do not parse are
//! named, and their records counted as unknown.

use crate::decode::Decoder;
use crate::format::{parse, parse_header_page, Format, PageLayout};
use crate::perfdata::{aux_past_end, Layouts, Next, Records, Rounds, Sample, FINISHED_ROUND, LOST, LOST_SAMPLES, SAMPLE, USER_TYPE_START};
use crate::tracedat::{self, CpuStream, FileError, Meta, MAX_CPUS};
use std::fs::File;

type R<T> = Result<T, FileError>;

/// Clocks whose stamps are nanoseconds as they are.
const NS_CLOCKS: [&str; 9] = ["local", "global", "mono", "mono_raw", "boot", "perf", "tai", "uptime", "ns"];

fn formats(list: &[(String, String)]) -> (Vec<Format>, Vec<String>) {
    let (mut ok, mut bad) = (Vec::new(), Vec::new());
    for (sys, text) in list {
        match parse(sys, text) {
            Ok(f) => ok.push(f),
            Err(e) => bad.push(format!("{sys}: {e}")),
        }
    }
    (ok, bad)
}

pub struct TraceDat {
    f: File,
    pub meta: Meta,
    streams: Vec<CpuStream>,
    pub dec: Decoder,
    /// Formats that did not parse (their records count as unknown).
    pub bad_formats: Vec<String>,
    /// Stamps to nanoseconds: (mult, shift, offset) for cycle clocks, then the file's offset.
    tsc: Option<(u32, u32, u64)>,
    pub clock: String,
    /// Damage read past (a chunk skipped, a CPU's data ended early), as said to the user.
    pub damage: Vec<String>,
}

impl TraceDat {
    pub fn open(path: &str) -> R<Self> {
        let f = File::open(path).map_err(|e| FileError(format!("cannot open it: {e}")))?;
        let meta = tracedat::open(&f)?;
        let Some(buf) = meta.buffers.first().cloned() else { return Err(FileError("it holds no recorded pages (no flyrecord buffer)".into())) };
        let clock = buf.clock.clone().or_else(|| meta.clock.clone()).unwrap_or_else(|| "local".into());
        let tsc = if NS_CLOCKS.contains(&clock.as_str()) {
            None
        } else if let Some(t) = meta.tsc2nsec {
            Some(t)
        } else {
            return Err(FileError(format!("its stamps are on the {clock:?} clock, in cycles, and it holds no conversion to nanoseconds (TSC2NSEC): record with -C mono or another clock in ns")));
        };
        let layout = parse_header_page(&meta.header_page).map_err(|e| FileError(format!("its header_page: {e}")))?;
        let (fs, bad_formats) = formats(&meta.formats);
        let page = if buf.page_size > 0 { buf.page_size } else { meta.page_size };
        let mut streams = Vec::new();
        for c in &buf.cpus {
            streams.push(CpuStream::new(&f, c, page, meta.compression)?);
        }
        let mut dec = Decoder::new(layout, fs);
        dec.set_kallsyms(&meta.kallsyms);
        // A CPU whose first page says events were dropped before it (a buffer
        // that wrapped, as a flight recorder's does) lost them from when the
        // recording began, at the first stamp of any CPU, to its own first event.
        let mut firsts = Vec::new();
        for s in streams.iter_mut() {
            if let Some(t) = s.front(&f)? {
                firsts.push((s.cpu, t));
            }
        }
        if let Some(t0) = firsts.iter().map(|x| x.1).min() {
            for (cpu, _) in firsts {
                dec.set_last_time(cpu, t0 as i64);
            }
        }
        let damage = meta.damage.clone();
        Ok(TraceDat { f, meta, streams, dec, bad_formats, tsc, clock, damage })
    }

    /// Decode pages, earliest first across the CPUs, until about `records`
    /// more records are decoded. False when every page has been read.
    pub fn next(&mut self, records: u64) -> R<bool> {
        let goal = self.dec.counts.records + records;
        self.dec.reserve(records as usize + 4096);
        loop {
            let mut best: Option<(u64, usize)> = None;
            for (i, s) in self.streams.iter_mut().enumerate() {
                if let Some(t) = s.front(&self.f)? {
                    if best.is_none_or(|(b, _)| t < b) {
                        best = Some((t, i));
                    }
                }
            }
            self.take_damage();
            let Some((_, i)) = best else {
                // a CPU whose data ended damaged lost what it held from its last event to the recording's end
                if let Some(end) = self.dec.latest() {
                    self.dec.finish(end);
                }
                return Ok(false);
            };
            let s = &mut self.streams[i];
            let cpu = s.cpu;
            let page = s.take();
            let n = page.len();
            self.dec.pages(cpu, page, n.max(1));
            self.take_damage();
            if self.dec.counts.records >= goal {
                return Ok(true);
            }
        }
    }

    /// What the streams found damaged since the last call: said (`damage`)
    /// and, on its CPU, a loss window of unknown size from the last event
    /// before it to the first after it.
    fn take_damage(&mut self) {
        for s in self.streams.iter_mut() {
            for why in s.damage.drain(..) {
                self.dec.damaged(s.cpu);
                self.damage.push(why);
            }
        }
    }

    /// The earliest stamp (in ns) any page not yet decoded can hold: every
    /// event decoded so far before it is in its final place; those at or
    /// after it may have later pages' events between them. None at the end.
    pub fn watermark_ns(&mut self) -> R<Option<i64>> {
        let mut low: Option<u64> = None;
        for s in self.streams.iter_mut() {
            if let Some(t) = s.front(&self.f)? {
                low = Some(low.map_or(t, |l| l.min(t)));
            }
        }
        Ok(low.map(|t| {
            let mut x = [t as i64];
            self.conv().to_ns(&mut x);
            x[0]
        }))
    }

    /// How this file's stamps become nanoseconds.
    pub fn conv(&self) -> Conv {
        Conv { tsc: self.tsc, offset_ns: self.meta.offset_ns }
    }
}

/// Stamps into nanoseconds of the recording's clock: cycles through the
/// file's TSC2NSEC, then the file's OFFSET.
#[derive(Debug, Clone, Copy)]
pub struct Conv {
    tsc: Option<(u32, u32, u64)>,
    offset_ns: i64,
}

impl Conv {
    pub fn to_ns(&self, t: &mut [i64]) {
        if let Some((mult, shift, off)) = self.tsc {
            for x in t.iter_mut() {
                *x = (((*x as u64 as u128 * mult as u128) >> shift) as u64).wrapping_add(off) as i64;
            }
        }
        if self.offset_ns != 0 {
            for x in t.iter_mut() {
                *x += self.offset_ns;
            }
        }
    }
}

/// A perf.data's header names its sections (attributes, data, the feature
/// sections after the data) by offset and size; each must lie inside the
/// file. The reader allocates what a size says before it reads: a damaged
/// size would ask for terabytes and abort the process, so it is checked
/// first and refused as damage. (Big-endian files are left to the reader.)
/// The data section's (offset, size) of a little-endian file.
fn perf_sections_fit(f: &File) -> R<Option<(u64, u64)>> {
    use std::os::unix::fs::FileExt;
    let len = f.metadata().map_err(|e| FileError(format!("cannot read its size: {e}")))?.len();
    let mut h = [0u8; 104];
    if f.read_exact_at(&mut h, 0).is_err() || &h[..8] != b"PERFILE2" {
        return Ok(None); // not one this check reads: the reader says what it is
    }
    let word = |b: &[u8], i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
    let fits = |what: &str, off: u64, size: u64| {
        if off.checked_add(size).is_none_or(|end| end > len) {
            return Err(FileError(format!("its header puts {what} at offset {off}, {size} bytes, past the file's end ({len} bytes): the file is damaged")));
        }
        Ok(())
    };
    fits("the attributes", word(&h, 3), word(&h, 4))?;
    let (data_off, data_size) = (word(&h, 5), word(&h, 6));
    fits("the data", data_off, data_size)?;
    let features: u32 = (9..13).map(|i| word(&h, i).count_ones()).sum();
    let table = data_off + data_size;
    fits("the feature sections' table", table, features as u64 * 16)?;
    let mut t = vec![0u8; features as usize * 16];
    f.read_exact_at(&mut t, table).map_err(|e| FileError(format!("its feature sections' table: {e}")))?;
    for k in 0..features as usize {
        fits(&format!("feature section {}", k + 1), word(&t, 2 * k), word(&t, 2 * k + 1))?;
    }
    Ok(Some((data_off, data_size)))
}

/// The file as the crate's reader sees it: its data section ends at `cut`
/// (an AUX record the crate would allocate past the file for, see
/// [`aux_past_end`]), so the crate meets the end there and says so.
/// Everything else reads as it is. The cut is set once the file's
/// attributes say the crate reads its records, before it reads one.
pub struct CutFile {
    f: File,
    pos: u64,
    /// the data section's bytes from `cut` to `end` read as its end
    cut: std::sync::Arc<std::sync::atomic::AtomicU64>,
    end: u64,
}

impl std::io::Read for CutFile {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let mut want = buf.len();
        let cut = self.cut.load(std::sync::atomic::Ordering::Relaxed);
        if self.pos < cut {
            want = want.min((cut - self.pos).try_into().unwrap_or(usize::MAX));
        } else if self.pos < self.end {
            return Ok(0);
        }
        let n = self.f.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl std::io::Seek for CutFile {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        use std::io::SeekFrom;
        let at = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.f.metadata()?.len().checked_add_signed(d),
        };
        self.pos = at.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a seek before the file's start"))?;
        Ok(self.pos)
    }
}

/// What a perf.data held besides its tracepoint samples.
#[derive(Debug, Default, Clone, Copy)]
pub struct PerfCounts {
    pub samples: u64,
    pub not_tracepoints: u64,
    pub lost_records: u64,
    pub lost_events: u64,
    pub other_records: u64,
}

pub struct Perf {
    file: linux_perf_data::PerfFile,
    iter: linux_perf_data::PerfRecordIter<std::io::BufReader<CutFile>>,
    /// Why the crate's reader was cut short (see [`CutFile`]), said where it stops.
    cut: Option<String>,
    /// CPUs a record may name: the file's count, or [`MAX_CPUS`] (a record naming one past it is damaged).
    cpus: i32,
    pub dec: Decoder,
    pub meta: Meta,
    pub bad_formats: Vec<String>,
    pub counts: PerfCounts,
    pub hostname: Option<String>,
    pub os_release: Option<String>,
    pub perf_version: Option<String>,
    pub command: Option<String>,
    pub nr_cpus: Option<u32>,
    /// Where the records stopped reading (the rest of the file is not imported), as said to the user.
    pub damage: Vec<String>,
    /// The records in file order, when the file's layout allows (else the crate's sorted reader).
    walk: Option<(Records, Layouts, Rounds)>,
}

impl Perf {
    /// `walk`: read the records in file order where the layout allows.
    pub fn open(path: &str, walk: bool) -> R<Self> {
        use linux_perf_data::{Feature, PerfFileReader};
        let f = File::open(path).map_err(|e| FileError(format!("cannot open it: {e}")))?;
        let data = perf_sections_fit(&f)?;
        let mine = f.try_clone().map_err(|e| FileError(format!("cannot open it: {e}")))?;
        let cut_at = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
        let end = data.map_or(u64::MAX, |(off, size)| off + size);
        let scan = mine.try_clone().map_err(|e| FileError(format!("cannot open it: {e}")))?;
        let r = PerfFileReader::parse_file(std::io::BufReader::with_capacity(1 << 20, CutFile { f, pos: 0, cut: cut_at.clone(), end }))
            .map_err(|e| FileError(format!("not a perf.data file loopscope can read: {e}")))?;
        let file = r.perf_file;
        let Some(td) = file.feature_section_data(Feature::TRACING_DATA) else {
            return Err(FileError(
                "it holds no tracepoint descriptions (no TRACING_DATA): record kernel tracepoints, as perf sched record or perf record -e 'sched:*' do".into(),
            ));
        };
        let meta = tracedat::tracing_data(td)?;
        let layout: PageLayout = parse_header_page(&meta.header_page).unwrap_or_default();
        let (fs, bad_formats) = formats(&meta.formats);
        let s = |x: Result<Option<&str>, linux_perf_data::Error>| x.ok().flatten().map(str::to_string);
        let hostname = s(file.hostname());
        let os_release = s(file.os_release());
        let perf_version = s(file.perf_version());
        let command = file.cmdline().ok().flatten().map(|v| v.join(" "));
        let nr_cpus = file.nr_cpus().ok().flatten().map(|n| n.nr_cpus_available);
        let mut dec = Decoder::new(layout, fs);
        dec.set_kallsyms(&meta.kallsyms);
        let walk = data.filter(|_| walk).zip(walkable(&file)).map(|((off, size), w)| (Records::new(mine, off, size), w, Rounds::default()));
        // the crate's reader reads the records: cut it before an AUX record it would abort on
        let mut cut = None;
        if let (None, Some((off, size))) = (&walk, data) {
            if let Some((at, why)) = aux_past_end(&scan, off, size) {
                cut_at.store(at, std::sync::atomic::Ordering::Relaxed);
                cut = Some(why);
            }
        }
        let cpus = nr_cpus.filter(|n| (1..=MAX_CPUS).contains(n)).unwrap_or(MAX_CPUS) as i32;
        Ok(Perf {
            file,
            iter: r.record_iter,
            cut,
            cpus,
            dec,
            meta,
            bad_formats,
            counts: PerfCounts::default(),
            hostname,
            os_release,
            perf_version,
            command,
            nr_cpus,
            damage: Vec::new(),
            walk,
        })
    }

    /// The records stop reading at the `n`th sample: what came before is
    /// kept, every CPU's end is a loss of unknown size (what follows is not
    /// read), and the cut is said. An error when nothing came before it.
    fn stop(&mut self, why: String) -> R<bool> {
        let n = self.counts.samples;
        if n == 0 {
            return Err(FileError(why));
        }
        for cpu in self.dec.cpus() {
            self.dec.damaged(cpu);
        }
        // what the rest of the file held is lost on every CPU, from its last event to the latest one read
        if let Some(end) = self.dec.latest() {
            self.dec.finish(end);
        }
        self.damage.push(format!("{why}; the records after sample {n} are not read"));
        Ok(false)
    }

    /// Decode records in time order until about `records` more samples are
    /// decoded. False when the file is read to its end.
    pub fn next(&mut self, records: u64) -> R<bool> {
        use linux_perf_data::linux_perf_event_reader::EventRecord;
        use linux_perf_data::PerfFileRecord;
        let goal = self.counts.samples + records;
        self.dec.reserve(records as usize);
        if self.walk.is_some() {
            return self.next_in_file_order(goal);
        }
        while self.counts.samples < goal {
            let rec = match self.iter.next_record(&mut self.file) {
                Ok(r) => r,
                Err(e) => {
                    let why = self.cut.take().unwrap_or_else(|| format!("a record does not read: {e}"));
                    return self.stop(why);
                }
            };
            let Some(rec) = rec else { return Ok(false) };
            let PerfFileRecord::EventRecord { record, .. } = rec else { continue };
            if record.record_type.0 == 13 {
                // LOST_SAMPLES: a u64 count, then the record's sample id
                let n = record.data.as_slice().get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).unwrap_or(0);
                lost(&mut self.dec, &mut self.counts, self.cpus, &record, n as i64, "perf lost samples (LOST_SAMPLES)");
                continue;
            }
            if !matches!(record.record_type.0, SAMPLE | LOST) {
                // not parsed: the crate asserts on some damaged records (an MMAP2's build id length) instead of erring
                self.counts.other_records += 1;
                continue;
            }
            match record.parse() {
                Ok(EventRecord::Sample(smp)) => {
                    self.counts.samples += 1;
                    let (Some(t), Some(raw)) = (smp.timestamp, smp.raw) else {
                        self.counts.not_tracepoints += 1;
                        continue;
                    };
                    let cpu = smp.cpu.map(|c| c as i32).unwrap_or(-1);
                    if cpu >= self.cpus || cpu < -1 {
                        self.dec.lose_at(-1, 0, 1, &cpu_past(cpu, self.cpus));
                        continue;
                    }
                    self.dec.event(cpu, t as i64, &raw.as_slice());
                }
                Ok(EventRecord::Lost(l)) => lost(&mut self.dec, &mut self.counts, self.cpus, &record, l.count as i64, "perf lost events (LOST)"),
                Ok(_) => self.counts.other_records += 1,
                Err(e) => return self.stop(format!("a record does not parse: {e}")),
            }
        }
        Ok(true)
    }

    /// The earliest time an event still to be read can have (None: the
    /// records come sorted, or none are left to read).
    pub fn watermark(&self) -> Option<i64> {
        self.walk.as_ref().map(|w| w.2.watermark())
    }

    /// `next` through the file-order walker: samples decoded as the file
    /// holds them, the rounds' ends moving the watermark.
    fn next_in_file_order(&mut self, goal: u64) -> R<bool> {
        let Some((recs, walk, rounds)) = self.walk.as_mut() else { return Ok(false) };
        let mut stopped = None;
        while self.counts.samples < goal {
            match recs.next() {
                Next::End => return Ok(false),
                Next::Damage(why) => {
                    stopped = Some(why);
                    break;
                }
                Next::Record(SAMPLE, body) => {
                    let (t, cpu, raw) = match walk.sample(body) {
                        Sample::Event(t, cpu, raw) => (t, cpu, raw),
                        Sample::Short => {
                            stopped = Some(format!("a record does not parse: sample {} is shorter than its format says", self.counts.samples + 1));
                            break;
                        }
                        Sample::NoAttribute(id) => {
                            self.counts.samples += 1;
                            let why = format!("a sample's id {id} names no event of the file: damaged, not decoded");
                            self.dec.lose_at(-1, 0, 1, &why);
                            continue;
                        }
                    };
                    self.counts.samples += 1;
                    if cpu >= self.cpus || cpu < -1 {
                        self.dec.lose_at(-1, 0, 1, &cpu_past(cpu, self.cpus));
                        continue;
                    }
                    rounds.saw(t);
                    self.dec.event(cpu, t, raw);
                }
                Next::Record(FINISHED_ROUND, _) => rounds.ended(),
                Next::Record(kind @ (LOST | LOST_SAMPLES), body) => {
                    // LOST: id, count; LOST_SAMPLES: count; then the sample id
                    let n = body.get(if kind == LOST { 8..16 } else { 0..8 }).map(|b| u64::from_le_bytes(b.try_into().unwrap())).unwrap_or(0);
                    let why = if kind == LOST { "perf lost events (LOST)" } else { "perf lost samples (LOST_SAMPLES)" };
                    let at = walk.id_of(body).filter(|&(cpu, _)| (-1..self.cpus).contains(&cpu));
                    lost_at(&mut self.dec, &mut self.counts, at, n as i64, why);
                }
                // the kernel's other records (perf's own are not counted: the crate's reader gives them apart)
                Next::Record(kind, _) if kind < USER_TYPE_START => self.counts.other_records += 1,
                Next::Record(..) => {}
            }
        }
        match stopped {
            Some(why) => self.stop(why),
            None => Ok(true),
        }
    }
}

/// The sample layouts of the file's attributes, when the walker reads them.
fn walkable(file: &linux_perf_data::PerfFile) -> Option<Layouts> {
    use linux_perf_data::linux_perf_event_reader::AttrFlags;
    use linux_perf_data::{Endianness, Feature};
    if file.endian() != Endianness::LittleEndian || file.features().has_feature(Feature::AUXTRACE) {
        return None;
    }
    let attrs: Vec<(u64, bool, &[u64])> =
        file.event_attributes().iter().map(|a| (a.attr.sample_format.bits(), a.attr.flags.contains(AttrFlags::SAMPLE_ID_ALL), &a.event_ids[..])).collect();
    Layouts::of(&attrs)
}

/// A loss at its record's (CPU, time), or of unknown place without them.
fn lost_at(dec: &mut Decoder, counts: &mut PerfCounts, at: Option<(i32, i64)>, n: i64, why: &str) {
    counts.lost_records += 1;
    counts.lost_events += n.max(0) as u64;
    match at {
        Some((cpu, t)) => dec.lose_at(cpu, t, n, why),
        None => dec.lose_at(-1, 0, n, &format!("{why}; the record carries no time or CPU")),
    }
}

/// A sample that names a CPU past the machine's (`cpus`): what is said of it.
fn cpu_past(cpu: i32, cpus: i32) -> String {
    format!("a sample names CPU {cpu}, past the {cpus} CPUs the recording's machine can have: damaged, not decoded")
}

/// A perf loss record: a window on its CPU up to its time, or of unknown
/// place (when it names none, or a CPU past the machine's `cpus`).
fn lost(dec: &mut Decoder, counts: &mut PerfCounts, cpus: i32, record: &linux_perf_data::linux_perf_event_reader::RawEventRecord<'_>, n: i64, why: &str) {
    let cd = record.common_data().ok();
    let at = cd.and_then(|c| Some((c.cpu? as i32, c.timestamp? as i64))).filter(|&(cpu, _)| (-1..cpus).contains(&cpu));
    lost_at(dec, counts, at, n, why);
}
