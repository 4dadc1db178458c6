/*
 * Writes the golden trace tests/fixtures/golden-v1.lstrace (checked in) and,
 * in the tests, a fresh one, with the same deterministic records. The Rust
 * reader (crates/trace/tests/golden.rs) and the Python reader
 * (tests/trace/test_golden.py) both check the fixture against
 * tests/fixtures/golden-v1.json, so a change in the format or in either
 * reader that breaks old files fails. Usage: golden_writer TRACE
 */
#include <loopscope.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 2 || ls_open(argv[1], NULL) != 0) {
        fprintf(stderr, "golden_writer: %s\n", argc < 2 ? "usage: golden_writer TRACE" : ls_last_error());
        return 1;
    }
    const ls_entity *ev = ls_register("golden", "event", LS_KIND_EVENT, "events with tags, values and payloads");
    const ls_entity *iv = ls_register("golden", "interval", LS_KIND_INTERVAL, "intervals on CLOCK_MONOTONIC");
    const ls_entity *ct = ls_register("golden", "counter", LS_KIND_COUNTER, "a counter");
    const ls_entity *hs = ls_register_histogram("golden", "hist", "a log-linear histogram", LS_HIST_LOG, 0, 1000, 4);
    for (unsigned i = 1; i <= 3; i++) ls_event(ev, i);
    ls_event_value(ev, 4, -123456789);
    ls_event_payload(ev, 5, "golden", 6);
    for (unsigned i = 0; i < 3; i++) ls_interval_mono(iv, i, 1000000 + 1000 * i, 10 * i + 1);
    ls_counter_add(ct, 40);
    ls_counter_add(ct, 2);
    ls_counter_log(ct);
    ls_counter_reset(ct);
    const int64_t vals[] = {0, 3, 15, 16, 17, 100, 999, 1000, 5000, -7};
    for (unsigned i = 0; i < sizeof vals / sizeof vals[0]; i++) ls_histogram_add(hs, vals[i]);
    ls_histogram_log(hs);
    return ls_close() == 0 ? 0 : 1;
}
