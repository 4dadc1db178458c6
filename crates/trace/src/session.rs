//! A trace session: one open file, its streams and its writer thread.
//!
//! `open` locks the process's memory when `LOOPSCOPE_MLOCKALL=1` asks, writes
//! the file header, the info chunk and two calibration pairs
//! synchronously (so an unwritable path fails there, not later), enables the
//! configured groups and starts the writer. `close` disables every entity,
//! lets the writer drain all buffers, write the end chunk and stop, and
//! reports what was written and what was lost. One session is open per
//! process at a time; a closed session can be followed by a new one.
//!
//! Fork: a child must never write into its parent's file. Handlers
//! registered with `pthread_atfork` at the first open hold the session and
//! control locks across `fork()` (so the child never inherits one held by a
//! thread it does not have), and in the child drop the parent's session
//! without touching it (its writer thread does not exist there; its file is
//! the parent's) and make every buffer stale. The child then logs nothing
//! until it opens a trace of its own (`ls_open` expands `%p` to the pid).

use crate::clock::{self, CalPair};
use crate::config::{Config, StreamKind};
use crate::entity::{self, control, StreamFilter};
use crate::format::{self, chunk, End, Info, StreamInfo};
use crate::shared::{current, session, PendingTrigger, Session, Shared, EPOCH};
use crate::{writer, Error};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

type Held = (std::sync::MutexGuard<'static, Option<Session>>, std::sync::MutexGuard<'static, entity::Control>);

thread_local! {
    /// The locks `before_fork` took, released by the parent and the child handlers (same thread).
    static FORK_HELD: std::cell::RefCell<Option<Held>> = const { std::cell::RefCell::new(None) };
}

extern "C" fn before_fork() {
    let held = (session(), control());
    FORK_HELD.with(|c| *c.borrow_mut() = Some(held));
}

extern "C" fn after_fork_parent() {
    FORK_HELD.with(|c| drop(c.borrow_mut().take()));
}

extern "C" fn after_fork_child() {
    FORK_HELD.with(|c| {
        if let Some((mut s, mut ctl)) = c.borrow_mut().take() {
            if let Some(parent) = s.take() {
                // Its writer is a thread of the parent and its file the parent's: leave both alone.
                std::mem::forget(parent);
                ctl.filters.clear();
                ctl.remask_all();
            }
        }
    });
    EPOCH.fetch_add(1, Ordering::SeqCst);
}

fn register_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| unsafe {
        libc::pthread_atfork(Some(before_fork), Some(after_fork_parent), Some(after_fork_child));
    });
}

/// Whether a session is open.
pub fn is_open() -> bool {
    session().is_some()
}

/// The path of the open session's file.
pub fn current_path() -> Option<PathBuf> {
    session().as_ref().map(|s| s.shared.path.clone())
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    let r = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if r != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn process_name() -> String {
    std::fs::read_to_string("/proc/self/comm").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Open a trace at `path`.
/// `LOOPSCOPE_MLOCKALL=1` (set by the lab for a `program` probe with
/// `mlock: true`, or a phase's `mlock` tuning): lock every page the process
/// has and will have (`mlockall(MCL_CURRENT | MCL_FUTURE)`), as a real-time
/// program does at start, so memory pressure cannot page it out. What came
/// of it goes into the info chunk (None: not asked).
fn lock_memory_if_asked() -> Option<String> {
    if std::env::var("LOOPSCOPE_MLOCKALL").ok().as_deref() != Some("1") {
        return None;
    }
    // SAFETY: mlockall takes flags only.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } == 0 {
        Some("mlockall".into())
    } else {
        Some(format!("mlockall failed: {} (RLIMIT_MEMLOCK or CAP_IPC_LOCK)", std::io::Error::last_os_error()))
    }
}

/// The file's head: its header, what wrote it (the info chunk, with the
/// streams) and the first two clock calibration pairs; the offset after it.
fn write_head(file: &mut File, path: &Path, config: &Config) -> Result<u64, Error> {
    let kind = clock::kind();
    let p0 = clock::calibration_pair(50);
    // Two pairs 2 ms apart give a rate good to ~1e-5 even if the writer never
    // runs again (killed process); the writer adds pairs through the run.
    let t_end = std::time::Instant::now() + Duration::from_millis(2);
    while std::time::Instant::now() < t_end {
        std::hint::spin_loop();
    }
    let p1 = clock::calibration_pair(50);
    let raw_hz = match kind {
        clock::ClockKind::Tsc => clock::rate_hz(&p0, &p1),
        clock::ClockKind::Mono => 1e9,
    };
    let info = Info {
        format: "loopscope-trace".into(),
        version: [format::VERSION_MAJOR, format::VERSION_MINOR],
        writer: format!("loopscope-trace {}", env!("CARGO_PKG_VERSION")),
        host: host_name(),
        pid: std::process::id(),
        process: process_name(),
        clock: kind.as_str().into(),
        clock_reason: clock::reason(),
        raw_hz,
        start_mono_ns: p0.mono_ns,
        start_realtime_ns: p0.realtime_ns,
        streams: config
            .streams
            .iter()
            .enumerate()
            .map(|(i, s)| StreamInfo {
                id: i as u16,
                name: s.name.clone(),
                kind: s.kind.as_str().into(),
                groups: s.groups.clone(),
                buffer_bytes: s.buffer_bytes(),
            })
            .collect(),
        block_bytes: format::BLOCK,
        memory_locked: lock_memory_if_asked(),
    };
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(&format::file_header());
    format::push_json(&mut out, chunk::INFO, 0, 0, &info);
    format::push_json(&mut out, chunk::CALIBRATION, 0, 0, &vec![p0, p1]);
    file.write_all(&out).map_err(|e| Error::input(format!("{}: offset 0: cannot write the trace file: {e}", path.display())))?;
    let offset = out.len() as u64;
    Ok(offset)
}

pub fn open(path: &Path, config: Config) -> Result<(), Error> {
    config.validate("configuration")?;
    register_fork_handlers();
    let mut g = session();
    if let Some(s) = g.as_ref() {
        return Err(Error::input(format!("{}: a trace is already open in this process ({}); close it first", path.display(), s.shared.path.display())));
    }
    let mut file = File::create(path)
        .map_err(|e| Error::input(format!("{}: cannot create the trace file: {e}; check that the directory exists and is writable", path.display())))?;
    let offset = write_head(&mut file, path, &config)?;

    let epoch = EPOCH.fetch_add(1, Ordering::SeqCst) + 1;
    let shared = Arc::new(Shared {
        epoch,
        path: path.to_path_buf(),
        config: config.clone(),
        threads: Mutex::new(Vec::new()),
        next_thread: std::sync::atomic::AtomicU32::new(0),
        stop: AtomicBool::new(false),
        writer: OnceLock::new(),
        triggers: Mutex::new(Vec::new()),
        changes: Mutex::new(Vec::new()),
        lost_unattached: AtomicU64::new(0),
        flush_req: AtomicU64::new(0),
        flush_done: Mutex::new(0),
        flush_cv: Condvar::new(),
        bytes_written: AtomicU64::new(offset),
        writer_tid: std::sync::atomic::AtomicI32::new(0),
    });
    let ws = shared.clone();
    let writer = std::thread::Builder::new()
        .name("loopscope-wr".into())
        .spawn(move || writer::run(ws, file, offset))
        .map_err(|e| Error::failed(format!("cannot start the trace writer thread: {e}")))?;
    let _ = shared.writer.set(writer.thread().clone());
    {
        let mut c = control();
        c.filters = config.streams.iter().map(|s| StreamFilter { patterns: s.groups.clone(), overrides: Default::default() }).collect();
        c.remask_all();
    }
    *g = Some(Session { shared, writer });
    Ok(())
}

/// Close the open trace: drain every buffer, write the end chunk.
pub fn close() -> Result<End, Error> {
    let s = session().take().ok_or_else(|| Error::input("no trace is open".to_string()))?;
    {
        let mut c = control();
        c.filters.clear();
        c.remask_all();
    }
    EPOCH.fetch_add(1, Ordering::SeqCst);
    release_writer(&s.shared);
    s.shared.stop.store(true, Ordering::Release);
    s.shared.wake_writer();
    let end = s.writer.join().map_err(|_| Error::failed("the trace writer thread panicked".into()))?;
    match &end.error {
        Some(e) => Err(Error::input(e.clone())),
        None => Ok(end),
    }
}

/// The measuring is over: an idle-policy writer confined away from the
/// measured CPUs could wait behind a busy neighbour for seconds (a nice -20
/// hog on its only CPU held a 1 s probe's close for 5-18 s), so it gets the
/// normal policy and the closing thread's CPUs to drain what is left.
fn release_writer(sh: &Shared) {
    let tid = sh.writer_tid.load(Ordering::Acquire);
    if tid <= 0 || !sh.config.writer_idle {
        return;
    }
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscalls on a thread of this process; a refusal leaves it as it was.
    unsafe {
        libc::sched_setscheduler(tid, libc::SCHED_OTHER, &p);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// Wait until the writer has drained everything logged before this call.
pub fn flush() -> Result<(), Error> {
    let sh = current().ok_or_else(|| Error::input("no trace is open".to_string()))?;
    let want = sh.flush_req.fetch_add(1, Ordering::AcqRel) + 1;
    sh.wake_writer();
    let mut done = sh.flush_done.lock().unwrap_or_else(|e| e.into_inner());
    while *done < want {
        let (d, t) = sh.flush_cv.wait_timeout(done, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner());
        done = d;
        if t.timed_out() {
            sh.wake_writer();
        }
    }
    Ok(())
}

/// Switch a group on or off in one stream of the open session.
pub fn enable_group(stream: &str, group: &str, on: bool) -> Result<(), Error> {
    let sh = current().ok_or_else(|| Error::input("no trace is open".to_string()))?;
    let sid = sh.stream_id(stream)?;
    {
        let mut c = control();
        if let Some(f) = c.filters.get_mut(sid as usize) {
            f.overrides.insert(group.to_string(), on);
        }
        c.remask_group(group);
    }
    sh.changes.lock().unwrap_or_else(|e| e.into_inner()).push(format::ConfigChange { raw: clock::now_raw(), stream: sid, group: group.into(), enabled: on });
    Ok(())
}

/// Fire the flight recorder `stream`: its buffered records are written out.
pub fn trigger(stream: &str, tag: u32) -> Result<(), Error> {
    let sh = current().ok_or_else(|| Error::input("no trace is open".to_string()))?;
    let sid = sh.stream_id(stream)?;
    if sh.config.streams[sid as usize].kind != StreamKind::Ring {
        return Err(Error::input(format!("stream {stream:?} is a normal stream; only ring streams are triggered")));
    }
    static TRIGGER: OnceLock<&'static crate::Entity> = OnceLock::new();
    let e = *TRIGGER.get_or_init(|| {
        entity::register("loopscope", "trigger", format::Kind::Event, "a flight-recorder stream was triggered (tag: caller's tag)", None)
            .expect("built-in entity")
    });
    e.event(tag);
    sh.triggers.lock().unwrap_or_else(|e| e.into_inner()).push(PendingTrigger { stream: sid, tag, raw: clock::now_raw() });
    sh.wake_writer();
    Ok(())
}

/// Count a record that was refused before reaching a buffer.
pub(crate) fn count_refused() {
    if let Some(s) = current() {
        s.lost_unattached.fetch_add(1, Ordering::Relaxed);
    }
}

/// A calibration pair now (for callers that want to log their own).
pub fn calibration_pair() -> CalPair {
    clock::calibration_pair(20)
}
