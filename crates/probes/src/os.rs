//! The few operating-system calls every probe loop makes: the monotonic
//! clock, sleeping until an absolute deadline, pinning to a CPU.

/// CLOCK_MONOTONIC in nanoseconds (raw: the probes' own deadlines).
pub use loopscope_os::mono_ns;

/// Sleep until CLOCK_MONOTONIC reaches `t` (absolute, so no drift accumulates).
pub fn sleep_until(t: i64) {
    let ts = libc::timespec { tv_sec: (t / 1_000_000_000) as libc::time_t, tv_nsec: (t % 1_000_000_000) as libc::c_long };
    while unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) } == libc::EINTR {}
}

/// Pin the calling thread to `cpu`; false when refused.
pub fn pin(cpu: usize) -> bool {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}
