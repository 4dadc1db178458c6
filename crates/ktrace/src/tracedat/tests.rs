//! Tests of `tracedat`.

use super::*;

#[test]
fn the_clock_in_brackets_is_the_selected_one() {
    assert_eq!(selected_clock("local global [mono] boot"), "mono");
    assert_eq!(selected_clock("local"), "local");
}

#[test]
fn saved_command_lines_become_pid_and_name() {
    assert_eq!(cmdlines("12 bash\n7 kworker/0:1 x\n"), vec![(12, "bash".into()), (7, "kworker/0:1 x".into())]);
}

#[test]
fn a_file_that_is_not_a_trace_is_said_to_be_so() {
    let e = tracing_data(b"PERFILE2 and more").unwrap_err();
    assert!(e.0.contains("not a trace-cmd"), "{e}");
}

#[test]
fn a_cut_short_section_names_what_it_was_reading() {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(b"0.6\0\0\x08");
    b.extend_from_slice(&4096u32.to_le_bytes());
    b.extend_from_slice(b"header_page\0");
    b.extend_from_slice(&100u64.to_le_bytes());
    let e = tracing_data(&b).unwrap_err();
    assert!(e.0.contains("header_page needs 100 bytes"), "{e}");
}
