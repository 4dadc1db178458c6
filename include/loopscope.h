/*
 * loopscope.h — the loopscope event logger for C and C++.
 *
 * Register an entity once (group/name, a kind, a description), then log
 * records against it from any thread. A record costs a TSC read and a few
 * stores into the calling thread's own buffer; a background thread writes the
 * buffers to the trace file. When no open stream logs an entity's group, the
 * inline functions below cost one load and a branch.
 *
 *     #include <loopscope.h>
 *     if (ls_open("app.lstrace", NULL) != 0) { fprintf(stderr, "%s\n", ls_last_error()); }
 *     const ls_entity *frame = ls_register("app", "frame", LS_KIND_EVENT, "a frame arrived");
 *     ls_event(frame, 42);
 *     uint64_t t0 = ls_now(); work(); ls_interval(work_iv, 0, t0);
 *     ls_close();
 *
 * Link with -lloopscope (static: also -lpthread -ldl -lm). Read the file with
 * `loopscope trace dump FILE` or loopscope.trace.read() in Python. The file
 * format is documented in docs/trace-format.md.
 *
 * Functions returning int give 0 on success and -1 on failure; the reason is
 * in ls_last_error() (per thread). Registration returns NULL on failure;
 * every logging function accepts NULL and does nothing.
 */
#ifndef LOOPSCOPE_H
#define LOOPSCOPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Entity kinds (the numbers are part of the file format). */
#define LS_KIND_EVENT 1
#define LS_KIND_INTERVAL 2
#define LS_KIND_COUNTER 3
#define LS_KIND_HISTOGRAM 4

/* Histogram bucket layouts for ls_register_histogram. */
#define LS_HIST_LOG 0    /* log-linear over [0, b], n = sub-bucket bits (7: 1.6 % wide) */
#define LS_HIST_LINEAR 1 /* n equal buckets over [a, b) */

/* An entity handle. Only its first field is visible: the mask of streams
 * that log it now (0: disabled). */
typedef struct ls_entity {
    uint32_t mask;
} ls_entity;

/* Session. path NULL: $LOOPSCOPE_TRACE; "%p" in the path is the process id.
 * config NULL: the environment ($LOOPSCOPE_CONFIG, $LOOPSCOPE_GROUPS,
 * $LOOPSCOPE_RING_GROUPS); otherwise a TOML file with [[stream]] tables (see
 * docs/trace-format.md). fork(): the child never writes into its parent's
 * file; it logs nothing until it calls ls_open itself (e.g. "srv-%p.lstrace"). */
int ls_open(const char *path, const char *config);
int ls_close(void);
int ls_flush(void);
const char *ls_last_error(void);
uint64_t ls_lost_records(void); /* records dropped in the last closed trace */

/* Allocate the calling thread's buffers now, before its time-critical part:
 * a thread's first record otherwise pays for them (about 1 ms per MiB). */
int ls_thread_init(void);

/* Switch a group on or off in one stream at run time. */
int ls_enable_group(const char *stream, const char *group, int on);
/* Write out a flight-recorder (ring) stream with the records leading here. */
int ls_trigger(const char *stream, uint32_t tag);

/* Registration; the same group/name returns the same handle. */
const ls_entity *ls_register(const char *group, const char *name, int kind, const char *desc);
const ls_entity *ls_register_histogram(const char *group, const char *name, const char *desc,
                                       int scale, int64_t a, int64_t b, uint32_t n);

/* A raw timestamp (TSC ticks, or CLOCK_MONOTONIC ns) for starting intervals. */
uint64_t ls_now(void);

/* Out-of-line halves of the logging calls; use the inline functions below. */
void ls__event(const ls_entity *e, uint32_t tag);
void ls__event_value(const ls_entity *e, uint32_t tag, int64_t value);
void ls__event_payload(const ls_entity *e, uint32_t tag, const void *data, size_t len);
void ls__interval(const ls_entity *e, uint32_t tag, uint64_t start);
void ls__interval_raw(const ls_entity *e, uint32_t tag, uint64_t start, uint64_t end);
void ls__interval_mono(const ls_entity *e, uint32_t tag, uint64_t start_ns, uint64_t dur_ns);
void ls__counter_add(const ls_entity *e, int64_t v);
void ls__counter_log(const ls_entity *e);
void ls__histogram_add(const ls_entity *e, int64_t v);
void ls__histogram_log(const ls_entity *e);
void ls_counter_reset(const ls_entity *e);   /* logs the value it had */
void ls_histogram_reset(const ls_entity *e); /* logs the counts it had */

static inline int ls_enabled(const ls_entity *e) {
    return e != NULL && __atomic_load_n(&e->mask, __ATOMIC_RELAXED) != 0;
}

/* An event with a 32-bit tag. */
static inline void ls_event(const ls_entity *e, uint32_t tag) {
    if (ls_enabled(e)) ls__event(e, tag);
}
/* An event carrying a number. */
static inline void ls_event_value(const ls_entity *e, uint32_t tag, int64_t value) {
    if (ls_enabled(e)) ls__event_value(e, tag, value);
}
/* An event carrying up to 65,512 bytes (larger payloads are counted as lost). */
static inline void ls_event_payload(const ls_entity *e, uint32_t tag, const void *data, size_t len) {
    if (ls_enabled(e)) ls__event_payload(e, tag, data, len);
}
/* An interval from `start` (ls_now()) to now, logged as one record. */
static inline void ls_interval(const ls_entity *e, uint32_t tag, uint64_t start) {
    if (ls_enabled(e)) ls__interval(e, tag, start);
}
static inline void ls_interval_raw(const ls_entity *e, uint32_t tag, uint64_t start, uint64_t end) {
    if (ls_enabled(e)) ls__interval_raw(e, tag, start, end);
}
/* An interval in CLOCK_MONOTONIC nanoseconds (start, duration). */
static inline void ls_interval_mono(const ls_entity *e, uint32_t tag, uint64_t start_ns, uint64_t dur_ns) {
    if (ls_enabled(e)) ls__interval_mono(e, tag, start_ns, dur_ns);
}
static inline void ls_counter_add(const ls_entity *e, int64_t v) {
    if (ls_enabled(e)) ls__counter_add(e, v);
}
static inline void ls_counter_log(const ls_entity *e) {
    if (ls_enabled(e)) ls__counter_log(e);
}
static inline void ls_histogram_add(const ls_entity *e, int64_t v) {
    if (ls_enabled(e)) ls__histogram_add(e, v);
}
static inline void ls_histogram_log(const ls_entity *e) {
    if (ls_enabled(e)) ls__histogram_log(e);
}

/* One-line instrumentation points that register on first use:
 *     LS_EVENT("net", "rx", seq);
 */
#define LS__ONCE(var, reg)                                                  \
    static const ls_entity *var;                                            \
    const ls_entity *var##_p = __atomic_load_n(&var, __ATOMIC_ACQUIRE);     \
    if (var##_p == NULL) {                                                  \
        var##_p = (reg);                                                    \
        __atomic_store_n(&var, var##_p, __ATOMIC_RELEASE);                  \
    }

#define LS_EVENT(group, name, tag)                                          \
    do {                                                                    \
        LS__ONCE(ls__e, ls_register(group, name, LS_KIND_EVENT, ""))        \
        ls_event(ls__e_p, (tag));                                           \
    } while (0)

#define LS_COUNTER_ADD(group, name, v)                                      \
    do {                                                                    \
        LS__ONCE(ls__e, ls_register(group, name, LS_KIND_COUNTER, ""))      \
        ls_counter_add(ls__e_p, (v));                                       \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* LOOPSCOPE_H */
