/* zoo-lock: the `blocked` case of `loopscope bench explain`.
 *
 * A program probe (its trace path from LOOPSCOPE_TRACE) with two threads
 * sharing one mutex. The measured thread, pinned to --cpu, wakes every
 * --period-us and logs how long it waited for the mutex (interval
 * lock/wait). The other thread, named zoo-holder and pinned to
 * --holder-cpu, takes the mutex for --hold-us every --every-us, but only
 * while the gate is open (--gate FILE: a load of the injected phase holds a
 * lock on FILE); otherwise it sleeps. explain must name the wait
 * `blocked: zoo-holder`. Stops on SIGINT or SIGTERM.
 *
 * The `inversion` case runs it with --fifo PRIO (the measured thread
 * SCHED_FIFO) and no gate (the holder always takes the mutex), while a CPU
 * hog of the injected phase shares the holder's CPU: the holder, SCHED_OTHER,
 * is preempted while it holds the mutex and the real-time thread waits for
 * both (a priority inversion): explain must name the chain
 * `blocked: zoo-holder ← preempted by load: hog`. --pi gives the mutex
 * priority inheritance (PTHREAD_PRIO_INHERIT), the remedy: the holder then
 * runs at the waiter's priority while it holds it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <loopscope.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "zoo_common.h"

static volatile sig_atomic_t stop_now = 0;
static void on_stop(int sig) { (void)sig; stop_now = 1; }
static pthread_mutex_t lock;
static const char *gate_path = NULL;
static long hold_ns = 3000000, every_ns = 8000000;
static int holder_cpu = 0;

static void sleep_until(int64_t t) {
    struct timespec ts = {t / 1000000000LL, t % 1000000000LL};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR && !stop_now) {}
}

/* open while the gate's load holds its lock (`flock FILE sleep …`: the
 * kernel lets go of it when that process dies, however it dies) */
static int gate_open(void) {
    if (!gate_path) return 1;
    int fd = open(gate_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd); /* drops a lock this took */
    return held;
}

static void *holder(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "zoo-holder");
    pin(holder_cpu);
    int64_t next = now_ns();
    while (!stop_now) {
        if (gate_open()) {
            pthread_mutex_lock(&lock);
            int64_t end = now_ns() + hold_ns;
            while (now_ns() < end) {}
            pthread_mutex_unlock(&lock);
        }
        next += every_ns;
        if (next < now_ns()) next = now_ns();
        sleep_until(next);
    }
    return NULL;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--gate") == 0) gate_path = argv[i + 1];
    int cpu = (int)opt(argc, argv, "--cpu", 1);
    holder_cpu = (int)opt(argc, argv, "--holder-cpu", 0);
    int64_t period = opt(argc, argv, "--period-us", 1000) * 1000;
    hold_ns = opt(argc, argv, "--hold-us", 3000) * 1000;
    every_ns = opt(argc, argv, "--every-us", 8000) * 1000;
    int fifo = (int)opt(argc, argv, "--fifo", 0), pi = 0;
    for (int i = 1; i < argc; i++) pi |= strcmp(argv[i], "--pi") == 0;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    if (pi) pthread_mutexattr_setprotocol(&ma, PTHREAD_PRIO_INHERIT);
    pthread_mutex_init(&lock, &ma);
    signal(SIGINT, on_stop);
    signal(SIGTERM, on_stop);
    prctl(PR_SET_NAME, "zoo-lock");
    if (ls_open(NULL, NULL) != 0) {
        fprintf(stderr, "zoo-lock: %s\n", ls_last_error());
        return 1;
    }
    const ls_entity *wait = ls_register("lock", "wait", LS_KIND_INTERVAL, "how long each period waited for the shared mutex");
    pthread_t h;
    pthread_create(&h, NULL, holder, NULL);
    pin(cpu);
    if (fifo > 0) {
        struct sched_param sp = {.sched_priority = fifo};
        int e = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
        if (e) fprintf(stderr, "zoo-lock: SCHED_FIFO %d: %s\n", fifo, strerror(e));
    }
    ls_thread_init();
    int64_t next = now_ns() + period;
    uint32_t n = 0;
    while (!stop_now) {
        sleep_until(next);
        uint64_t t0 = ls_now();
        pthread_mutex_lock(&lock);
        ls_interval(wait, n++, t0);
        pthread_mutex_unlock(&lock);
        next += period;
        if (next < now_ns()) next = now_ns() + period;
    }
    pthread_join(h, NULL);
    if (ls_close() != 0) {
        fprintf(stderr, "zoo-lock: %s\n", ls_last_error());
        return 1;
    }
    return 0;
}
