/*
 * Exercises include/loopscope.h the way a C program uses it: every entity
 * kind, two threads, payloads, histograms, a run-time group switch, a
 * flight-recorder trigger, NULL handles and misuse. tests/trace/test_capi.py
 * compiles it, runs it and checks the trace with the Python reader.
 * Usage: capi_test TRACE CONFIG
 */
#include <loopscope.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "check failed at line %d: %s (%s)\n", __LINE__, #cond, ls_last_error()); \
            return 1;                                                          \
        }                                                                      \
    } while (0)

static const ls_entity *worker_ev;

static void *worker(void *arg) {
    unsigned base = (unsigned)(size_t)arg;
    if (ls_thread_init() != 0) return (void *)1;
    for (unsigned i = 0; i < 1000; i++) ls_event(worker_ev, base + i);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    CHECK(ls_open(argv[1], argv[2]) == 0);
    CHECK(ls_open(argv[1], argv[2]) == -1); /* one session at a time */
    CHECK(strstr(ls_last_error(), "already open") != NULL);

    const ls_entity *ev = ls_register("capi", "event", LS_KIND_EVENT, "a plain event");
    const ls_entity *iv = ls_register("capi", "interval", LS_KIND_INTERVAL, "an interval");
    const ls_entity *ct = ls_register("capi", "counter", LS_KIND_COUNTER, "a counter");
    const ls_entity *hs = ls_register_histogram("capi", "hist", "a histogram", LS_HIST_LINEAR, 0, 100, 10);
    const ls_entity *off = ls_register("quiet", "event", LS_KIND_EVENT, "a group the config leaves off");
    const ls_entity *fr = ls_register("flight", "event", LS_KIND_EVENT, "logged to the ring stream only");
    worker_ev = ls_register("capi", "worker", LS_KIND_EVENT, "logged from two threads");
    CHECK(ev && iv && ct && hs && off && fr && worker_ev);
    CHECK(ls_register("capi", "event", LS_KIND_EVENT, "") == ev); /* same name, same handle */
    CHECK(ls_register("capi", "event", LS_KIND_COUNTER, "") == NULL); /* wrong kind */
    CHECK(strstr(ls_last_error(), "registered as event") != NULL);
    CHECK(ls_register("bad/group", "x", LS_KIND_EVENT, "") == NULL);
    CHECK(ls_register_histogram("capi", "toobig", "", LS_HIST_LOG, 0, 1LL << 60, 12) == NULL);
    CHECK(ls_enabled(ev) && !ls_enabled(off) && ls_enabled(fr));

    ls_event(ev, 1);
    ls_event_value(ev, 2, -42);
    ls_event_payload(ev, 3, "hello", 5);
    uint64_t t0 = ls_now();
    ls_interval(iv, 4, t0);
    ls_interval_mono(iv, 5, 1000, 250);
    ls_counter_add(ct, 7);
    ls_counter_add(ct, 3);
    ls_counter_log(ct);
    ls_counter_reset(ct);
    ls_histogram_add(hs, 5);
    ls_histogram_add(hs, 15);
    ls_histogram_add(hs, 15);
    ls_histogram_add(hs, 500);
    ls_histogram_add(hs, -1);
    ls_histogram_log(hs);
    ls_event(off, 99); /* disabled: not written */
    ls_event(NULL, 1); /* NULL handle: ignored */
    LS_EVENT("capi", "macro", 6);
    LS_COUNTER_ADD("capi", "macro_counter", 1);

    CHECK(ls_enable_group("main", "quiet", 1) == 0);
    ls_event(off, 100); /* now written */
    CHECK(ls_enable_group("nosuch", "quiet", 1) == -1);

    for (unsigned i = 0; i < 50; i++) ls_event(fr, i);
    CHECK(ls_trigger("flight", 77) == 0);
    CHECK(ls_trigger("main", 1) == -1); /* only ring streams are triggered */
    ls_flush();
    ls_event(fr, 1000); /* after the dump: stays in memory */

    pthread_t th[2];
    for (size_t i = 0; i < 2; i++) pthread_create(&th[i], NULL, worker, (void *)(i * 10000));
    for (int i = 0; i < 2; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        CHECK(rv == NULL);
    }

    CHECK(ls_close() == 0);
    CHECK(ls_lost_records() == 0);
    CHECK(ls_close() == -1);
    CHECK(ls_thread_init() == -1); /* no trace open */
    puts("ok");
    return 0;
}
