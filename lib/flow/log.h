/* Levelled, rank-aware logging through a settable callback.
 *
 * Levels mean what they mean in htslib: ERROR a failure the caller will
 * report, WARN something suspicious that does not stop the run, INFO progress
 * a user may want, DEBUG detail for developers, TRACE per-operation detail.
 * The default level is WARN; FLOW_LOG_LEVEL (a name or a number 0-5) sets it,
 * and the tools' -v/-q step it.  In a multi-rank run only rank 0 emits INFO
 * and below, and every line from another rank is prefixed "[rank N] ". */
#ifndef FLOW_LOG_H
#define FLOW_LOG_H

#include <stdarg.h>

#include <flow/common.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
	FLOW_LOG_OFF = 0,
	FLOW_LOG_ERROR = 1,
	FLOW_LOG_WARN = 2,
	FLOW_LOG_INFO = 3,
	FLOW_LOG_DEBUG = 4,
	FLOW_LOG_TRACE = 5,
} flow_log_level_t;

/* Receives one complete line without the trailing newline (the prefixes are
 * already applied).  Called with the log lock held: it must not log. */
typedef void (*flow_log_fn)(flow_log_level_t level, const char *line,
			    void *userdata);

FLOW_EXPORT void flow_log_set_level(flow_log_level_t level);
FLOW_EXPORT flow_log_level_t flow_log_get_level(void);
/* Apply FLOW_LOG_LEVEL if set.  Returns FLOW_OK, or FLOW_ERR_USAGE (with the
 * level unchanged) when its value is neither a level name nor 0-5. */
FLOW_EXPORT int flow_log_level_from_env(void) FLOW_MUST_CHECK;
/* Parse "error", "warn", "info", "debug", "trace", "off" or "0".."5".
 * Returns FLOW_OK and sets *level_out, or FLOW_ERR_USAGE. */
FLOW_EXPORT int flow_log_level_parse(const char *text,
				     flow_log_level_t *level_out)
	FLOW_MUST_CHECK;

/* Program name put before every line ("flow-bench: ..."); NULL for none.
 * The string is copied. */
FLOW_EXPORT void flow_log_set_prog(const char *prog);
/* This process's rank in a multi-rank run, or -1 (the default) for none. */
FLOW_EXPORT void flow_log_set_rank(int rank);
/* Replace the sink; NULL restores the default, which writes to stderr after
 * flushing stdout. */
FLOW_EXPORT void flow_log_set_callback(flow_log_fn fn, void *userdata);

/* "prog: message" and a newline on stderr, after flushing stdout, in one
 * write and whatever the level: the line a program or a launcher fails
 * with.  The ranks of a job share a stderr, and a line written in pieces
 * can be cut by another's. */
FLOW_EXPORT void flow_log_say(const char *prog, const char *fmt, va_list ap);

/* True when a message at this level would be emitted. */
FLOW_EXPORT bool flow_log_enabled(flow_log_level_t level);
FLOW_EXPORT void flow_log(flow_log_level_t level, const char *fmt, ...)
	FLOW_PRINTF(2, 3);
FLOW_EXPORT void flow_logv(flow_log_level_t level, const char *fmt,
			   va_list ap);

#ifdef __cplusplus
}
#endif

#endif
