/* Model spec strings (flow_gpt_parse, flow/model.h): parse, then print
 * the canonical spec and parse it back. */
#include <config.h>

#include <flow/model.h>

#include "fuzz_util.h"

static flow_err_t parse(const char *text, void *out, flow_diag_t *diag)
{
	return flow_gpt_parse(text, out, diag);
}

static size_t format(const void *value, char *buf, size_t cap)
{
	return flow_gpt_format(value, buf, cap);
}

static const fuzz_text_codec_t codec = {
	"flow_gpt_parse", sizeof(flow_gpt_config_t), parse, format,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_text_round_trip(&codec, data, size);
	return 0;
}
