/* XXH3-64 checksums through libxxhash. */
#include <config.h>

#include <ctype.h>
#include <stdio.h>

#include <xxhash.h>

#include <flow/checksum.h>

struct flow_checksum_state {
	XXH3_state_t *xxh;
};

uint64_t flow_checksum(const void *data, size_t len)
{
	return XXH3_64bits(data, len);
}

flow_checksum_state_t *flow_checksum_state_new(void)
{
	flow_checksum_state_t *state = malloc(sizeof(*state));
	if (!state)
		return NULL;
	state->xxh = XXH3_createState();
	if (!state->xxh) {
		free(state);
		return NULL;
	}
	flow_checksum_reset(state);
	return state;
}

void flow_checksum_state_free(flow_checksum_state_t *state)
{
	if (!state)
		return;
	XXH3_freeState(state->xxh);
	free(state);
}

void flow_checksum_reset(flow_checksum_state_t *state)
{
	XXH3_64bits_reset(state->xxh);
}

void flow_checksum_update(flow_checksum_state_t *state, const void *data,
			  size_t len)
{
	XXH3_64bits_update(state->xxh, data, len);
}

uint64_t flow_checksum_digest(const flow_checksum_state_t *state)
{
	return XXH3_64bits_digest(state->xxh);
}

void flow_checksum_format(uint64_t sum, char buf[17])
{
	snprintf(buf, 17, "%016llx", (unsigned long long)sum);
}

flow_err_t flow_checksum_parse(const char *text, uint64_t *sum_out,
			       flow_diag_t *diag)
{
	uint64_t sum = 0;
	for (int i = 0; i < 16; i++) {
		int c = (unsigned char)text[i];
		int digit;
		if (c >= '0' && c <= '9')
			digit = c - '0';
		else if (c >= 'a' && c <= 'f')
			digit = c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			digit = c - 'A' + 10;
		else
			goto bad;
		sum = sum << 4 | (uint64_t)digit;
	}
	if (text[16] != '\0')
		goto bad;
	*sum_out = sum;
	return FLOW_OK;
bad:
	return flow_diag_set(diag, FLOW_ERR_FORMAT,
			     "invalid checksum '%s': expected 16 hex digits",
			     text);
}
