/* Checksums of artifacts: XXH3-64 from libxxhash.  The same 64-bit value is
 * written in every format that carries a checksum, little-endian. */
#ifndef FLOW_CHECKSUM_H
#define FLOW_CHECKSUM_H

#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* XXH3-64 (seed 0) of len bytes. */
FLOW_EXPORT uint64_t flow_checksum(const void *data, size_t len);

/* Incremental form: init, update any number of times, digest.  The digest
 * equals flow_checksum of the concatenated bytes. */
typedef struct flow_checksum_state flow_checksum_state_t;

/* Free with flow_checksum_state_free(); NULL when out of memory. */
FLOW_EXPORT flow_checksum_state_t *flow_checksum_state_new(void);
FLOW_EXPORT void flow_checksum_state_free(flow_checksum_state_t *state);
FLOW_EXPORT void flow_checksum_reset(flow_checksum_state_t *state);
FLOW_EXPORT void flow_checksum_update(flow_checksum_state_t *state,
				      const void *data, size_t len);
FLOW_EXPORT uint64_t flow_checksum_digest(const flow_checksum_state_t *state);

/* Format as 16 lowercase hex digits plus NUL into buf (17 bytes). */
FLOW_EXPORT void flow_checksum_format(uint64_t sum, char buf[17]);
/* Parse exactly 16 hex digits. */
FLOW_EXPORT flow_err_t flow_checksum_parse(const char *text, uint64_t *sum_out,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
