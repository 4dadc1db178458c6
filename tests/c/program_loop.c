/* A user's C program instrumented with loopscope: its trace path comes from
 * LOOPSCOPE_TRACE (ls_open(NULL, NULL)), as a run's program probe sets it.
 * argv[1] iterations of: sleep 1 ms, then time a small busy loop. */
#include <loopscope.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    if (ls_open(NULL, NULL) != 0) {
        fprintf(stderr, "program_loop: %s\n", ls_last_error());
        return 3;
    }
    const ls_entity *spin = ls_register("c", "spin", LS_KIND_INTERVAL, "a small busy loop");
    volatile unsigned long x = 0;
    for (int i = 0; i < n; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        uint64_t t0 = ls_now();
        for (int k = 0; k < 20000; k++) x += (unsigned long)k;
        ls_interval(spin, (uint32_t)i, t0);
    }
    return ls_close() == 0 ? 0 : 4;
}
