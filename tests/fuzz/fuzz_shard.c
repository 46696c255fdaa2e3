/* Shard files (flow/shard.h): header, frame index, payload and zstd
 * frames, through flow_shard_open, flow_shard_read and
 * flow_shard_verify_file.  The first input byte is the harness's: bit 0
 * clear, the trailing XXH3-64 is recomputed so that mutations reach the
 * checks behind it; bits 1-3 pick the read pattern.  A file that
 * flow_shard_verify_file accepts must read without error, every token
 * below the vocabulary. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <flow/shard.h>

#include "fuzz_util.h"

#define CAP 4096
/* Tokens read at most per input, so a header promising billions of
 * compressed tokens costs no more than a small file. */
#define READ_MAX (1u << 18)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t opt = fuzz_take_byte(&data, &size);
	uint8_t *buf = malloc(size ? size : 1);
	if (!buf)
		fuzz_fail("out of memory");
	memcpy(buf, data, size);
	if (!(opt & 1))
		fuzz_fix_trailing_sum(buf, size);
	char path[1024];
	fuzz_write(path, sizeof path, "train-000000.bin", buf, size);
	free(buf);

	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t verified = flow_shard_verify_file(path, NULL, &diag);
	fuzz_check_diag("flow_shard_verify_file", verified, &diag);

	flow_shard_t *shard = NULL;
	diag = (flow_diag_t)FLOW_DIAG_INIT;
	flow_err_t err = flow_shard_open(path, &shard, &diag);
	fuzz_check_diag("flow_shard_open", err, &diag);
	if (err != FLOW_OK) {
		if (verified == FLOW_OK)
			fuzz_fail("verified, but flow_shard_open fails: %s",
				  flow_diag_message(&diag));
		return 0;
	}
	uint64_t n = flow_shard_token_count(shard);
	uint64_t vocab = flow_shard_vocab(shard);
	static uint32_t tokens[CAP];
	/* Chunks of 1, 7, 64, ... tokens, from the start or from a stride
	 * through the shard, so frame boundaries fall everywhere. */
	static const size_t chunks[] = { CAP, 1, 7, 64, 1000, CAP, 3, 513 };
	size_t chunk = chunks[(opt >> 1) & 7];
	uint64_t step = (opt & 0x10) && n > READ_MAX ? n / 64 : chunk;
	uint64_t done = 0;
	for (uint64_t first = 0; first < n && done < READ_MAX; first += step) {
		size_t count = n - first < chunk ? (size_t)(n - first) : chunk;
		diag = (flow_diag_t)FLOW_DIAG_INIT;
		err = flow_shard_read(shard, first, count, tokens, &diag);
		fuzz_check_diag("flow_shard_read", err, &diag);
		if (err != FLOW_OK) {
			if (verified == FLOW_OK)
				fuzz_fail("verified, but reading tokens at %llu fails: %s",
					  (unsigned long long)first,
					  flow_diag_message(&diag));
			break;
		}
		for (size_t i = 0; verified == FLOW_OK && i < count; i++)
			if (tokens[i] >= vocab)
				fuzz_fail("verified, but token %u at %llu is not below %llu",
					  tokens[i],
					  (unsigned long long)(first + i),
					  (unsigned long long)vocab);
		done += count;
	}
	/* Reads past the end are the caller's error, never a crash. */
	diag = (flow_diag_t)FLOW_DIAG_INIT;
	err = flow_shard_read(shard, n, 1, tokens, &diag);
	if (err == FLOW_OK)
		fuzz_fail("flow_shard_read past the end succeeds");
	fuzz_check_diag("flow_shard_read", err, &diag);
	flow_shard_close(shard);
	return 0;
}
