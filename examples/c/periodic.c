/*
 * A periodic task in C, instrumented with loopscope: every period it wakes
 * at an absolute deadline (clock_nanosleep), logs how late it woke and how
 * long its work took, and counts the deadlines it missed.
 *
 *   gcc periodic.c $(loopscope-config --cflags --libs) -o periodic
 *   ./periodic periodic.lstrace 1000 2      # 1000 µs period, 2 s
 *   loopscope trace info periodic.lstrace
 *
 * As a probe of an experiment (kind: program) it takes its trace path from
 * the run: ls_open(NULL, NULL) reads LOOPSCOPE_TRACE.
 */
#include <loopscope.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static volatile uint64_t sink;

static void work(unsigned n) {
    uint64_t x = 0;
    for (unsigned i = 0; i < n; i++) x = x * 6364136223846793005u + 1442695040888963407u;
    sink = x;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : NULL;
    long period_us = argc > 2 ? atol(argv[2]) : 1000;
    double seconds = argc > 3 ? atof(argv[3]) : 2.0;
    if (ls_open(path, NULL) != 0) {
        fprintf(stderr, "periodic: %s\n", ls_last_error());
        return 1;
    }
    const ls_entity *late = ls_register("periodic", "wakeup", LS_KIND_INTERVAL, "how late each period woke, from its deadline");
    const ls_entity *busy = ls_register("periodic", "work", LS_KIND_INTERVAL, "one period's work");
    const ls_entity *missed = ls_register("periodic", "missed", LS_KIND_COUNTER, "deadlines passed before the wake-up");
    ls_thread_init();
    uint64_t period = (uint64_t)period_us * 1000u, next = mono_ns() + period;
    uint64_t end = next + (uint64_t)(seconds * 1e9);
    unsigned n = 0;
    while (next < end) {
        struct timespec ts = {(time_t)(next / 1000000000u), (long)(next % 1000000000u)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        uint64_t now = mono_ns();
        ls_interval_mono(late, n, next, now - next);
        uint64_t t0 = ls_now();
        work(20000);
        ls_interval(busy, n, t0);
        next += period;
        while (next < mono_ns()) { /* skipped periods: each one a missed deadline */
            ls_counter_add(missed, 1);
            next += period;
        }
        n++;
    }
    ls_counter_log(missed);
    if (ls_close() != 0) {
        fprintf(stderr, "periodic: %s\n", ls_last_error());
        return 1;
    }
    printf("%u periods, %llu records lost\n", n, (unsigned long long)ls_lost_records());
    return 0;
}
