/* Strict parsers for numbers given on command lines and in text artifacts:
 * the whole string must be consumed, out-of-range values are errors, and
 * the diagnostic quotes the text, e.g. "invalid integer 'x12'". */
#ifndef FLOW_PARSE_H
#define FLOW_PARSE_H

#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A decimal integer (optional sign) in [min, max]. */
FLOW_EXPORT flow_err_t flow_parse_int(const char *text, int64_t min,
				      int64_t max, int64_t *value_out,
				      flow_diag_t *diag) FLOW_MUST_CHECK;
/* A non-negative size with an optional binary suffix: K, M, G, T (also KiB,
 * MiB, GiB, TiB; case-insensitive), e.g. "64", "4K" = 4096, "1.5M" is an
 * error (whole numbers only). */
FLOW_EXPORT flow_err_t flow_parse_size(const char *text, uint64_t *value_out,
				       flow_diag_t *diag) FLOW_MUST_CHECK;
/* A finite floating-point number in [min, max]. */
FLOW_EXPORT flow_err_t flow_parse_double(const char *text, double min,
					 double max, double *value_out,
					 flow_diag_t *diag) FLOW_MUST_CHECK;
/* A comma- or 'x'-separated list of positive sizes, e.g. "256,768,2304" or
 * "2x4": at most max_count values.  Returns FLOW_OK and sets *count_out. */
FLOW_EXPORT flow_err_t flow_parse_dims(const char *text, size_t max_count,
				       uint64_t *values_out,
				       size_t *count_out, flow_diag_t *diag)
	FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
