/* Dataset manifests (flow_manifest_read, flow_manifest_write; flow-shard(5)):
 * the reader takes a directory, so the input becomes the manifest of a
 * scratch one.  The first input byte is the harness's: bit 0 clear, the
 * closing checksum line is recomputed so that mutations reach the
 * records before it.  A manifest that reads is written, read back and
 * written again: the two texts must be the same bytes; it also prints as
 * TSV and JSON. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/shard.h>

#include "fuzz_util.h"

static char *write_text(flow_manifest_t *m, size_t *len_out)
{
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len_out);
	if (!f)
		fuzz_fail("open_memstream failed");
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_manifest_write(m, f, &diag);
	if (fclose(f) != 0 || err != FLOW_OK)
		fuzz_fail("flow_manifest_write: %s", flow_diag_message(&diag));
	return buf;
}

static void print(const flow_manifest_t *m, bool json)
{
	char *buf = NULL;
	size_t len;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		fuzz_fail("open_memstream failed");
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_manifest_print(m, f, json, &diag);
	if (fclose(f) != 0 || err != FLOW_OK)
		fuzz_fail("flow_manifest_print: %s", flow_diag_message(&diag));
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t opt = fuzz_take_byte(&data, &size);
	char *text = fuzz_strndup(data, size);
	if (!(opt & 1))
		fuzz_fix_text_sum(text, size, "checksum");
	char path[1024];
	fuzz_write(path, sizeof path, "manifest", text, size);
	free(text);

	flow_manifest_t m, again;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_manifest_read(fuzz_dir(), &m, &diag);
	fuzz_check_diag("flow_manifest_read", err, &diag);
	if (err != FLOW_OK)
		return 0;
	print(&m, false);
	print(&m, true);
	size_t alen, blen;
	char *a = write_text(&m, &alen);
	fuzz_write(path, sizeof path, "manifest", a, alen);
	err = flow_manifest_read(fuzz_dir(), &again, &diag);
	if (err != FLOW_OK)
		fuzz_fail("a written manifest does not read: %s",
			  flow_diag_message(&diag));
	char *b = write_text(&again, &blen);
	fuzz_check_same("flow_manifest_write", a, alen, b, blen);
	if (again.checksum != m.checksum)
		fuzz_fail("the manifest's checksum changes when written");
	free(b);
	free(a);
	flow_manifest_release(&again);
	flow_manifest_release(&m);
	return 0;
}
