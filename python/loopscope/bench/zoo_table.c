/* zoo-table: the `faults` case and the warm-up anomaly of `loopscope bench explain`.
 *
 * A program probe (trace path from LOOPSCOPE_TRACE): a periodic control
 * loop on --cpu that wakes every --period-us at an absolute deadline and,
 * each cycle, reads --lookups entries at random from a --table-mib lookup
 * table (its model, a map, a filter bank). It logs each cycle from its
 * deadline to the end of its work (interval loop/cycle), and the work alone
 * (loop/work: the same work every cycle, so its run time is the program's
 * own measure of how fast the CPU and memory served it). With --chase the
 * lookups follow a chain through the table (each read names the next, a
 * random cycle over its cache lines): no two overlap, so each costs the
 * memory's full latency (the `slowdown` case: a neighbour that takes the
 * shared cache or the memory bandwidth shows as longer work, no kernel event
 * in its way). --table-kib sizes the table finer than --table-mib. --shm
 * FILE puts the table in FILE (made if missing, kept), mapped shared, so a
 * neighbour can map it too (`ls-zoo share`). Its memory is
 * locked only with --mlock (mlockall), so memory pressure on it (the bench
 * pages its memory out) turns into page faults inside the cycle. Stops on
 * SIGINT or SIGTERM.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <loopscope.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "zoo_common.h"

static volatile sig_atomic_t stop_now = 0;
static void on_stop(int sig) { (void)sig; stop_now = 1; }

int main(int argc, char **argv) {
    int cpu = (int)opt(argc, argv, "--cpu", 1);
    int64_t period = opt(argc, argv, "--period-us", 1000) * 1000;
    size_t bytes = (size_t)opt(argc, argv, "--table-mib", 64) << 20;
    if (opt(argc, argv, "--table-kib", 0) > 0) bytes = (size_t)opt(argc, argv, "--table-kib", 0) << 10;
    int chase = 0;
    long lookups = opt(argc, argv, "--lookups", 64);
    int lock = 0;
    for (int i = 1; i < argc; i++) {
        lock |= strcmp(argv[i], "--mlock") == 0;
        chase |= strcmp(argv[i], "--chase") == 0;
    }
    signal(SIGINT, on_stop);
    signal(SIGTERM, on_stop);
    prctl(PR_SET_NAME, "zoo-table");
    if (lock && mlockall(MCL_CURRENT | MCL_FUTURE) != 0) perror("zoo-table: mlockall");
    const char *shm = NULL;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--shm") == 0) shm = argv[i + 1];
    uint64_t *table;
    if (shm) {
        int fd = open(shm, O_RDWR | O_CREAT, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
            fprintf(stderr, "zoo-table: %s: %s\n", shm, strerror(errno));
            return 1;
        }
        table = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
    } else {
        table = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (table == MAP_FAILED) {
        perror("zoo-table: mmap");
        return 1;
    }
    madvise(table, bytes, MADV_NOHUGEPAGE);
    size_t n = bytes / sizeof *table;
    for (size_t i = 0; i < n; i++) table[i] = i * 2654435761u;
    size_t lines = n / 8;
    if (chase && lines > 1) {
        /* Sattolo's shuffle: one cycle through every line, in random order */
        uint64_t *order = malloc(lines * sizeof *order);
        uint64_t r = 0x9E3779B97F4A7C15u;
        if (!order) {
            perror("zoo-table: malloc");
            return 1;
        }
        for (size_t i = 0; i < lines; i++) order[i] = i;
        for (size_t i = lines - 1; i > 0; i--) {
            r ^= r << 13; r ^= r >> 7; r ^= r << 17;
            size_t j = (size_t)(r % i), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (size_t i = 0; i < lines; i++) table[order[i] * 8] = order[(i + 1) % lines] * 8;
        free(order);
    }
    if (ls_open(NULL, NULL) != 0) {
        fprintf(stderr, "zoo-table: %s\n", ls_last_error());
        return 1;
    }
    /* pinned after ls_open: the trace writer it starts keeps off this CPU */
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
    const ls_entity *cycle = ls_register("loop", "cycle", LS_KIND_INTERVAL, "one cycle: from its deadline to the end of its lookups");
    const ls_entity *work = ls_register("loop", "work", LS_KIND_INTERVAL, "one cycle's lookups, the same work every cycle");
    ls_thread_init();
    uint64_t x = 88172645463325252u, sum = 0;
    int64_t next = now_ns() + period;
    uint32_t k = 0;
    while (!stop_now) {
        struct timespec ts = {next / 1000000000LL, next % 1000000000LL};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR && !stop_now) {}
        int64_t began = now_ns();
        if (chase) {
            uint64_t at = 0;
            for (long j = 0; j < lookups; j++) at = table[at];
            sum += at;
        } else {
            for (long j = 0; j < lookups; j++) {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                sum += table[x % n];
            }
        }
        int64_t ended = now_ns();
        ls_interval_mono(work, k, (uint64_t)began, (uint64_t)(ended - began));
        ls_interval_mono(cycle, k++, (uint64_t)next, (uint64_t)(ended - next));
        next += period;
        if (next < now_ns()) next = now_ns() + period;
    }
    if (ls_close() != 0) {
        fprintf(stderr, "zoo-table: %s\n", ls_last_error());
        return 1;
    }
    return sum == 42 ? 3 : 0;
}
