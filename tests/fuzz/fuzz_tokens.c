/* Token inputs (flow/tokens.h): llm.c .bin headers, .npy headers, raw
 * .u16/.u32 and text, read to the end.  The first input byte picks the
 * file's extension (bits 0-2), the format (bits 3-5: auto or forced) and
 * whether a vocabulary is checked (bit 6); the rest is the file. */
#include <config.h>

#include <flow/tokens.h>

#include "fuzz_util.h"

static const char *const names[] = {
	"in.npy", "in.bin", "in.u16", "in.u32", "in.txt", "in.llmc.bin",
	"in", "in.NPY",
};

#define CAP 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t opt = fuzz_take_byte(&data, &size);
	char path[1024];
	fuzz_write(path, sizeof path, names[opt & 7], data, size);
	flow_token_source_options_t o = {
		.format = (flow_input_format_t)((opt >> 3) & 7),
		.raw_dtype = (opt & 0x80) ? FLOW_DTYPE_U32 : FLOW_DTYPE_U16,
		.vocab = (opt & 0x40) ? 50257 : 0,
	};
	if (o.format > FLOW_INPUT_NPY)
		o.format = FLOW_INPUT_AUTO;
	flow_token_source_t *src = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_token_source_open(path, &o, &src, &diag);
	fuzz_check_diag("flow_token_source_open", err, &diag);
	if (err != FLOW_OK)
		return 0;
	static uint32_t tokens[CAP];
	int64_t n, total = 0, count = flow_token_source_count(src);
	while ((n = flow_token_source_read(src, tokens, CAP, &diag)) > 0) {
		if (n > CAP)
			fuzz_fail("flow_token_source_read: %lld tokens",
				  (long long)n);
		for (int64_t i = 0; o.vocab && i < n; i++)
			if (tokens[i] >= o.vocab)
				fuzz_fail("token %u is not below %llu", tokens[i],
					  (unsigned long long)o.vocab);
		total += n;
	}
	fuzz_check_diag("flow_token_source_read", (flow_err_t)n, &diag);
	if (n == 0 && count >= 0 && total != count)
		fuzz_fail("%lld tokens read, the header says %lld",
			  (long long)total, (long long)count);
	flow_token_source_free(src);
	return 0;
}
