//! loopscope's probes: native loops that measure a machine.
//!
//! Each probe is a module with a config struct, a result struct and a `run`
//! that takes a stop flag, so callers (the CLI, the agent) can end it early
//! and still get what was measured. Probes log into the trace under their own
//! group when a session is open.

pub mod error;
pub mod net;
pub mod os;
pub mod sched;
pub mod syscall;
pub mod timer;
