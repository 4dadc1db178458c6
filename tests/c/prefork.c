/*
 * A pre-forking server, the shape of Apache's prefork or a gunicorn master:
 * the parent opens a trace and logs, a thread of its own keeps logging while
 * the parent forks its workers, and each worker serves "requests". A worker
 * must never write into the parent's file: before it opens a trace of its
 * own its records go nowhere. tests/trace/test_fork.py runs it and reads
 * every file back.
 * Usage: prefork TRACE WORKERS own|none [WORKER_TRACE with %p]
 *   tags in the parent's file: 0..199 (main thread), 100000.. (its logging thread)
 *   tags a worker logs before opening: 1000..1049 (must appear nowhere)
 *   tags in a worker's own file (own): 2000..2199
 */
#include <loopscope.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const ls_entity *req;
static atomic_int stop;

static void *background(void *arg) {
    (void)arg;
    for (unsigned i = 0; !atomic_load(&stop); i++) {
        ls_event(req, 100000 + i);
        if (i % 64 == 0) usleep(50);
    }
    return NULL;
}

static int worker(int own, const char *path) {
    for (unsigned i = 0; i < 50; i++) ls_event(req, 1000 + i);
    if (!own) {
        /* no trace of its own: close must say so at once, not hang on the parent's writer */
        return ls_close() == 0 ? 5 : 0;
    }
    if (ls_open(path, NULL) != 0) {
        fprintf(stderr, "worker %d: %s\n", (int)getpid(), ls_last_error());
        return 3;
    }
    for (unsigned i = 0; i < 200; i++) ls_event(req, 2000 + i);
    return ls_close() == 0 ? 0 : 4;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: prefork TRACE WORKERS own|none [WORKER_TRACE]\n");
        return 2;
    }
    int n = atoi(argv[2]), own = strcmp(argv[3], "own") == 0;
    if (ls_open(argv[1], NULL) != 0) {
        fprintf(stderr, "%s\n", ls_last_error());
        return 1;
    }
    req = ls_register("srv", "request", LS_KIND_EVENT, "a request served");
    for (unsigned i = 0; i < 100; i++) ls_event(req, i);
    pthread_t th;
    pthread_create(&th, NULL, background, NULL);
    pid_t pids[64];
    for (int c = 0; c < n && c < 64; c++) {
        pids[c] = fork();
        if (pids[c] < 0) { perror("fork"); return 1; }
        if (pids[c] == 0) _exit(worker(own, argc > 4 ? argv[4] : "worker-%p.lstrace"));
    }
    for (unsigned i = 100; i < 200; i++) ls_event(req, i);
    int bad = 0;
    for (int c = 0; c < n && c < 64; c++) {
        int st = 0;
        waitpid(pids[c], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "worker %d ended with status %d\n", (int)pids[c], st);
            bad = 1;
        }
    }
    atomic_store(&stop, 1);
    pthread_join(th, NULL);
    if (ls_close() != 0) {
        fprintf(stderr, "%s\n", ls_last_error());
        return 1;
    }
    for (int c = 0; c < n && c < 64; c++) printf("%d\n", (int)pids[c]);
    return bad;
}
