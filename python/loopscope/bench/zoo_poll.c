/* zoo-poll: the quantization anomaly of `loopscope bench explain`.
 *
 * A program probe (trace path from LOOPSCOPE_TRACE) that waits for work the
 * way many do: a request becomes ready at a random time 0.2-12 ms after it
 * starts waiting, and the thread polls for it with short relative sleeps
 * (--poll-us). Its timer slack is --slack-ns (PR_SET_TIMERSLACK), so on an
 * idle CPU each sleep lasts about the slack, and every wait (interval
 * poll/wait) comes out near a multiple of it: the 5 ms quantization of
 * response times Boie & Niehaus saw, with the cause explain must name.
 * Stops on SIGINT or SIGTERM.
 */
#define _GNU_SOURCE
#include <loopscope.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "zoo_common.h"

static volatile sig_atomic_t stop_now = 0;
static void on_stop(int sig) { (void)sig; stop_now = 1; }

int main(int argc, char **argv) {
    int cpu = (int)opt(argc, argv, "--cpu", 1);
    long poll_ns = opt(argc, argv, "--poll-us", 200) * 1000;
    long slack = opt(argc, argv, "--slack-ns", 5000000);
    signal(SIGINT, on_stop);
    signal(SIGTERM, on_stop);
    prctl(PR_SET_NAME, "zoo-poll");
    if (prctl(PR_SET_TIMERSLACK, (unsigned long)slack) != 0) perror("zoo-poll: PR_SET_TIMERSLACK");
    if (ls_open(NULL, NULL) != 0) {
        fprintf(stderr, "zoo-poll: %s\n", ls_last_error());
        return 1;
    }
    /* pinned after ls_open: the trace writer it starts keeps off this CPU */
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
    const ls_entity *wait = ls_register("poll", "wait", LS_KIND_INTERVAL, "from a request's start to when the polling thread saw it ready");
    ls_thread_init();
    srand48(42);
    uint32_t n = 0;
    while (!stop_now) {
        uint64_t t0 = ls_now();
        int64_t ready = now_ns() + 200000 + (int64_t)(drand48() * 11800000.0);
        while (now_ns() < ready && !stop_now) {
            struct timespec ts = {0, poll_ns};
            nanosleep(&ts, NULL);
        }
        ls_interval(wait, n++, t0);
    }
    if (ls_close() != 0) {
        fprintf(stderr, "zoo-poll: %s\n", ls_last_error());
        return 1;
    }
    return 0;
}
