/* nd-SBP strings (flow_nd_sbp_parse, flow/sbp.h): parse, then print and
 * parse the print back. */
#include <config.h>

#include <flow/sbp.h>

#include "fuzz_util.h"

static flow_err_t parse(const char *text, void *out, flow_diag_t *diag)
{
	return flow_nd_sbp_parse(text, out, diag);
}

static size_t format(const void *value, char *buf, size_t cap)
{
	return flow_nd_sbp_format(value, buf, cap);
}

static const fuzz_text_codec_t codec = {
	"flow_nd_sbp_parse", sizeof(flow_nd_sbp_t), parse, format,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_text_round_trip(&codec, data, size);
	return 0;
}
