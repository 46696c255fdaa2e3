/* Error codes and the caller-supplied diagnostic that carries one complete
 * message line from the place that detected a problem to the tool that
 * prints it.  The library never prints errors and never exits. */
#ifndef FLOW_ERROR_H
#define FLOW_ERROR_H

#include <flow/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Stable numbers: never renumber, only append. */
typedef enum {
	FLOW_OK = 0,
	FLOW_ERR_NOMEM = -1,    /* allocation failed */
	FLOW_ERR_IO = -2,       /* a system call on a file or socket failed */
	FLOW_ERR_FORMAT = -3,   /* input does not follow its format */
	FLOW_ERR_CHECKSUM = -4, /* stored and computed checksums differ */
	FLOW_ERR_USAGE = -5,    /* the caller asked for something invalid */
	FLOW_ERR_PEER = -6,     /* another rank failed or went away */
	FLOW_ERR_TIMEOUT = -7,  /* a deadline passed */
	FLOW_ERR_DEVICE = -8,   /* CUDA, cuBLAS, cuDNN or NCCL failed */
	FLOW_ERR_RANGE = -9,    /* a value is outside what is representable */
	FLOW_ERR_NOTSUP = -10,  /* not supported by this build */
	FLOW_ERR_VERIFY = -11,  /* a result check found wrong values */
} flow_err_t;

/* Name of an error code, e.g. "FLOW_ERR_IO"; "FLOW_ERR_UNKNOWN" for a value
 * not listed above.  The string is static. */
FLOW_EXPORT const char *flow_err_name(flow_err_t err);

/* Longest diagnostic line kept, including the terminating NUL. */
#define FLOW_DIAG_MAX 512

/* One diagnostic: the error and a complete line that names what went wrong,
 * e.g. "gpt.plan:12: expected 'mesh', got 'mseh'".  Initialise with
 * FLOW_DIAG_INIT or flow_diag_clear(). */
typedef struct flow_diag {
	flow_err_t err;
	char msg[FLOW_DIAG_MAX];
} flow_diag_t;

#define FLOW_DIAG_INIT { FLOW_OK, { 0 } }

/* Reset to "no error". */
FLOW_EXPORT void flow_diag_clear(flow_diag_t *diag);

/* Copy the text src into dst (cap > 0 bytes, always NUL-terminated) with
 * every byte that could break a one-line message on a terminal escaped:
 * "\\n", "\\r", "\\t", and "\\xHH" for the other control bytes, DEL, the C1
 * controls and bytes that are not part of valid UTF-8.  Printable ASCII and
 * valid UTF-8 pass as they are, and a backslash is not doubled, so escaping
 * twice changes nothing.  Text that does not fit is cut before an escape or
 * character, never inside one.  Returns dst. */
FLOW_EXPORT char *flow_escape_line(char *dst, size_t cap, const char *src);

/* Record err with a printf-style message.  The first problem wins: when diag
 * already holds an error it is kept unchanged, so callers can forward errors
 * without rewriting them.  diag may be NULL.  Returns err, so a caller can
 * write `return flow_diag_set(diag, FLOW_ERR_FORMAT, "...")`.  The message
 * goes through flow_escape_line, so input quoted in it (a file name, a
 * field with a CR) cannot break the line. */
FLOW_EXPORT flow_err_t flow_diag_set(flow_diag_t *diag, flow_err_t err,
				     const char *fmt, ...) FLOW_PRINTF(3, 4);

/* As flow_diag_set, with ": strerror(errnum)" appended. */
FLOW_EXPORT flow_err_t flow_diag_errno(flow_diag_t *diag, flow_err_t err,
				       int errnum, const char *fmt, ...)
	FLOW_PRINTF(4, 5);

/* The message held by diag, or flow_err_name(diag->err) when an error was
 * recorded without text, or "" when there is no error.  Borrowed: valid
 * while diag is. */
FLOW_EXPORT const char *flow_diag_message(const flow_diag_t *diag);

#ifdef __cplusplus
}
#endif

#endif
