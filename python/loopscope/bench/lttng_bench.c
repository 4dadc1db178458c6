/*
 * The LTTng-UST side of `loopscope bench trace`: the same loop as the
 * loopscope "event" mode, with an LTTng-UST tracepoint instead of ls_event.
 * Run inside an active LTTng session with the event enabled. Prints one JSON
 * line with ns per event of each repetition.
 */
#define _GNU_SOURCE
#define LTTNG_UST_TRACEPOINT_CREATE_PROBES
#define LTTNG_UST_TRACEPOINT_DEFINE
#include "lttng_tp.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s N REPS\n", argv[0]);
        return 2;
    }
    uint64_t n = strtoull(argv[1], NULL, 10);
    int reps = atoi(argv[2]);
    if (!lttng_ust_tracepoint_enabled(loopscope_bench, ev)) {
        fprintf(stderr, "the LTTng event loopscope_bench:ev is not enabled in an active session\n");
        return 3;
    }
    printf("{\"mode\": \"lttng\", \"ns\": [");
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = now_ns();
        for (uint64_t i = 0; i < n; i++) {
            lttng_ust_tracepoint(loopscope_bench, ev, (unsigned int)i);
            __asm__ volatile("" ::: "memory");
        }
        double ns = (double)(now_ns() - t0) / (double)n;
        printf("%s%.4f", r ? ", " : "", ns);
        usleep(200000); /* let the consumer daemon drain, as the loopscope loop flushes */
    }
    printf("]}\n");
    return 0;
}
