/*
 * The C side of `loopscope bench trace`: tight loops that log through
 * include/loopscope.h, next to the floor they are compared with (a TSC read
 * and a 16-byte store into a buffer the size of a trace ring). Each mode runs
 * REPS repetitions of N iterations and prints one JSON line with the
 * nanoseconds per iteration of every repetition; the Python side takes the
 * medians. Modes: paired (floor and event repetitions alternating, so both
 * see the same machine), floor, event, disabled, threads2.
 */
#define _GNU_SOURCE
#include <loopscope.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

#define RING_WORDS (8u * 1024 * 1024 / 8)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t *floor_buf;

static double run_floor(uint64_t n) {
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < n; i++) {
        uint64_t t = __rdtsc();
        uint64_t *p = &floor_buf[(i * 2) & (RING_WORDS - 1)];
        p[0] = i;
        p[1] = t;
        __asm__ volatile("" ::: "memory");
    }
    return (double)(now_ns() - t0) / (double)n;
}

static const ls_entity *ev_on, *ev_off;

static double run_event(const ls_entity *e, uint64_t n) {
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < n; i++) {
        ls_event(e, (uint32_t)i);
        __asm__ volatile("" ::: "memory");
    }
    return (double)(now_ns() - t0) / (double)n;
}

struct targ {
    uint64_t n;
    double ns;
    pthread_barrier_t *bar;
};

static void *thread_main(void *p) {
    struct targ *a = p;
    ls_event(ev_on, 0); /* attach this thread's buffers outside the timed loop */
    ls_flush();
    pthread_barrier_wait(a->bar);
    a->ns = run_event(ev_on, a->n);
    return NULL;
}

static void print_reps(const char *mode, double *v, int reps) {
    printf("{\"mode\": \"%s\", \"ns\": [", mode);
    for (int r = 0; r < reps; r++) printf("%s%.4f", r ? ", " : "", v[r]);
    printf("]}\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODE N REPS TRACE [RATE SECONDS]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    uint64_t n = strtoull(argv[2], NULL, 10);
    int reps = atoi(argv[3]);
    const char *trace = argv[4];
    double v[256];
    if (reps > 256) reps = 256;
    floor_buf = aligned_alloc(4096, RING_WORDS * 8);
    memset(floor_buf, 0, RING_WORDS * 8);

    if (ls_open(trace, NULL) != 0) {
        fprintf(stderr, "ls_open: %s\n", ls_last_error());
        return 1;
    }
    ev_on = ls_register("bench", "on", LS_KIND_EVENT, "benchmark event, enabled");
    ev_off = ls_register("bench-off", "off", LS_KIND_EVENT, "benchmark event, disabled");
    ls_enable_group("main", "bench-off", 0);
    ls_event(ev_on, 0);
    ls_flush();

    if (!strcmp(mode, "paired")) {
        double f[256];
        for (int r = 0; r < reps; r++) {
            f[r] = run_floor(n);
            v[r] = run_event(ev_on, n);
            ls_flush();
        }
        print_reps("floor", f, reps);
        print_reps("event", v, reps);
    } else if (!strcmp(mode, "floor") || !strcmp(mode, "event") || !strcmp(mode, "disabled")) {
        for (int r = 0; r < reps; r++) {
            if (!strcmp(mode, "floor")) v[r] = run_floor(n);
            else if (!strcmp(mode, "event")) v[r] = run_event(ev_on, n);
            else v[r] = run_event(ev_off, n);
            /* Let the writer drain between repetitions so none is cut by a full buffer. */
            ls_flush();
        }
        print_reps(mode, v, reps);
    } else if (!strcmp(mode, "threads2")) {
        for (int r = 0; r < reps; r++) {
            pthread_barrier_t bar;
            pthread_barrier_init(&bar, NULL, 2);
            pthread_t th[2];
            struct targ a[2] = {{n, 0, &bar}, {n, 0, &bar}};
            for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, thread_main, &a[i]);
            for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
            v[r] = (a[0].ns + a[1].ns) / 2;
            ls_flush();
        }
        print_reps(mode, v, reps);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    if (ls_close() != 0) {
        fprintf(stderr, "ls_close: %s\n", ls_last_error());
        return 1;
    }
    printf("{\"lost\": %llu}\n", (unsigned long long)ls_lost_records());
    return 0;
}
