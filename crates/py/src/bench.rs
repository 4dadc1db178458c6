//! The Rust side of `loopscope bench trace`: the memory floor, the compiled environment, events and sustained rates.

use super::*;

// ---- benchmarks: the Rust side of `loopscope bench trace` --------------------

pub(crate) const FLOOR_WORDS: usize = 8 * 1024 * 1024 / 8;

/// ns per iteration of a TSC read + 16-byte store into an 8 MiB buffer, per repetition.
#[pyfunction]
pub(crate) fn bench_floor(py: Python<'_>, n: u64, reps: usize) -> PyResult<Vec<f64>> {
    detached(py, || {
        let mut buf = vec![0u64; FLOOR_WORDS];
        (0..reps)
            .map(|_| {
                let t0 = Instant::now();
                for i in 0..n {
                    let t = clock::rdtsc();
                    let k = (i as usize * 2) & (FLOOR_WORDS - 1);
                    unsafe {
                        let p = buf.as_mut_ptr().add(k);
                        p.write_volatile(i);
                        p.add(1).write_volatile(t);
                    }
                }
                t0.elapsed().as_nanos() as f64 / n as f64
            })
            .collect()
    })
}

pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub(crate) const ENV_WORDS: usize = 256 * 1024; // 2 MiB: in the last-level cache when the machine is quiet

/// The compiled execution environment of a node model: per batch, thread
/// CPU ns per operation (an xorshift step, a dependent load and a store in
/// a 2 MiB table: arithmetic and cache traffic like compiled application
/// code), `batches` batches of `ops` operations.
#[pyfunction]
pub(crate) fn env_compiled(py: Python<'_>, ops: u64, batches: usize) -> PyResult<Vec<f64>> {
    detached(py, || {
        let mut t: Vec<u64> = (0..ENV_WORDS as u64).collect();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..batches)
            .map(|_| {
                let c0 = thread_cpu_ns();
                for _ in 0..ops {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = (x as usize) & (ENV_WORDS - 1);
                    let v = unsafe { std::ptr::read_volatile(t.as_ptr().add(k)) };
                    unsafe { std::ptr::write_volatile(t.as_mut_ptr().add((v as usize ^ k) & (ENV_WORDS - 1)), x) };
                }
                (thread_cpu_ns() - c0) as f64 / ops as f64
            })
            .collect()
    })
}

pub(crate) fn bench_entity() -> PyResult<&'static Entity> {
    register("bench", "rust", Kind::Event, "benchmark event (Rust loop)", None).map_err(err)
}

/// ns per event of `threads` threads each logging `n` events, per repetition
/// (mean over threads). A trace must be open with group `bench` enabled.
#[pyfunction]
#[pyo3(signature = (n, reps, threads=1))]
pub(crate) fn bench_events(py: Python<'_>, n: u64, reps: usize, threads: usize) -> PyResult<Vec<f64>> {
    let e = bench_entity()?;
    if !e.enabled() {
        return Err(InputError::new_err("open a trace with group 'bench' enabled first"));
    }
    detached(py, || {
        (0..reps)
            .map(|_| {
                let bar = Arc::new(std::sync::Barrier::new(threads));
                let hs: Vec<_> = (0..threads)
                    .map(|_| {
                        let bar = bar.clone();
                        std::thread::spawn(move || {
                            e.event(0);
                            let _ = session::flush();
                            bar.wait();
                            let t0 = Instant::now();
                            for i in 0..n {
                                e.event(i as u32);
                            }
                            t0.elapsed().as_nanos() as f64 / n as f64
                        })
                    })
                    .collect();
                let v: Vec<f64> = hs.into_iter().map(|h| h.join().unwrap_or(f64::NAN)).collect();
                let _ = session::flush();
                v.iter().sum::<f64>() / v.len() as f64
            })
            .collect()
    })
}

/// Log events from one thread for `seconds`: paced at `rate` events/s
/// (absolute deadlines checked every 64 events), or as fast as possible when
/// `rate` is 0. Returns (events logged, seconds taken).
#[pyfunction]
pub(crate) fn bench_sustained(py: Python<'_>, rate: f64, seconds: f64) -> PyResult<(u64, f64)> {
    let e = bench_entity()?;
    if !e.enabled() {
        return Err(InputError::new_err("open a trace with group 'bench' enabled first"));
    }
    detached(py, || {
        let t0 = Instant::now();
        let end = Duration::from_secs_f64(seconds);
        let mut n = 0u64;
        loop {
            let el = t0.elapsed();
            if el >= end {
                break;
            }
            if rate > 0.0 {
                let due = (el.as_secs_f64() * rate) as u64;
                if n >= due {
                    std::hint::spin_loop();
                    continue;
                }
            }
            for _ in 0..64 {
                e.event(n as u32);
                n += 1;
            }
        }
        (n, t0.elapsed().as_secs_f64())
    })
}

pub(crate) fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(bench_floor, m)?)?;
    m.add_function(wrap_pyfunction!(env_compiled, m)?)?;
    m.add_function(wrap_pyfunction!(bench_events, m)?)?;
    m.add_function(wrap_pyfunction!(bench_sustained, m)?)?;
    Ok(())
}
