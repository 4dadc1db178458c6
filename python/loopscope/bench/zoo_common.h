/* What the cause zoo's small programs share: the monotonic clock in ns,
 * pinning to a CPU, and reading a "--name value" option. Included by each
 * zoo_*.c after its system headers (with _GNU_SOURCE defined first). */
#ifndef LOOPSCOPE_ZOO_COMMON_H
#define LOOPSCOPE_ZOO_COMMON_H

#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Pin the calling thread to one CPU; 0 when it took. */
static inline int pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return sched_setaffinity(0, sizeof s, &s);
}

/* The integer after "--name" on the command line, or dflt. */
static inline long opt(int argc, char **argv, const char *name, long dflt) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return strtol(argv[i + 1], NULL, 10);
    return dflt;
}

#endif
