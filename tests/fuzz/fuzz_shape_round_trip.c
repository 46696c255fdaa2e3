/* Shape strings (flow/tensor.h): flow_shape_parse with the round trip
 * through flow_shape_format, and the op form flow_shape_io_parse, whose
 * shapes must each print and parse back too. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <flow/tensor.h>

#include "fuzz_util.h"

static flow_err_t parse(const char *text, void *out, flow_diag_t *diag)
{
	return flow_shape_parse(text, out, diag);
}

static size_t format(const void *value, char *buf, size_t cap)
{
	return flow_shape_format(value, buf, cap);
}

static const fuzz_text_codec_t codec = {
	"flow_shape_parse", sizeof(flow_shape_t), parse, format,
};

#define IO_MAX 8

static void check_shape(const flow_shape_t *s)
{
	char buf[256];
	size_t n = flow_shape_format(s, buf, sizeof buf);
	if (n >= sizeof buf)
		fuzz_fail("flow_shape_io_parse: a shape printing %zu bytes", n);
	if (!fuzz_text_round_trip(&codec, (const uint8_t *)buf, n))
		fuzz_fail("flow_shape_io_parse: shape '%s' does not parse", buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_text_round_trip(&codec, data, size);

	char *text = fuzz_strndup(data, size);
	flow_shape_t in[IO_MAX], out[IO_MAX];
	bool present[IO_MAX];
	int nin = -1, nout = -1;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_shape_io_parse(text, IO_MAX, in, present, &nin,
					     out, &nout, &diag);
	fuzz_check_diag("flow_shape_io_parse", err, &diag);
	if (err == FLOW_OK) {
		if (nin < 0 || nin > IO_MAX || nout < 1 || nout > IO_MAX)
			fuzz_fail("flow_shape_io_parse: %d inputs, %d outputs",
				  nin, nout);
		for (int i = 0; i < nin; i++)
			if (present[i])
				check_shape(&in[i]);
		for (int i = 0; i < nout; i++)
			check_shape(&out[i]);
	}
	free(text);
	return 0;
}
