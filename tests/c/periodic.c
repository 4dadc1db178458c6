/* A periodic thread that measures its own lateness as cyclictest does:
 * sleep to an absolute deadline every PERIOD µs, read the clock once
 * running, and print the p50/p99/max of (clock - deadline) in ns.
 * Usage: periodic N [PERIOD_US]. No loopscope in it: the tests measure it
 * from the kernel alone and compare. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static int cmp(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    long period = (argc > 2 ? atol(argv[2]) : 1000) * 1000L;
    long *lat = calloc((size_t)n, sizeof(long));
    struct timespec next, now;
    if (!lat || n < 1) return 2;
    prctl(PR_SET_NAME, "periodic");
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (int i = 0; i < n; i++) {
        next.tv_nsec += period;
        while (next.tv_nsec >= 1000000000L) { next.tv_nsec -= 1000000000L; next.tv_sec++; }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
        lat[i] = (now.tv_sec - next.tv_sec) * 1000000000L + (now.tv_nsec - next.tv_nsec);
        /* periods missed meanwhile are skipped, as cyclictest skips them */
        while (now.tv_sec > next.tv_sec || (now.tv_sec == next.tv_sec && now.tv_nsec > next.tv_nsec)) {
            next.tv_nsec += period;
            while (next.tv_nsec >= 1000000000L) { next.tv_nsec -= 1000000000L; next.tv_sec++; }
        }
        next.tv_nsec -= period;
        if (next.tv_nsec < 0) { next.tv_nsec += 1000000000L; next.tv_sec--; }
    }
    qsort(lat, (size_t)n, sizeof(long), cmp);
    printf("p50 %ld p99 %ld max %ld\n", lat[n / 2], lat[(n * 99) / 100], lat[n - 1]);
    return 0;
}
