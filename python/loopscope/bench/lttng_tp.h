/* LTTng-UST tracepoint provider for `loopscope bench trace`: one event with
 * a 32-bit field, the same payload a loopscope event carries. */
#undef LTTNG_UST_TRACEPOINT_PROVIDER
#define LTTNG_UST_TRACEPOINT_PROVIDER loopscope_bench

#undef LTTNG_UST_TRACEPOINT_INCLUDE
#define LTTNG_UST_TRACEPOINT_INCLUDE "./lttng_tp.h"

#if !defined(LOOPSCOPE_LTTNG_TP_H) || defined(LTTNG_UST_TRACEPOINT_HEADER_MULTI_READ)
#define LOOPSCOPE_LTTNG_TP_H

#include <lttng/tracepoint.h>

LTTNG_UST_TRACEPOINT_EVENT(
    loopscope_bench, ev,
    LTTNG_UST_TP_ARGS(unsigned int, tag),
    LTTNG_UST_TP_FIELDS(lttng_ust_field_integer(unsigned int, tag, tag)))

#endif

#include <lttng/tracepoint-event.h>
