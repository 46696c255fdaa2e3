/* The strict number and name parsers of command lines and text artifacts
 * (flow/parse.h and the enum parsers): sizes, integers, doubles, dims,
 * checksums, dtypes, splits, input formats, precisions, device kinds, op
 * kinds and log levels.  Numbers round-trip: a parsed value printed in
 * decimal parses back to the same value; a checksum prints and parses
 * back. */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/checksum.h>
#include <flow/device.h>
#include <flow/log.h>
#include <flow/ops.h>
#include <flow/parse.h>
#include <flow/shard.h>
#include <flow/tensor.h>
#include <flow/tokens.h>
#include <flow/train.h>

#include "fuzz_util.h"

#define CHECK(call)                                             \
	do {                                                    \
		flow_diag_t diag_ = FLOW_DIAG_INIT;             \
		flow_err_t err_ = call;                         \
		fuzz_check_diag(#call, err_, &diag_);           \
	} while (0)

static void sizes(const char *text)
{
	uint64_t v, w;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_parse_size(text, &v, &diag);
	fuzz_check_diag("flow_parse_size", err, &diag);
	if (err != FLOW_OK)
		return;
	char buf[32];
	snprintf(buf, sizeof buf, "%" PRIu64, v);
	if (flow_parse_size(buf, &w, &diag) != FLOW_OK || w != v)
		fuzz_fail("size '%s' is %s, which does not parse back", text, buf);
}

static void ints(const char *text)
{
	int64_t v, w;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_parse_int(text, -1000, INT64_MAX, &v, &diag);
	fuzz_check_diag("flow_parse_int", err, &diag);
	if (err == FLOW_OK) {
		char buf[32];
		snprintf(buf, sizeof buf, "%" PRId64, v);
		if (v < -1000 ||
		    flow_parse_int(buf, -1000, INT64_MAX, &w, &diag) != FLOW_OK ||
		    w != v)
			fuzz_fail("integer '%s' is %s, which does not parse back",
				  text, buf);
	}
	diag = (flow_diag_t)FLOW_DIAG_INIT;
	err = flow_parse_int(text, INT64_MIN, INT64_MAX, &v, &diag);
	fuzz_check_diag("flow_parse_int", err, &diag);
}

static void dims(const char *text)
{
	uint64_t v[8], w[8];
	size_t n, m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_parse_dims(text, 8, v, &n, &diag);
	fuzz_check_diag("flow_parse_dims", err, &diag);
	if (err != FLOW_OK)
		return;
	char buf[256];
	size_t len = 0;
	for (size_t i = 0; i < n && n <= 8; i++)
		len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%" PRIu64,
					i ? "," : "", v[i]);
	if (n < 1 || n > 8 || flow_parse_dims(buf, 8, w, &m, &diag) != FLOW_OK ||
	    m != n || memcmp(v, w, n * sizeof *v) != 0)
		fuzz_fail("dims '%s' print as '%s', which does not parse back",
			  text, buf);
}

static void sums(const char *text)
{
	uint64_t v, w;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_checksum_parse(text, &v, &diag);
	fuzz_check_diag("flow_checksum_parse", err, &diag);
	if (err != FLOW_OK)
		return;
	char buf[17];
	flow_checksum_format(v, buf);
	if (flow_checksum_parse(buf, &w, &diag) != FLOW_OK || w != v)
		fuzz_fail("checksum '%s' prints as '%s', which does not parse back",
			  text, buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = fuzz_strndup(data, size);
	sizes(text);
	ints(text);
	dims(text);
	sums(text);

	double d;
	flow_dtype_t dtype;
	flow_split_t split;
	flow_input_format_t format;
	flow_precision_t precision;
	flow_device_kind_t device;
	flow_op_kind_t op;
	flow_log_level_t level;
	CHECK(flow_parse_double(text, -1e300, 1e300, &d, &diag_));
	CHECK(flow_dtype_parse(text, &dtype, &diag_));
	CHECK(flow_split_parse(text, &split, &diag_));
	CHECK(flow_input_format_parse(text, &format, &diag_));
	CHECK(flow_precision_parse(text, &precision, &diag_));
	CHECK(flow_device_kind_parse(text, &device, &diag_));
	CHECK(flow_op_kind_parse(text, &op, &diag_));
	if (flow_log_level_parse(text, &level) > 0)
		fuzz_fail("flow_log_level_parse: a positive return");
	free(text);
	return 0;
}
