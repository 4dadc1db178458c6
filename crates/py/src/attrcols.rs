//! The event columns attribution reads (`attribute::ktrace_attribute`): the
//! caller's arrays held read-only under the interpreter lock, and read a
//! chunk at a time after it is released, beside the caller's next read.
//!
//! A busy capture's cluster is about half a million events: tens of MB of
//! the split's own structures (runs, per-thread lists) and of chunks widened
//! from int32, freed at the cluster's end. glibc hands such blocks back to the
//! kernel at the free, and the next cluster faults them in again, zeroed
//! page by page (a fifth of the attribution's CPU time on a busy capture).
//! `FreedKept` has glibc keep what is freed while a capture's windows are
//! attributed, and hands it back after.

use super::InputError;
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A column's chunk as the caller's array, borrowed read-only while the
/// interpreter lock is released (a strided one is copied here, under it).
pub enum Held<'py> {
    I64(PyReadonlyArray1<'py, i64>),
    I32(PyReadonlyArray1<'py, i32>),
    Copied(Vec<i64>),
}

impl<'py> Held<'py> {
    fn of(a: &Bound<'py, PyAny>) -> PyResult<Held<'py>> {
        if let Ok(x) = a.extract::<PyReadonlyArray1<'py, i64>>() {
            return Ok(match x.as_slice() {
                Ok(_) => Held::I64(x),
                Err(_) => Held::Copied(x.as_array().iter().copied().collect()),
            });
        }
        let x: PyReadonlyArray1<'py, i32> = a.extract()?;
        Ok(match x.as_slice() {
            Ok(_) => Held::I32(x),
            Err(_) => Held::Copied(x.as_array().iter().map(|&v| v as i64).collect()),
        })
    }

    pub fn chunk(&self) -> Chunk<'_> {
        match self {
            Held::I64(x) => Chunk::I64(x.as_slice().unwrap_or_default()),
            Held::I32(x) => Chunk::I32(x.as_slice().unwrap_or_default()),
            Held::Copied(v) => Chunk::I64(v),
        }
    }
}

/// One chunk of a column, as the split reads it.
#[derive(Clone, Copy)]
pub enum Chunk<'a> {
    I64(&'a [i64]),
    I32(&'a [i32]),
}

impl Chunk<'_> {
    pub fn len(self) -> usize {
        match self {
            Chunk::I64(s) => s.len(),
            Chunk::I32(s) => s.len(),
        }
    }
}

/// A column's chunks joined as int64: borrowed when it is one int64 chunk,
/// else copied (int32 widened).
pub fn joined<'a>(chunks: &[Chunk<'a>]) -> Cow<'a, [i64]> {
    if let [Chunk::I64(s)] = chunks {
        return Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(chunks.iter().map(|c| c.len()).sum());
    for c in chunks {
        match *c {
            Chunk::I64(s) => out.extend_from_slice(s),
            Chunk::I32(s) => out.extend(s.iter().map(|&v| v as i64)),
        }
    }
    Cow::Owned(out)
}

/// The columns the split takes, in `Events`' order: read from the capture's
/// files by these names (`attribute`'s row ranges), and nothing else names them.
pub const COLUMNS: [&str; 15] = [
    "t_ns",
    "cpu",
    "event",
    "pid",
    "target",
    "target_comm",
    "next_pid",
    "next_comm",
    "prev_state",
    "name",
    "runtime",
    "expires",
    "softexpires",
    "prio",
    "next_prio",
];

/// The columns attribution reads, each an array or a list of chunks, held as
/// the caller's arrays; the tasks' priorities may be missing (captures before
/// them), None here, -1 for every event in the split.
pub fn attribute_columns<'py>(cols: &Bound<'py, PyDict>) -> PyResult<Vec<Option<Vec<Held<'py>>>>> {
    let mut held = Vec::with_capacity(COLUMNS.len());
    let mut n = None;
    for c in COLUMNS {
        let Some(a) = cols.get_item(c)? else {
            if c.ends_with("prio") {
                held.push(None);
                continue;
            }
            return Err(InputError::new_err(format!("ktrace_attribute: no column {c}")));
        };
        let err = |e: PyErr| InputError::new_err(format!("ktrace_attribute: column {c}: {e}"));
        let mut h = Vec::new();
        match a.cast::<pyo3::types::PyList>() {
            Ok(list) => {
                for x in list.iter() {
                    h.push(Held::of(&x).map_err(err)?);
                }
            }
            Err(_) => h.push(Held::of(&a).map_err(err)?),
        }
        let len: usize = h.iter().map(|x| x.chunk().len()).sum();
        if *n.get_or_insert(len) != len {
            return Err(InputError::new_err("ktrace_attribute: the columns differ in length"));
        }
        held.push(Some(h));
    }
    Ok(held)
}

/// While held (a context manager, nestable, from any thread): glibc keeps
/// the memory freed at the top of its heaps and serves blocks up to 32 MB
/// from them, instead of handing pages back to the kernel at each free and
/// faulting them in, zeroed, at the next cluster. On the last exit, the
/// thresholds are those glibc reaches by itself after such blocks (32 MB,
/// and twice that to trim), and what is free is handed back (`malloc_trim`).
#[pyclass(module = "loopscope._native", name = "FreedKept")]
pub struct FreedKept {
    entered: bool,
}

static KEPT_BY: AtomicUsize = AtomicUsize::new(0);
const BLOCK: i32 = 32 << 20;

#[pymethods]
impl FreedKept {
    #[new]
    fn new() -> Self {
        FreedKept { entered: false }
    }

    fn __enter__(mut slf: PyRefMut<'_, Self>) -> PyRefMut<'_, Self> {
        if !slf.entered {
            slf.entered = true;
            if KEPT_BY.fetch_add(1, Ordering::SeqCst) == 0 {
                // SAFETY: mallopt only sets glibc's allocator parameters (it takes the arena lock)
                unsafe {
                    libc::mallopt(libc::M_MMAP_THRESHOLD, BLOCK);
                    libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
                }
            }
        }
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        if std::mem::take(&mut self.entered) && KEPT_BY.fetch_sub(1, Ordering::SeqCst) == 1 {
            // SAFETY: as above; malloc_trim hands free pages back to the kernel
            unsafe {
                libc::mallopt(libc::M_TRIM_THRESHOLD, 2 * BLOCK);
                libc::malloc_trim(0);
            }
        }
        false
    }
}
