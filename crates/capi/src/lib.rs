//! The C ABI of the event logger, declared in `include/loopscope.h`.
//!
//! This crate only translates: C strings to `&str`, integer kinds to
//! `Kind`, `Result`s to a return code plus a per-thread error message
//! (`ls_last_error`). It lives apart from `loopscope-trace` because Cargo
//! builds a dependency as an rlib only, and C programs need `libloopscope.a`
//! and `libloopscope.so`. The logging functions are thin `extern "C"` shells
//! around the inlined Rust hot path; the header inlines the disabled check.

use loopscope_trace::config::Config;
use loopscope_trace::hist::Scale;
use loopscope_trace::{register, session, Entity, Error, Kind};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}
static LAST_LOST: AtomicU64 = AtomicU64::new(0);

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn result(r: Result<(), Error>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_error(&e.to_string());
            -1
        }
    }
}

/// A registration's result as a C handle: NULL and `ls_last_error` on failure.
fn handle(r: Result<&'static Entity, Error>) -> *const Entity {
    match r {
        Ok(e) => e as *const Entity,
        Err(e) => {
            set_error(&e.to_string());
            std::ptr::null()
        }
    }
}

unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Error> {
    if p.is_null() {
        return Err(Error::input(format!("{what} is NULL")));
    }
    CStr::from_ptr(p).to_str().map_err(|_| Error::input(format!("{what} is not valid UTF-8")))
}

unsafe fn opt_text<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        None
    } else {
        CStr::from_ptr(p).to_str().ok()
    }
}

/// The message of the last failed call on this thread ("" if none).
#[no_mangle]
pub extern "C" fn ls_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Open a trace. `path` NULL: `$LOOPSCOPE_TRACE`; `%p` in it is the pid.
/// `config` NULL: the environment (`LOOPSCOPE_CONFIG`, `LOOPSCOPE_GROUPS`,
/// `LOOPSCOPE_RING_GROUPS`). A child forked after an open logs nothing
/// until it opens a trace of its own.
#[no_mangle]
pub unsafe extern "C" fn ls_open(path: *const c_char, config: *const c_char) -> c_int {
    let r = (|| {
        let path = match opt_text(path) {
            Some(p) => p.to_string(),
            None => std::env::var("LOOPSCOPE_TRACE").map_err(|_| Error::input("no path given and LOOPSCOPE_TRACE is not set".into()))?,
        };
        // `%p`: this process's id, so each child of a forking server names a file of its own.
        let path = path.replace("%p", &std::process::id().to_string());
        let cfg = match opt_text(config) {
            Some(c) => {
                let t = std::fs::read_to_string(c).map_err(|e| Error::input(format!("{c}: cannot read: {e}")))?;
                let mut cfg = Config::from_toml(&t, c)?;
                cfg.apply_env_groups();
                cfg
            }
            None => Config::from_env()?,
        };
        session::open(path.as_ref(), cfg)
    })();
    result(r)
}

/// Close the open trace. Returns 0, or -1 when the file could not be fully
/// written (see `ls_last_error`).
#[no_mangle]
pub extern "C" fn ls_close() -> c_int {
    match session::close() {
        Ok(end) => {
            LAST_LOST.store(end.lost_records, Ordering::Relaxed);
            0
        }
        Err(e) => {
            set_error(&e.to_string());
            -1
        }
    }
}

/// Records lost (buffers full) in the last closed trace.
#[no_mangle]
pub extern "C" fn ls_lost_records() -> u64 {
    LAST_LOST.load(Ordering::Relaxed)
}

/// Wait until everything logged so far has been handed to the file.
#[no_mangle]
pub extern "C" fn ls_flush() -> c_int {
    result(session::flush())
}

/// Register (or look up) an entity; NULL on error.
#[no_mangle]
pub unsafe extern "C" fn ls_register(group: *const c_char, name: *const c_char, kind: c_int, desc: *const c_char) -> *const Entity {
    let r = (|| {
        let k = Kind::from_u32(kind as u32)
            .filter(|k| *k != Kind::Histogram)
            .ok_or_else(|| Error::input(format!("kind {kind} is not one of LS_KIND_EVENT, LS_KIND_INTERVAL, LS_KIND_COUNTER (use ls_register_histogram)")))?;
        register(text(group, "group")?, text(name, "name")?, k, opt_text(desc).unwrap_or(""), None)
    })();
    handle(r)
}

/// Register a histogram: `scale` 0 is log-linear over [0, b] with `n`
/// sub-bucket bits; 1 is `n` linear buckets over [a, b).
#[no_mangle]
pub unsafe extern "C" fn ls_register_histogram(
    group: *const c_char,
    name: *const c_char,
    desc: *const c_char,
    scale: c_int,
    a: i64,
    b: i64,
    n: u32,
) -> *const Entity {
    let r = (|| {
        let s = match scale {
            0 => Scale::Log { sub_bits: n, max: b.max(0) as u64 },
            1 => Scale::Linear { lo: a, hi: b, n },
            _ => return Err(Error::input(format!("histogram scale {scale} is not LS_HIST_LOG (0) or LS_HIST_LINEAR (1)"))),
        };
        register(text(group, "group")?, text(name, "name")?, Kind::Histogram, opt_text(desc).unwrap_or(""), Some(s))
    })();
    handle(r)
}

#[no_mangle]
pub unsafe extern "C" fn ls_enable_group(stream: *const c_char, group: *const c_char, on: c_int) -> c_int {
    result((|| session::enable_group(text(stream, "stream")?, text(group, "group")?, on != 0))())
}

#[no_mangle]
pub unsafe extern "C" fn ls_trigger(stream: *const c_char, tag: u32) -> c_int {
    result((|| session::trigger(text(stream, "stream")?, tag))())
}

/// Allocate the calling thread's buffers now (the first record of a thread
/// otherwise pays for it: about a millisecond per MiB of buffer). Returns 0,
/// or -1 when no trace is open.
#[no_mangle]
pub extern "C" fn ls_thread_init() -> c_int {
    if loopscope_trace::prepare_thread() {
        0
    } else {
        set_error("no trace is open");
        -1
    }
}

/// Raw timestamp for starting an interval.
#[no_mangle]
pub extern "C" fn ls_now() -> u64 {
    loopscope_trace::now()
}

/// One `extern "C"` shell per logging call; a NULL handle is ignored.
macro_rules! shells {
    ($($cname:ident => $method:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[no_mangle]
        pub extern "C" fn $cname(e: *const Entity $(, $arg: $ty)*) {
            if let Some(e) = unsafe { e.as_ref() } {
                e.$method($($arg),*)
            }
        }
    )*};
}

shells! {
    ls__event => event(tag: u32);
    ls__event_value => event_value(tag: u32, value: i64);
    ls__interval => interval(tag: u32, start: u64);
    ls__interval_raw => interval_raw(tag: u32, start: u64, end: u64);
    ls__interval_mono => interval_mono(tag: u32, start_ns: u64, dur_ns: u64);
    ls__counter_add => counter_add(v: i64);
    ls__counter_log => counter_log();
    ls_counter_reset => counter_reset();
    ls__histogram_add => histogram_add(v: i64);
    ls__histogram_log => histogram_log();
    ls_histogram_reset => histogram_reset();
}

#[no_mangle]
pub unsafe extern "C" fn ls__event_payload(e: *const Entity, tag: u32, data: *const u8, len: usize) {
    let bytes = if data.is_null() || len == 0 { &[][..] } else { std::slice::from_raw_parts(data, len) };
    if let Some(e) = e.as_ref() {
        e.event_payload(tag, bytes)
    }
}
