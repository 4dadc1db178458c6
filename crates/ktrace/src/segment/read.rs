//! Rows of a capture's segment files read back as int64 columns, for the
//! native passes (attribution, `threads`' fold): no table, no array and no
//! interpreter in between.
//!
//! The store names what to read as row ranges of files (its row groups of
//! `GROUP` rows, whatever the file's own row groups are). Each wanted column
//! is decoded by the `parquet` crate's low-level column readers straight into
//! a buffer kept from one read to the next: an INT32 widened, a null (the
//! definition level below the column's maximum) given as -1, a column the
//! file lacks (a capture older than it) as -1 throughout. Given a span of
//! stamps, a group's stamps are decoded first and the other columns skip to
//! the rows inside it. A file's footer is read once per `Files`, which keeps
//! a few files open (`OPEN`: a capture of days has thousands). Before this, each row group went through polars (a
//! table, its nulls filled), numpy (an array a column) and a widening copy in
//! the attribution: about a third of the attribution's CPU time.

use parquet::column::reader::{get_typed_column_reader, ColumnReader};
use parquet::data_type::{DataType, Int32Type, Int64Type};
use parquet::file::reader::{FileReader, SerializedFileReader};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// One file open: its reader, where each of its row groups starts (rows,
/// and its total last), and the file's column of each wanted name.
struct Open {
    reader: SerializedFileReader<File>,
    starts: Vec<usize>,
    index: Vec<Option<usize>>,
}

/// The files a read has opened (each footer parsed once), the wanted
/// columns' names, and the decoding buffers kept from one column to the next.
pub struct Files<'n> {
    names: &'n [&'n str],
    open: HashMap<PathBuf, Open>,
    def: Vec<i16>,
    v64: Vec<i64>,
    v32: Vec<i32>,
    stamps: Vec<i64>,
}

/// Files kept open at once by one `Files` (each a descriptor and its footer).
const OPEN: usize = 16;

fn err(path: &Path, what: impl std::fmt::Display) -> String {
    format!("{}: {what}", path.display())
}

impl<'n> Files<'n> {
    pub fn new(names: &'n [&'n str]) -> Self {
        Files { names, open: HashMap::new(), def: Vec::new(), v64: Vec::new(), v32: Vec::new(), stamps: Vec::new() }
    }

    fn open(&mut self, path: &Path) -> Result<&Open, String> {
        if !self.open.contains_key(path) {
            if self.open.len() >= OPEN {
                self.open.clear(); // the passes read files in time order: the ones before are done with
            }
            let file = File::open(path).map_err(|e| err(path, e))?;
            let reader = SerializedFileReader::new(file).map_err(|e| err(path, e))?;
            let meta = reader.metadata();
            let mut starts = vec![0usize];
            for g in meta.row_groups() {
                starts.push(starts[starts.len() - 1] + g.num_rows().max(0) as usize);
            }
            let schema = meta.file_metadata().schema_descr();
            let index = self.names.iter().map(|n| (0..schema.num_columns()).find(|&i| schema.column(i).name() == *n)).collect();
            self.open.insert(path.to_path_buf(), Open { reader, starts, index });
        }
        Ok(&self.open[path])
    }

    /// Rows `lo..hi` of `path` (cut at its end) appended to `out`, a vector
    /// per wanted name; with `within` (a, b), only the rows whose first wanted
    /// column (the stamps, sorted within a file) lies in a..=b: that column is
    /// decoded first and the others skip to the rows it finds. How many rows
    /// were appended.
    pub fn read(&mut self, path: &Path, lo: usize, hi: usize, within: Option<(i64, i64)>, out: &mut [Vec<i64>]) -> Result<usize, String> {
        self.rows(path, lo, hi, within, out).map_err(|e| format!("{e} (a damaged segment file: moved out of its events/ directory, its span counts as lost)"))
    }

    fn rows(&mut self, path: &Path, lo: usize, hi: usize, within: Option<(i64, i64)>, out: &mut [Vec<i64>]) -> Result<usize, String> {
        let open = self.open(path)?;
        let (starts, index) = (open.starts.clone(), open.index.clone());
        let hi = hi.min(*starts.last().unwrap_or(&0));
        let mut got = 0;
        for g in 0..starts.len() - 1 {
            let (s, e) = (starts[g], starts[g + 1]);
            if e <= lo || s >= hi {
                continue;
            }
            let (mut skip, mut n) = (lo.max(s) - s, hi.min(e) - lo.max(s));
            let mut first = 0;
            if let (Some((a, b)), Some(Some(c))) = (within, index.first()) {
                let mut t = std::mem::take(&mut self.stamps);
                t.clear();
                self.column(path, g, *c, skip, n, &mut t)?;
                let (x, y) = (t.partition_point(|&v| v < a), t.partition_point(|&v| v <= b));
                out[0].extend_from_slice(&t[x..y.max(x)]);
                self.stamps = t;
                (skip, n, first) = (skip + x, y.saturating_sub(x), 1);
            }
            if n == 0 {
                continue;
            }
            for (j, col) in index.iter().enumerate().skip(first) {
                match col {
                    None => out[j].resize(out[j].len() + n, -1),
                    Some(c) => self.column(path, g, *c, skip, n, &mut out[j])?,
                }
            }
            got += n;
        }
        Ok(got)
    }

    /// The rows of a run of ranges (file, first row, row after the last)
    /// into `out` (cleared first; `within` as `read`'s), sorted by the first
    /// wanted column (stably) when the ranges interleave in it.
    pub fn read_run(&mut self, run: &[(String, usize, usize)], within: Option<(i64, i64)>, out: &mut [Vec<i64>]) -> Result<(), String> {
        out.iter_mut().for_each(Vec::clear);
        for (p, lo, hi) in run {
            self.read(Path::new(p), *lo, *hi, within, out)?;
        }
        if run.len() > 1 && !out[0].windows(2).all(|w| w[0] <= w[1]) {
            let t = &out[0];
            let mut order: Vec<u32> = (0..t.len() as u32).collect();
            order.sort_by_key(|&i| t[i as usize]);
            for c in out.iter_mut() {
                *c = order.iter().map(|&i| c[i as usize]).collect();
            }
        }
        Ok(())
    }

    /// `n` values of column `c` of row group `g` after the first `skip`, widened, nulls -1.
    fn column(&mut self, path: &Path, g: usize, c: usize, skip: usize, n: usize, out: &mut Vec<i64>) -> Result<(), String> {
        let open = &self.open[path];
        let rg = open.reader.get_row_group(g).map_err(|e| err(path, e))?;
        let max_def = rg.metadata().column(c).column_descr().max_def_level();
        let reader = rg.get_column_reader(c).map_err(|e| err(path, e))?;
        let def = &mut self.def;
        def.clear();
        match reader {
            ColumnReader::Int64ColumnReader(_) => {
                self.v64.clear();
                values::<Int64Type>(reader, skip, n, max_def, def, &mut self.v64).map_err(|e| err(path, e))?;
                widen(&self.v64, def, max_def, n, out, |v| v);
            }
            ColumnReader::Int32ColumnReader(_) => {
                self.v32.clear();
                values::<Int32Type>(reader, skip, n, max_def, def, &mut self.v32).map_err(|e| err(path, e))?;
                widen(&self.v32, def, max_def, n, out, |v| v as i64);
            }
            _ => {
                let m = rg.metadata().column(c);
                let (name, t) = (m.column_path().string(), m.column_type());
                return Err(err(path, format!("column {name} is {t}, not INT32 or INT64: not a capture's segment")));
            }
        }
        Ok(())
    }
}

/// Read `n` records after `skip` of a typed column: values (non-null only)
/// into `vals`, definition levels into `def` when the column is nullable.
fn values<T: DataType>(r: ColumnReader, skip: usize, n: usize, max_def: i16, def: &mut Vec<i16>, vals: &mut Vec<T::T>) -> Result<(), String> {
    let mut r = get_typed_column_reader::<T>(r);
    if skip > 0 && r.skip_records(skip).map_err(|e| e.to_string())? < skip {
        return Err("the file ends before its row group says".into());
    }
    let mut got = 0;
    while got < n {
        let d = if max_def > 0 { Some(&mut *def) } else { None };
        let (records, _, _) = r.read_records(n - got, d, None, vals).map_err(|e| e.to_string())?;
        if records == 0 {
            return Err(format!("a column holds {got} of the {n} rows its row group says"));
        }
        got += records;
    }
    Ok(())
}

/// Non-null values `vals` spread over `n` rows by their definition levels
/// (all present when the column is required), nulls -1, appended to `out`.
fn widen<V: Copy>(vals: &[V], def: &[i16], max_def: i16, n: usize, out: &mut Vec<i64>, f: impl Fn(V) -> i64) {
    out.reserve(n);
    if max_def == 0 || vals.len() == n {
        out.extend(vals.iter().map(|&v| f(v)));
        return;
    }
    let Some(&pad) = vals.last() else {
        out.resize(out.len() + n, -1);
        return;
    };
    // branchless: the next value is read at every row (the last one again past the end) and kept where present
    let mut k = 0usize;
    out.extend(def.iter().map(|&d| {
        let present = d == max_def;
        let v = f(*vals.get(k).unwrap_or(&pad));
        k += present as usize;
        if present {
            v
        } else {
            -1
        }
    }));
}
