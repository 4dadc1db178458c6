//! Kernel trace events, from the binary ring-buffer pages of a tracefs
//! instance straight into columns.
//!
//! loopscope's kernel capture lets the kernel write tracepoints into the
//! per-CPU ring buffers of a tracefs instance of the run's own and reads them
//! between probe windows (`trace_pipe_raw`, one sub-buffer page per read).
//! Nothing in user space formats text. This crate turns those pages into
//! typed columns, the way libtraceevent does, from the descriptions the kernel
//! publishes itself:
//!
//! - [`format`] parses `events/header_page` (where a page's timestamp, commit
//!   word and data sit) and each event's `format` file (its id, every field's
//!   offset, size and sign, `__data_loc` strings, the symbol tables of its
//!   print format);
//! - [`page`] walks one page's compressed event headers (time deltas, time
//!   extends, absolute stamps, padding) and says whether the kernel dropped
//!   events before it, and how many when it stored the count;
//! - [`decode`] keeps only the fields attribution needs, interns task names
//!   and labels, and places every loss on its CPU between the last event that
//!   arrived and the first one after it.
//!
//! - [`attrib`] splits windows of threads into causes (who ran, which
//!   interrupt, idle, timer slack, page faults, whom a blocked thread waited
//!   for) from those columns, a cluster of windows per call; [`switches`]
//!   says who ran from `sched_switch` where no runtime events were recorded.
//!
//! - [`tracedat`] and [`import`] read recordings made by trace-cmd
//!   (`trace.dat`, versions 6 and 7) and perf (`perf.data`) into the same
//!   columns.
//!
//! A page that cannot be walked (cut short, a length past its end) is counted
//! as damaged and becomes a loss window of unknown size; it never panics.

pub mod activations;
pub mod attrib;
pub mod decode;
pub mod format;
pub mod import;
mod intern;
pub mod page;
mod percpu;
pub mod perfdata;
pub mod segment;
pub mod switches;
pub mod tracedat;
