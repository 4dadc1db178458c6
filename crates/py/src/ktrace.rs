//! The kernel trace decoder (crates/ktrace) and the page reader, from Python.
//!
//! `ktrace_read` empties one CPU's `trace_pipe_raw` (opened non-blocking)
//! into bytes with the interpreter lock released; `KtraceDecoder` turns those
//! pages into numpy columns and a string table, keeping each CPU's last event
//! time across batches so that a loss at a batch's first page is placed.

use super::{detached, InputError};
use loopscope_ktrace::decode::Decoder;
use loopscope_ktrace::format::{parse, parse_header_page};
use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

/// Read whole pages from `fd` (a `trace_pipe_raw`, non-blocking) until the
/// buffer is empty or `max_bytes` are read. Bound it by what the buffer held
/// when the drain began: each read hands over the page being written too, so
/// a reader whose own activity is traced could otherwise chase its own events.
#[pyfunction]
#[pyo3(signature = (fd, page_size, max_bytes))]
pub fn ktrace_read<'py>(py: Python<'py>, fd: i32, page_size: usize, max_bytes: usize) -> PyResult<Bound<'py, PyBytes>> {
    // Not `detached`: a signal here must not throw away the pages just read
    // (they are gone from the kernel's buffer). The drain's own handler raises
    // at its next statement, and it reads what is left before it stops.
    let (buf, err) = py.detach(move || {
        let mut buf: Vec<u8> = Vec::with_capacity(page_size * 64);
        let mut page = vec![0u8; page_size];
        let mut err = None;
        while buf.len() < max_bytes {
            let n = unsafe { libc::read(fd, page.as_mut_ptr() as *mut libc::c_void, page_size) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => {}
                    Some(libc::EINTR) => continue,
                    _ => err = Some(e),
                }
                break;
            }
            if n == 0 {
                break;
            }
            // A short read is a whole page's worth for the decoder: pad it.
            buf.extend_from_slice(&page[..n as usize]);
            buf.resize(buf.len() + (page_size - n as usize), 0);
        }
        (buf, err)
    });
    if let Some(e) = err {
        return Err(pyo3::exceptions::PyOSError::new_err(format!("reading the kernel's trace buffer: {e}")));
    }
    Ok(PyBytes::new(py, &buf))
}

#[pyclass(module = "loopscope._native", name = "KtraceDecoder")]
pub struct KtraceDecoder {
    d: Decoder,
    page_size: usize,
}

#[pymethods]
impl KtraceDecoder {
    /// `header_page`: the text of events/header_page; `formats`: (system, format file text) per event.
    #[new]
    fn new(header_page: &str, formats: Vec<(String, String)>, page_size: usize) -> PyResult<Self> {
        let layout = parse_header_page(header_page).map_err(InputError::new_err)?;
        let mut fs = Vec::new();
        for (sys, text) in formats {
            fs.push(parse(&sys, &text).map_err(InputError::new_err)?);
        }
        Ok(KtraceDecoder { d: Decoder::new(layout, fs), page_size })
    }

    /// Decode whole pages read from `cpu`'s buffer, in the order read.
    fn pages(&mut self, py: Python<'_>, cpu: i32, data: &[u8]) -> PyResult<()> {
        let ps = self.page_size;
        let d = &mut self.d;
        detached(py, || d.pages(cpu, data, ps))
    }

    /// Set where the previous batch left `cpu` (its last event's time).
    fn set_last_time(&mut self, cpu: i32, t_ns: i64) {
        self.d.set_last_time(cpu, t_ns);
    }

    fn last_times(&self) -> Vec<(i32, i64)> {
        self.d.last_times()
    }

    /// Close loss windows left open by a damaged last page at `end_ns`.
    fn finish(&mut self, end_ns: i64) {
        self.d.finish(end_ns);
    }

    /// Everything decoded since the last call: {column: numpy array},
    /// {lost column: numpy array or list}, the string table, the event names, counts.
    fn take<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (c, l) = self.d.take();
        let o = PyDict::new(py);
        let cols = PyDict::new(py);
        cols.set_item("t_ns", c.t_ns.into_pyarray(py))?;
        cols.set_item("cpu", c.cpu.into_pyarray(py))?;
        cols.set_item("event", c.event.into_pyarray(py))?;
        cols.set_item("pid", c.pid.into_pyarray(py))?;
        cols.set_item("target", c.target.into_pyarray(py))?;
        cols.set_item("target_comm", c.target_comm.into_pyarray(py))?;
        cols.set_item("next_pid", c.next_pid.into_pyarray(py))?;
        cols.set_item("next_comm", c.next_comm.into_pyarray(py))?;
        cols.set_item("prev_state", c.prev_state.into_pyarray(py))?;
        cols.set_item("irq", c.irq.into_pyarray(py))?;
        cols.set_item("name", c.name.into_pyarray(py))?;
        cols.set_item("dest_cpu", c.dest_cpu.into_pyarray(py))?;
        cols.set_item("runtime", c.runtime.into_pyarray(py))?;
        cols.set_item("expires", c.expires.into_pyarray(py))?;
        cols.set_item("softexpires", c.softexpires.into_pyarray(py))?;
        o.set_item("columns", cols)?;
        let lost = PyDict::new(py);
        lost.set_item("cpu", l.cpu.into_pyarray(py))?;
        lost.set_item("start_ns", l.start_ns.into_pyarray(py))?;
        lost.set_item("end_ns", l.end_ns.into_pyarray(py))?;
        lost.set_item("events", l.events.into_pyarray(py))?;
        lost.set_item("why", l.why)?;
        o.set_item("lost", lost)?;
        o.set_item("strings", self.d.strings().to_vec())?;
        o.set_item("events", self.d.events.clone())?;
        let n = self.d.counts;
        let counts = PyDict::new(py);
        counts.set_item("pages", n.pages)?;
        counts.set_item("records", n.records)?;
        counts.set_item("kept", n.kept)?;
        counts.set_item("unknown_type", n.unknown_type)?;
        counts.set_item("damaged_pages", n.damaged_pages)?;
        o.set_item("counts", counts)?;
        Ok(o)
    }
}
