//! Reading a tracefs buffer (`trace_pipe_raw`): whole pages, non-blocking,
//! bounded by what the buffer held when the read began. `ktrace_read` gives
//! the bytes (the flight recorder's ring keeps pages undecoded);
//! `KtraceDecoder.read_pages` (ktrace.rs) decodes them as they come.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Read pages from `fd` (a `trace_pipe_raw`, non-blocking) into `buf`, one
/// page of `page_size` after another, until the buffer is empty or
/// `max_bytes` are read; `take` is given `buf` and how much of it holds
/// pages when it is full and at the end (a short read padded: a whole page's
/// worth for the decoder). Returns the bytes read, and the error that
/// stopped the read (not EAGAIN: an empty buffer).
pub fn read_pages_into(fd: i32, page_size: usize, max_bytes: usize, buf: &mut [u8], mut take: impl FnMut(&[u8])) -> (usize, Option<std::io::Error>) {
    let (mut fill, mut total, mut err) = (0, 0, None);
    while total < max_bytes {
        let n = unsafe { libc::read(fd, buf[fill..].as_mut_ptr() as *mut libc::c_void, page_size) };
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
        buf[fill + n as usize..fill + page_size].fill(0);
        fill += page_size;
        total += page_size;
        if fill == buf.len() {
            take(buf);
            fill = 0;
        }
    }
    if fill > 0 {
        take(&buf[..fill]);
    }
    (total, err)
}

pub fn read_error(e: std::io::Error) -> PyErr {
    pyo3::exceptions::PyOSError::new_err(format!("reading the kernel's trace buffer: {e}"))
}

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
    let (out, err) = py.detach(move || {
        let mut out: Vec<u8> = Vec::with_capacity(page_size * 64);
        let mut page = vec![0u8; page_size];
        let (_, err) = read_pages_into(fd, page_size, max_bytes, &mut page, |p| out.extend_from_slice(p));
        (out, err)
    });
    match err {
        Some(e) => Err(read_error(e)),
        None => Ok(PyBytes::new(py, &out)),
    }
}
