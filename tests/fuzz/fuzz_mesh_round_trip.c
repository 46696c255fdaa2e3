/* Mesh strings (flow_mesh_parse, flow/sbp.h): parse, then print and parse
 * the print back; a parsed mesh must also pass flow_mesh_check. */
#include <config.h>

#include <stdlib.h>

#include <flow/sbp.h>

#include "fuzz_util.h"

static flow_err_t parse(const char *text, void *out, flow_diag_t *diag)
{
	return flow_mesh_parse(text, out, diag);
}

static size_t format(const void *value, char *buf, size_t cap)
{
	return flow_mesh_format(value, buf, cap);
}

static const fuzz_text_codec_t codec = {
	"flow_mesh_parse", sizeof(flow_mesh_t), parse, format,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!fuzz_text_round_trip(&codec, data, size))
		return 0;
	char *text = fuzz_strndup(data, size);
	flow_mesh_t mesh;
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_mesh_parse(text, &mesh, &diag) != FLOW_OK ||
	    flow_mesh_check(&mesh, &diag) != FLOW_OK)
		fuzz_fail("mesh '%s' parses but fails flow_mesh_check: %s",
			  text, flow_diag_message(&diag));
	/* Every position maps to a rank and back. */
	int64_t n = flow_mesh_size(&mesh);
	for (int64_t i = 0; i < n && i < 4096; i++)
		if (flow_mesh_index_of(&mesh, flow_mesh_rank(&mesh, i)) != i)
			fuzz_fail("mesh '%s': position %lld does not map back",
				  text, (long long)i);
	free(text);
	return 0;
}
