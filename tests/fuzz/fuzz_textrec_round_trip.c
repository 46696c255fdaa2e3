/* Checksummed text records (lib/core/textrec_internal.h), the reader under
 * the dataset manifest, the checkpoint files and plans, in both field
 * separators.  The first input byte is the harness's: bit 0 picks the
 * format (blanks and "checksum", or single spaces and "end"), bit 1 clear
 * recomputes the closing line's checksum.  Every record is split and its
 * fields tried as numbers and checksums.  The records of a text that reads
 * to its closing line are printed again (single spaces, which both
 * formats read) and sealed: the
 * print must read back to the same fields, and print the same bytes. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "core/textrec_internal.h"
#include "fuzz_util.h"

static const flow_textrec_format_t blanks = {
	.sep = FLOW_TEXTREC_SEP_BLANKS,
	.end_key = "checksum",
	.lowercase_sums = false,
	.hint_causes = false,
};
static const flow_textrec_format_t spaces = {
	.sep = FLOW_TEXTREC_SEP_SPACE,
	.end_key = "end",
	.lowercase_sums = true,
	.hint_causes = true,
};

/* Read text (modified in place) as format; with out, print its records
 * into it.  Returns whether the text read to a verified closing line. */
static bool read_text(const flow_textrec_format_t *format, char *text,
		      size_t len, flow_textrec_buf_t *out)
{
	flow_textrec_t r;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_textrec_init(&r, format, "fuzz.txt", text, len,
					   &diag);
	bool closed = false;
	char *line;
	size_t llen;
	int rc = 0;
	while (err == FLOW_OK && !closed &&
	       (rc = flow_textrec_next(&r, &line, &llen)) > 0) {
		if (memchr(line, '\0', llen))
			break; /* the formats' readers refuse these */
		if ((err = flow_textrec_split(&r, line)) != FLOW_OK)
			break;
		if (r.nfields < 0 || r.nfields > FLOW_TEXTREC_MAX_FIELDS)
			fuzz_fail("flow_textrec_split: %d fields", r.nfields);
		if (r.nfields == 0)
			continue;
		if (strcmp(r.fields[0], format->end_key) == 0) {
			uint64_t sum;
			if ((err = flow_textrec_expect_fields(&r, 2, "END SUM")) ||
			    (err = flow_textrec_field_sum(&r, 1, &sum)) ||
			    (err = flow_textrec_verify_end(&r, sum)))
				break;
			closed = true;
			continue;
		}
		for (int i = 0; i < r.nfields; i++) {
			uint64_t v;
			flow_diag_t d = FLOW_DIAG_INIT;
			r.diag = &d;
			fuzz_check_diag("flow_textrec_field_u64",
					flow_textrec_field_u64(&r, i, "number", 0,
							       UINT64_MAX, &v),
					&d);
			d = (flow_diag_t)FLOW_DIAG_INIT;
			fuzz_check_diag("flow_textrec_field_sum",
					flow_textrec_field_sum(&r, i, &v), &d);
			r.diag = &diag;
		}
		for (int i = 0; out && i < r.nfields; i++)
			flow_textrec_printf(out, "%s%s", i ? " " : "",
					    r.fields[i]);
		if (out)
			flow_textrec_printf(out, "\n");
	}
	if (rc < 0)
		err = (flow_err_t)rc;
	fuzz_check_diag("flow_textrec", err, &diag);
	flow_textrec_release(&r);
	return err == FLOW_OK && closed;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t opt = fuzz_take_byte(&data, &size);
	const flow_textrec_format_t *format = (opt & 1) ? &spaces : &blanks;
	char *text = fuzz_strndup(data, size);
	if (!(opt & 2))
		fuzz_fix_text_sum(text, size, format->end_key);
	flow_textrec_buf_t a = FLOW_TEXTREC_BUF_INIT;
	if (read_text(format, text, size, &a) && !a.failed) {
		flow_textrec_seal(&a, format);
		char *copy = fuzz_strndup((const uint8_t *)a.buf, a.len);
		flow_textrec_buf_t b = FLOW_TEXTREC_BUF_INIT;
		if (!read_text(format, copy, a.len, &b) || b.failed)
			fuzz_fail("printed records do not read back");
		flow_textrec_seal(&b, format);
		fuzz_check_same("flow_textrec_printf", a.buf, a.len, b.buf,
				b.len);
		flow_textrec_buf_release(&b);
		free(copy);
	}
	flow_textrec_buf_release(&a);
	free(text);
	return 0;
}
