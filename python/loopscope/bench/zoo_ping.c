/* zoo-ping: the `timers` case of `loopscope bench explain`.
 *
 * A program probe (its trace path from LOOPSCOPE_TRACE) whose measured
 * thread is woken by another thread, not by a timer of its own: a timer
 * probe's every wake-up comes in a timer interrupt on its own CPU, so that
 * interrupt is in every one of its windows, injected or not. Here the
 * thread zoo-waker, pinned to --waker-cpu, wakes every --period-us at an
 * absolute deadline and writes an eventfd; the measured thread (on the CPUs
 * the lab pins the program to: its `cpu`, which a remedy phase's affinity
 * tuning changes; --cpu pins it here instead) blocks reading it and logs,
 * per wake-up, from the write to when it
 * ran (interval ping/wake, split like a timer's wake-up). The timer
 * interrupt of its CPU is in a window only when timers expire there while
 * it is being woken: what the case injects. Stops on SIGINT or SIGTERM.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <loopscope.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "zoo_common.h"

static volatile sig_atomic_t stop_now = 0;
static void on_stop(int sig) { (void)sig; stop_now = 1; }
static int efd = -1;
static int waker_cpu = 0;
static int64_t period_ns = 1000000;
/* when the waker wrote (CLOCK_MONOTONIC ns), read by the measured thread */
static _Atomic int64_t sent_ns = 0;

static void *waker(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "zoo-waker");
    pin(waker_cpu);
    prctl(PR_SET_TIMERSLACK, 1UL);
    int64_t next = now_ns() + period_ns;
    uint64_t one = 1;
    while (!stop_now) {
        struct timespec ts = {next / 1000000000LL, next % 1000000000LL};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR && !stop_now) {}
        atomic_store(&sent_ns, now_ns());
        if (write(efd, &one, sizeof one) < 0 && errno != EAGAIN) break;
        next += period_ns;
        if (next < now_ns()) next = now_ns() + period_ns;
    }
    /* wake the reader once more so it sees stop_now */
    (void)!write(efd, &one, sizeof one);
    return NULL;
}

int main(int argc, char **argv) {
    int cpu = (int)opt(argc, argv, "--cpu", -1);
    waker_cpu = (int)opt(argc, argv, "--waker-cpu", 0);
    period_ns = opt(argc, argv, "--period-us", 1000) * 1000;
    signal(SIGINT, on_stop);
    signal(SIGTERM, on_stop);
    prctl(PR_SET_NAME, "zoo-ping");
    efd = eventfd(0, EFD_CLOEXEC);
    if (efd < 0) {
        perror("zoo-ping: eventfd");
        return 1;
    }
    if (ls_open(NULL, NULL) != 0) {
        fprintf(stderr, "zoo-ping: %s\n", ls_last_error());
        return 1;
    }
    const ls_entity *wake = ls_register("ping", "wake", LS_KIND_INTERVAL, "from the other thread's write to when this one ran");
    pthread_t w;
    pthread_create(&w, NULL, waker, NULL);
    /* pinned after ls_open: the trace writer it starts keeps off this CPU */
    if (cpu >= 0) pin(cpu);
    ls_thread_init();
    uint32_t n = 0;
    uint64_t v;
    while (!stop_now) {
        if (read(efd, &v, sizeof v) != sizeof v) {
            if (errno == EINTR) continue;
            break;
        }
        int64_t t = now_ns(), s = atomic_load(&sent_ns);
        if (!stop_now && s > 0 && t >= s) ls_interval_mono(wake, n++, (uint64_t)s, (uint64_t)(t - s));
    }
    pthread_join(w, NULL);
    if (ls_close() != 0) {
        fprintf(stderr, "zoo-ping: %s\n", ls_last_error());
        return 1;
    }
    return 0;
}
