/* ls-zoo: the injectors of `loopscope bench explain` (the cause zoo).
 *
 * Each mode injects one known cause of lateness on one CPU, with a real
 * mechanism of the kernel, so that explain can be scored against it:
 *
 *   fifo    a SCHED_FIFO thread busy in bursts on a CPU (a process outside
 *           the lab: its comm is what explain must name)
 *   bursts  a SCHED_FIFO spin of --burst-us every --period-us on a CPU, each
 *           burst's start and end (CLOCK_MONOTONIC ns) appended to --log:
 *           a known answer for how long explain says each outlier was held
 *   timers  many high-resolution timers firing on a CPU: per-CPU perf
 *           cpu-clock events, whose hrtimers re-arm themselves inside the
 *           timer interrupt (no thread of ours runs on that CPU)
 *   ipi     cross-CPU function calls aimed at a CPU: enabling and disabling a
 *           group of per-CPU perf events from another CPU (each toggle is an
 *           IPI whose handler walks the group)
 *   slack   timer slack on every thread whose name starts with a prefix
 *           (/proc/TID/timerslack_ns), given back on exit
 *   pageout the anonymous memory (its thread stacks and regions up to
 *           --max-kib) of the process one of whose threads is named with a
 *           prefix, paged out to swap (process_madvise
 *           MADV_PAGEOUT, the call proactive reclaimers use) every few ms:
 *           memory pressure aimed at one process (locked memory is skipped)
 *   throttle a CPU limit (cgroup v1 cpu.cfs_quota_us, or v2 cpu.max) on a
 *           group of its own (--group), holding a busy sibling on --cpu
 *           and every thread whose name starts with --prefix: the sibling
 *           spends the quota, the threads wait for the next period; the
 *           threads go back to the root on exit, and the group is removed
 *           when this made it (a group that exists keeps its limit: the
 *           bench makes it, and a remedy may lift it); `loopscope cleanup`
 *           removes a group a killed bench left
 *   share   writes, from --cpu, to one word of every cache line of the file
 *           --path that a program maps and reads (shared memory): each of
 *           the program's reads then takes the line back from this CPU's
 *           cache, so its work slows with no kernel event in its way (a
 *           neighbour writing memory the program reads: false sharing)
 *
 * A gate (--gate FILE) makes an injector act only while a process holds a
 * lock on FILE: the bench's experiment starts that process as a
 * load of its injected phase, so an injector that lives outside the lab
 * follows the phases. Every mode dies with its parent (PR_SET_PDEATHSIG)
 * and gives back what it changed on SIGTERM and SIGINT.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zoo_common.h"

static volatile sig_atomic_t stop_now = 0;
static void on_stop(int sig) { (void)sig; stop_now = 1; }

static void pin_or_die(int cpu) {
    if (pin(cpu) != 0) {
        fprintf(stderr, "ls-zoo: cannot pin to CPU %d: %s\n", cpu, strerror(errno));
        exit(1);
    }
}

static void sleep_ns(int64_t ns) {
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !stop_now) {}
}

/* open while the gate's load holds its lock (`flock FILE sleep …`: the
 * kernel lets go of it when that process dies, however it dies) */
static const char *gate_path = NULL;
static int gate_open(void) {
    if (!gate_path) return 1;
    int fd = open(gate_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd); /* drops a lock this took */
    return held;
}

static long arg(int argc, char **argv, const char *name, long dflt) {
    for (int i = 2; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return strtol(argv[i + 1], NULL, 10);
    return dflt;
}

static const char *sarg(int argc, char **argv, const char *name, const char *dflt) {
    for (int i = 2; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return argv[i + 1];
    return dflt;
}

static void spin_until(int64_t t) { while (now_ns() < t && !stop_now) {} }

/* fifo: SCHED_FIFO, busy for --burst-us every --period-us while the gate is open */
static int mode_fifo(int argc, char **argv) {
    int cpu = (int)arg(argc, argv, "--cpu", 1);
    int64_t burst = arg(argc, argv, "--burst-us", 2000) * 1000;
    int64_t period = arg(argc, argv, "--period-us", 20000) * 1000;
    struct sched_param sp = {.sched_priority = (int)arg(argc, argv, "--prio", 10)};
    pin_or_die(cpu);
    if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
        fprintf(stderr, "ls-zoo fifo: SCHED_FIFO refused: %s\n", strerror(errno));
        return 1;
    }
    int64_t next = now_ns();
    while (!stop_now) {
        if (gate_open()) spin_until(now_ns() + burst);
        next += period;
        int64_t d = next - now_ns();
        if (d > 0) sleep_ns(d); else next = now_ns();
    }
    return 0;
}

static int perf_open(struct perf_event_attr *a, int cpu, int group) {
    return (int)syscall(SYS_perf_event_open, a, -1, cpu, group, 0);
}

/* bursts: SCHED_FIFO, a spin of --burst-us at every --period-us, each logged (start end, ns) to --log */
static int mode_bursts(int argc, char **argv) {
    int cpu = (int)arg(argc, argv, "--cpu", 1);
    int64_t burst = arg(argc, argv, "--burst-us", 200) * 1000;
    int64_t period = arg(argc, argv, "--period-us", 100000) * 1000;
    const char *path = sarg(argc, argv, "--log", NULL);
    struct sched_param sp = {.sched_priority = (int)arg(argc, argv, "--prio", 10)};
    FILE *log = path ? fopen(path, "a") : NULL;
    if (!log) {
        fprintf(stderr, "ls-zoo bursts: --log FILE is needed and must open: %s\n", path ? strerror(errno) : "no --log");
        return 2;
    }
    setvbuf(log, NULL, _IOFBF, 1 << 20);
    pin_or_die(cpu);
    if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) {
        fprintf(stderr, "ls-zoo bursts: SCHED_FIFO refused: %s\n", strerror(errno));
        return 1;
    }
    /* each burst is logged as user space sees it: from its first clock read after the wake-up to its
     * last before it sleeps again (the kernel's way in and out of the sleep is its run too, a few µs) */
    int64_t next = now_ns() + period;
    while (!stop_now) {
        struct timespec ts = {next / 1000000000LL, next % 1000000000LL};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR && !stop_now) {}
        if (stop_now) break;
        int64_t a = now_ns();
        spin_until(a + burst);
        next += period;
        if (next < now_ns()) next = now_ns() + period;
        /* buffered, written on the way out: a write here would make the burst's run longer than its log says */
        fprintf(log, "%lld %lld\n", (long long)a, (long long)now_ns());
    }
    fclose(log);
    return 0;
}

/* timers: --events cpu-clock events on --cpu, each firing every --period-us */
static int mode_timers(int argc, char **argv) {
    int cpu = (int)arg(argc, argv, "--cpu", 1);
    int n = (int)arg(argc, argv, "--events", 16);
    long period = arg(argc, argv, "--period-us", 100) * 1000;
    for (int i = 0; i < n; i++) {
        struct perf_event_attr a;
        memset(&a, 0, sizeof a);
        a.size = sizeof a;
        a.type = PERF_TYPE_SOFTWARE;
        a.config = PERF_COUNT_SW_CPU_CLOCK;
        a.sample_period = (uint64_t)period;
        if (perf_open(&a, cpu, -1) < 0) {
            fprintf(stderr, "ls-zoo timers: perf_event_open on CPU %d: %s\n", cpu, strerror(errno));
            return 1;
        }
        /* opened back to back: they expire together, one long interrupt */
    }
    while (!stop_now) pause();
    return 0;
}

/* ipi: from --cpu, enable and disable a group of --group perf events on --target */
static int mode_ipi(int argc, char **argv) {
    int target = (int)arg(argc, argv, "--target", 1);
    int n = (int)arg(argc, argv, "--group", 64);
    int64_t gap = arg(argc, argv, "--gap-us", 20) * 1000;
    pin_or_die((int)arg(argc, argv, "--cpu", 0));
    /* a background task: whatever else runs on its CPU goes first (the IPIs it sends still land) */
    struct sched_param none = {.sched_priority = 0};
    sched_setscheduler(0, SCHED_IDLE, &none);
    int leader = -1;
    for (int i = 0; i < n; i++) {
        struct perf_event_attr a;
        memset(&a, 0, sizeof a);
        a.size = sizeof a;
        a.type = PERF_TYPE_SOFTWARE;
        a.config = PERF_COUNT_SW_CPU_CLOCK;
        a.disabled = i == 0;
        int fd = perf_open(&a, target, leader);
        if (fd < 0) {
            fprintf(stderr, "ls-zoo ipi: perf_event_open on CPU %d: %s\n", target, strerror(errno));
            return 1;
        }
        if (i == 0) leader = fd;
    }
    while (!stop_now) {
        ioctl(leader, PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP);
        ioctl(leader, PERF_EVENT_IOC_DISABLE, PERF_IOC_FLAG_GROUP);
        if (gap > 0) spin_until(now_ns() + gap);
    }
    return 0;
}

/* slack: --ns of timer slack on every thread named --prefix*, restored on exit */
#define MAX_T 256
static long slack_tid[MAX_T], slack_old[MAX_T];
static int slack_n = 0;

static int write_slack(long tid, long ns) {
    char p[64];
    snprintf(p, sizeof p, "/proc/%ld/timerslack_ns", tid);
    FILE *f = fopen(p, "w");
    if (!f) return -1;
    int ok = fprintf(f, "%ld\n", ns) > 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static long read_slack(long tid) {
    char p[64];
    snprintf(p, sizeof p, "/proc/%ld/timerslack_ns", tid);
    FILE *f = fopen(p, "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

/* Every thread whose name starts with prefix and whose id is not in seen[0..*n):
 * act(process id, thread id, name) on it, and its id kept in seen when act
 * returns 0 (at most MAX_T). */
static void each_named(const char *prefix, long *seen, int *n, int (*act)(long pid, long tid, const char *comm)) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char tp[300];
        snprintf(tp, sizeof tp, "/proc/%s/task", e->d_name);
        DIR *td = opendir(tp);
        struct dirent *t;
        while (td && (t = readdir(td))) {
            if (t->d_name[0] < '0' || t->d_name[0] > '9') continue;
            long tid = strtol(t->d_name, NULL, 10);
            int known = 0;
            for (int i = 0; i < *n; i++) known |= seen[i] == tid;
            if (known || *n >= MAX_T) continue;
            char cp[600], comm[64] = "";
            snprintf(cp, sizeof cp, "/proc/%s/task/%s/comm", e->d_name, t->d_name);
            FILE *f = fopen(cp, "r");
            if (!f) continue;
            if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
            fclose(f);
            if (strncmp(comm, prefix, strlen(prefix)) != 0) continue;
            if (act(strtol(e->d_name, NULL, 10), tid, strtok(comm, "\n")) == 0) seen[(*n)++] = tid;
        }
        if (td) closedir(td);
    }
    if (d) closedir(d);
}

static long slack_ns = 0;

static int slack_one(long pid, long tid, const char *comm) {
    (void)pid;
    long old = read_slack(tid);
    if (old < 0 || write_slack(tid, slack_ns) != 0) return -1;
    slack_old[slack_n] = old;
    fprintf(stderr, "ls-zoo slack: thread %ld (%s) %ld -> %ld ns\n", tid, comm, old, slack_ns);
    return 0;
}

static void slack_scan(const char *prefix, long ns) {
    slack_ns = ns;
    each_named(prefix, slack_tid, &slack_n, slack_one);
}

static int mode_slack(int argc, char **argv) {
    const char *prefix = sarg(argc, argv, "--prefix", "ls-timer");
    long ns = arg(argc, argv, "--ns", 5000000);
    pin_or_die((int)arg(argc, argv, "--cpu", 0));
    while (!stop_now) {
        slack_scan(prefix, ns);
        sleep_ns(20 * 1000000LL);
    }
    /* 0 gives a thread back its default slack (the value it had may be ours, inherited) */
    for (int i = 0; i < slack_n; i++) write_slack(slack_tid[i], 0);
    return 0;
}

/* the thread-group id of the first thread whose name starts with prefix, or 0 */
static long find_tgid(const char *prefix) {
    DIR *d = opendir("/proc");
    long found = 0;
    struct dirent *e;
    while (d && !found && (e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char tp[300];
        snprintf(tp, sizeof tp, "/proc/%s/task", e->d_name);
        DIR *td = opendir(tp);
        struct dirent *t;
        while (td && !found && (t = readdir(td))) {
            char cp[600], comm[64] = "";
            snprintf(cp, sizeof cp, "/proc/%s/task/%s/comm", e->d_name, t->d_name);
            FILE *f = fopen(cp, "r");
            if (!f) continue;
            if (fgets(comm, sizeof comm, f) && strncmp(comm, prefix, strlen(prefix)) == 0) found = strtol(e->d_name, NULL, 10);
            fclose(f);
        }
        if (td) closedir(td);
    }
    if (d) closedir(d);
    return found;
}

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

/* page out every private writable anonymous mapping of tgid; pages paged out, or -1 */
static unsigned long max_bytes = 8UL << 20;
static long page_out(long tgid) {
    char p[64];
    snprintf(p, sizeof p, "/proc/%ld/maps", tgid);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    struct iovec iov[512];
    int n = 0;
    char line[512];
    while (n < 512 && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        char perms[8] = "";
        int path_at = 0;
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &a, &b, perms, &path_at) < 3) continue;
        const char *path = path_at ? line + path_at : "";
        int anon = path[0] == '\n' || path[0] == 0 || strncmp(path, "[heap]", 6) == 0 || strncmp(path, "[stack", 6) == 0;
        /* thread stacks and small regions, not the big heaps: the pages the
         * measuring thread touches when it wakes, without gigabytes of swap I/O */
        if (perms[0] == 'r' && perms[1] == 'w' && perms[3] == 'p' && anon && b - a <= max_bytes) {
            iov[n].iov_base = (void *)a;
            iov[n].iov_len = b - a;
            n++;
        }
    }
    fclose(f);
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)tgid, 0);
    if (pidfd < 0) return -1;
    long r = syscall(SYS_process_madvise, pidfd, iov, (size_t)n, MADV_PAGEOUT, 0);
    close(pidfd);
    return r;
}

static int mode_pageout(int argc, char **argv) {
    const char *prefix = sarg(argc, argv, "--prefix", "ls-timer");
    int64_t every = arg(argc, argv, "--every-ms", 20) * 1000000LL;
    max_bytes = (unsigned long)arg(argc, argv, "--max-kib", 8196) << 10;
    pin_or_die((int)arg(argc, argv, "--cpu", 0));
    /* --for-ms: only so long after the start, then idle until stopped */
    long for_ms = arg(argc, argv, "--for-ms", 0);
    int64_t until = for_ms > 0 ? now_ns() + for_ms * 1000000LL : INT64_MAX;
    long last = 0;
    while (!stop_now && now_ns() < until) {
        long tgid = find_tgid(prefix);
        if (tgid) {
            long r = page_out(tgid);
            if (tgid != last) fprintf(stderr, "ls-zoo pageout: process %ld: %s\n", tgid, r < 0 ? strerror(errno) : "paging out");
            last = tgid;
        }
        sleep_ns(every);
    }
    while (!stop_now) pause();
    return 0;
}

/* throttle: see the top of the file */
static int thr_v2 = 0, thr_own = 0;
static char thr_root[64], thr_dir[300];

static int write_str(const char *path, const char *v) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int ok = fputs(v, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* thread tid (v1) or its process (v2: a cgroup holds whole processes) into dir */
static int thr_move(long tid, const char *dir) {
    char p[400], v[32];
    snprintf(p, sizeof p, "%s/%s", dir, thr_v2 ? "cgroup.procs" : "tasks");
    snprintf(v, sizeof v, "%ld", tid);
    return write_str(p, v);
}

static long thr_moved[MAX_T];
static int thr_n = 0;

static int thr_one(long pid, long tid, const char *comm) {
    if (thr_move(thr_v2 ? pid : tid, thr_dir) != 0) return -1;
    fprintf(stderr, "ls-zoo throttle: thread %ld (%s) into %s\n", tid, comm, thr_dir);
    return 0;
}

static void thr_scan(const char *prefix) { each_named(prefix, thr_moved, &thr_n, thr_one); }

/* every task left in the group back to the root, then the group removed */
static void thr_give_back(void) {
    char p[400], line[32];
    snprintf(p, sizeof p, "%s/%s", thr_dir, thr_v2 ? "cgroup.procs" : "tasks");
    for (int round = 0; round < 50; round++) {
        FILE *f = fopen(p, "r");
        int left = 0;
        while (f && fgets(line, sizeof line, f)) {
            left++;
            thr_move(strtol(line, NULL, 10), thr_root);
        }
        if (f) fclose(f);
        if (!thr_own || rmdir(thr_dir) == 0 || errno == ENOENT) return;
        (void)left;
        sleep_ns(20 * 1000000LL);
    }
    fprintf(stderr, "ls-zoo throttle: could not remove %s: %s\n", thr_dir, strerror(errno));
}

static int mode_throttle(int argc, char **argv) {
    const char *prefix = sarg(argc, argv, "--prefix", "zoo-table");
    const char *group = sarg(argc, argv, "--group", "ls-zoo-throttle");
    long quota = arg(argc, argv, "--quota-us", 20000), period = arg(argc, argv, "--period-us", 100000);
    int cpu = (int)arg(argc, argv, "--cpu", 1);
    pin_or_die((int)arg(argc, argv, "--scan-cpu", 0));
    thr_v2 = access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", F_OK) != 0;
    snprintf(thr_root, sizeof thr_root, "%s", thr_v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/cpu");
    snprintf(thr_dir, sizeof thr_dir, "%s/%s", thr_root, group);
    /* a group that exists (the bench made it) keeps its limit, whatever a remedy set it to, and stays */
    thr_own = mkdir(thr_dir, 0755) == 0;
    if (!thr_own && errno != EEXIST) {
        fprintf(stderr, "ls-zoo throttle: cannot make %s: %s\n", thr_dir, strerror(errno));
        return 1;
    }
    char p[400], v[64];
    int bad = 0;
    if (thr_own && thr_v2) {
        snprintf(p, sizeof p, "%s/cpu.max", thr_dir);
        snprintf(v, sizeof v, "%ld %ld", quota, period);
        bad = write_str(p, v);
    } else if (thr_own) {
        snprintf(p, sizeof p, "%s/cpu.cfs_period_us", thr_dir);
        snprintf(v, sizeof v, "%ld", period);
        bad = write_str(p, v);
        snprintf(p, sizeof p, "%s/cpu.cfs_quota_us", thr_dir);
        snprintf(v, sizeof v, "%ld", quota);
        bad |= write_str(p, v);
    }
    if (bad) {
        fprintf(stderr, "ls-zoo throttle: cannot set the limit in %s: %s\n", p, strerror(errno));
        thr_give_back();
        return 1;
    }
    pid_t kid = fork();
    if (kid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        prctl(PR_SET_NAME, "zoo-sibling");
        pin_or_die(cpu);
        for (volatile uint64_t x = 0;; x++) {}
    }
    thr_move(kid, thr_dir);
    while (!stop_now) {
        thr_scan(prefix);
        sleep_ns(20 * 1000000LL);
    }
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    thr_give_back();
    return 0;
}

static int mode_share(int argc, char **argv) {
    const char *path = sarg(argc, argv, "--path", NULL);
    if (!path) {
        fprintf(stderr, "ls-zoo share: --path FILE is needed\n");
        return 2;
    }
    pin_or_die((int)arg(argc, argv, "--cpu", 0));
    /* the program makes the file when it starts: wait for it */
    int fd = -1;
    struct stat st = {0};
    for (int i = 0; i < 1000 && !stop_now; i++) {
        fd = open(path, O_RDWR);
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size >= 64) break;
        if (fd >= 0) close(fd);
        fd = -1;
        sleep_ns(10 * 1000000LL);
    }
    if (fd < 0) {
        if (stop_now) return 0;
        fprintf(stderr, "ls-zoo share: %s did not appear: %s\n", path, strerror(errno));
        return 1;
    }
    size_t bytes = (size_t)st.st_size;
    volatile uint64_t *t = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (t == MAP_FAILED) {
        fprintf(stderr, "ls-zoo share: cannot map %s: %s\n", path, strerror(errno));
        return 1;
    }
    /* the last word of each line: the program's chain is in the first */
    while (!stop_now)
        for (size_t w = 7; w < bytes / 8; w += 8) t[w]++;
    munmap((void *)t, bytes);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ls-zoo fifo|bursts|timers|ipi|slack|pageout|throttle|share [--option value ...] [--gate FILE]\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) return 1;
    signal(SIGTERM, on_stop);
    signal(SIGINT, on_stop);
    gate_path = sarg(argc, argv, "--gate", NULL);
    char name[16];
    snprintf(name, sizeof name, "zoo-%s", argv[1]);
    prctl(PR_SET_NAME, name);
    if (!strcmp(argv[1], "fifo")) return mode_fifo(argc, argv);
    if (!strcmp(argv[1], "timers")) return mode_timers(argc, argv);
    if (!strcmp(argv[1], "bursts")) return mode_bursts(argc, argv);
    if (!strcmp(argv[1], "ipi")) return mode_ipi(argc, argv);
    if (!strcmp(argv[1], "slack")) return mode_slack(argc, argv);
    if (!strcmp(argv[1], "pageout")) return mode_pageout(argc, argv);
    if (!strcmp(argv[1], "throttle")) return mode_throttle(argc, argv);
    if (!strcmp(argv[1], "share")) return mode_share(argc, argv);
    fprintf(stderr, "ls-zoo: unknown mode %s\n", argv[1]);
    return 2;
}
