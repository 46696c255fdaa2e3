/* The reader and writer of line-oriented, checksummed text records that
 * the dataset manifest, the checkpoint manifest and indexes, and plans
 * share (lib/core/textrec.c): cutting the text into lines, the two field
 * separators, numbers and checksums in fields, the closing checksum, and
 * every message with its PATH:LINE.
 *
 * The functions are private to libflow (not exported), so this test
 * compiles textrec.c in.  Every text is the test's own: one of them in a
 * writable buffer, since the reader cuts its lines up in place. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/checksum.h>

#include "core/textrec_internal.h"

/* The two shapes formats take: the manifest's (blanks, either case of
 * hex, no hints) and a strict one with single spaces, lowercase sums and
 * the likely cause in messages. */
static const flow_textrec_format_t blanks_format = {
	.sep = FLOW_TEXTREC_SEP_BLANKS,
	.end_key = "checksum",
	.lowercase_sums = false,
	.hint_causes = false,
};

static const flow_textrec_format_t strict_format = {
	.sep = FLOW_TEXTREC_SEP_SPACE,
	.end_key = "end",
	.lowercase_sums = true,
	.hint_causes = true,
};

/* A reader over a copy of text (the reader writes into it).  diag keeps
 * the first error it is given: clear it before provoking another. */
typedef struct reader {
	flow_textrec_t r;
	flow_diag_t diag;
	char buf[1024];
} reader_t;

static void reader_open(reader_t *rd, const flow_textrec_format_t *format,
			const char *text)
{
	size_t len = strlen(text);
	assert_true(len < sizeof(rd->buf));
	memcpy(rd->buf, text, len + 1);
	flow_diag_clear(&rd->diag);
	assert_int_equal(flow_textrec_init(&rd->r, format, "t.txt", rd->buf,
					   len, &rd->diag),
			 FLOW_OK);
}

/* The next line, which must be there, cut into fields. */
static void next_record(reader_t *rd)
{
	char *line;
	size_t len;
	assert_int_equal(flow_textrec_next(&rd->r, &line, &len), 1);
	assert_int_equal(flow_textrec_split(&rd->r, line), FLOW_OK);
}

static void test_textrec_next_gives_each_line_then_the_end(void **state)
{
	reader_t rd;
	char *line = NULL;
	size_t len = 99;
	(void)state;
	reader_open(&rd, &blanks_format, "one two\n\nthree\n");
	assert_int_equal(flow_textrec_next(&rd.r, &line, &len), 1);
	assert_string_equal(line, "one two");
	assert_int_equal(len, 7);
	assert_int_equal(rd.r.line, 1);
	assert_int_equal(flow_textrec_next(&rd.r, &line, &len), 1);
	assert_string_equal(line, "");
	assert_int_equal(len, 0);
	assert_int_equal(flow_textrec_next(&rd.r, &line, &len), 1);
	assert_string_equal(line, "three");
	assert_int_equal(rd.r.line, 3);
	assert_int_equal(flow_textrec_next(&rd.r, &line, &len), 0);
	assert_int_equal(flow_textrec_next(&rd.r, &line, &len), 0);
	flow_textrec_release(&rd.r);
}

static void test_textrec_next_leaves_a_nul_in_a_line_to_the_caller(void **state)
{
	char text[] = "ab\0c\n";
	flow_textrec_t r;
	flow_diag_t diag = FLOW_DIAG_INIT;
	char *line;
	size_t len;
	(void)state;
	assert_int_equal(flow_textrec_init(&r, &blanks_format, "t.txt", text,
					   sizeof(text) - 1, &diag),
			 FLOW_OK);
	assert_int_equal(flow_textrec_next(&r, &line, &len), 1);
	assert_int_equal(len, 4);
	assert_int_equal(strlen(line), 2);
	flow_textrec_release(&r);
}

static void test_textrec_next_refuses_a_last_line_without_newline(void **state)
{
	reader_t rd;
	char *line;
	size_t len;
	(void)state;
	reader_open(&rd, &blanks_format, "a\nb");
	assert_int_equal(flow_textrec_next(&rd.r, &line, &len), 1);
	assert_int_equal(flow_textrec_next(&rd.r, &line, &len), FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg,
			    "t.txt:2: missing newline at the end of the file");
	flow_textrec_release(&rd.r);

	reader_open(&rd, &strict_format, "a");
	assert_int_equal(flow_textrec_next(&rd.r, &line, &len), FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg,
			    "t.txt:1: missing newline at the end of the file (truncated?)");
	flow_textrec_release(&rd.r);
}

/* Split the first line of text with strict_format and expect message. */
static void assert_split_fails(const char *text, const char *message)
{
	reader_t rd;
	char *line;
	size_t len;
	reader_open(&rd, &strict_format, text);
	assert_int_equal(flow_textrec_next(&rd.r, &line, &len), 1);
	assert_int_equal(flow_textrec_split(&rd.r, line), FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg, message);
	flow_textrec_release(&rd.r);
}

static void test_textrec_split_on_blanks_skips_runs_of_them(void **state)
{
	reader_t rd;
	(void)state;
	reader_open(&rd, &blanks_format, "  key\t 12   x\t\n \t\n");
	next_record(&rd);
	assert_int_equal(rd.r.nfields, 3);
	assert_string_equal(rd.r.fields[0], "key");
	assert_string_equal(rd.r.fields[1], "12");
	assert_string_equal(rd.r.fields[2], "x");
	next_record(&rd);
	assert_int_equal(rd.r.nfields, 0);
	flow_textrec_release(&rd.r);
}

static void test_textrec_split_refuses_more_fields_than_the_most(void **state)
{
	reader_t rd;
	char *line;
	size_t len;
	(void)state;
	reader_open(&rd, &blanks_format, "1 2 3 4 5 6 7 8\n1 2 3 4 5 6 7 8 9\n");
	next_record(&rd);
	assert_int_equal(rd.r.nfields, FLOW_TEXTREC_MAX_FIELDS);
	assert_int_equal(flow_textrec_next(&rd.r, &line, &len), 1);
	assert_int_equal(flow_textrec_split(&rd.r, line), FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg, "t.txt:2: too many fields");
	flow_textrec_release(&rd.r);

	assert_split_fails("1 2 3 4 5 6 7 8 9\n", "t.txt:1: too many fields");
}

static void test_textrec_split_on_single_spaces_keeps_tabs(void **state)
{
	reader_t rd;
	(void)state;
	reader_open(&rd, &strict_format, "key a\tb c\n");
	next_record(&rd);
	assert_int_equal(rd.r.nfields, 3);
	assert_string_equal(rd.r.fields[0], "key");
	assert_string_equal(rd.r.fields[1], "a\tb");
	assert_string_equal(rd.r.fields[2], "c");
	flow_textrec_release(&rd.r);
}

static void test_textrec_split_on_single_spaces_refuses_empty_fields(void **state)
{
	(void)state;
	assert_split_fails("\n", "t.txt:1: empty line");
	assert_split_fails("a  b\n",
			   "t.txt:1: empty field 2 (fields are separated by single spaces)");
	assert_split_fails(" a\n",
			   "t.txt:1: empty field 1 (fields are separated by single spaces)");
	assert_split_fails("a b \n",
			   "t.txt:1: empty field 3 (fields are separated by single spaces)");
}

static void test_textrec_expect_fields_names_the_syntax(void **state)
{
	reader_t rd;
	(void)state;
	reader_open(&rd, &blanks_format, "x\nvocab 1 2\n");
	next_record(&rd);
	next_record(&rd);
	assert_int_equal(flow_textrec_expect_fields(&rd.r, 3, "vocab N"),
			 FLOW_OK);
	assert_int_equal(flow_textrec_expect_fields(&rd.r, 2, "vocab N"),
			 FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg,
			    "t.txt:2: expected 'vocab N', got 3 fields");
	flow_textrec_release(&rd.r);
}

static void test_textrec_parse_u64_takes_only_canonical_decimals(void **state)
{
	uint64_t v = 7;
	(void)state;
	assert_true(flow_textrec_parse_u64("0", 1, UINT64_MAX, &v));
	assert_int_equal(v, 0);
	assert_true(flow_textrec_parse_u64("18446744073709551615", 20,
					   UINT64_MAX, &v));
	assert_true(v == UINT64_MAX);
	/* Only len bytes are read. */
	assert_true(flow_textrec_parse_u64("1234", 2, UINT64_MAX, &v));
	assert_int_equal(v, 12);
	v = 7;
	assert_false(flow_textrec_parse_u64("18446744073709551616", 20,
					    UINT64_MAX, &v));
	assert_false(flow_textrec_parse_u64("", 0, UINT64_MAX, &v));
	assert_false(flow_textrec_parse_u64("00", 2, UINT64_MAX, &v));
	assert_false(flow_textrec_parse_u64("01", 2, UINT64_MAX, &v));
	assert_false(flow_textrec_parse_u64("-1", 2, UINT64_MAX, &v));
	assert_false(flow_textrec_parse_u64("+1", 2, UINT64_MAX, &v));
	assert_false(flow_textrec_parse_u64("1 ", 2, UINT64_MAX, &v));
	assert_false(flow_textrec_parse_u64("0x10", 4, UINT64_MAX, &v));
	assert_true(flow_textrec_parse_u64("10", 2, 10, &v));
	assert_int_equal(v, 10);
	v = 7;
	assert_false(flow_textrec_parse_u64("11", 2, 10, &v));
	/* Refused: the output is untouched. */
	assert_int_equal(v, 7);
}

static void test_textrec_field_u64_holds_to_min_and_max(void **state)
{
	reader_t rd;
	uint64_t v = 99;
	(void)state;
	reader_open(&rd, &blanks_format, "ranks 0 1 64 65 007\n");
	next_record(&rd);
	assert_int_equal(flow_textrec_field_u64(&rd.r, 2, "rank count", 1, 64,
						&v),
			 FLOW_OK);
	assert_int_equal(v, 1);
	assert_int_equal(flow_textrec_field_u64(&rd.r, 3, "rank count", 1, 64,
						&v),
			 FLOW_OK);
	assert_int_equal(v, 64);
	v = 99;
	assert_int_equal(flow_textrec_field_u64(&rd.r, 1, "rank count", 1, 64,
						&v),
			 FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg, "t.txt:1: invalid rank count '0'");
	flow_diag_clear(&rd.diag);
	assert_int_equal(flow_textrec_field_u64(&rd.r, 4, "rank count", 1, 64,
						&v),
			 FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg, "t.txt:1: invalid rank count '65'");
	flow_diag_clear(&rd.diag);
	assert_int_equal(flow_textrec_field_u64(&rd.r, 5, "rank count", 0,
						UINT64_MAX, &v),
			 FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg, "t.txt:1: invalid rank count '007'");
	assert_int_equal(v, 99);
	flow_textrec_release(&rd.r);
}

static void test_textrec_field_sum_reads_sixteen_hex_digits(void **state)
{
	reader_t rd;
	uint64_t v = 0;
	(void)state;
	reader_open(&rd, &blanks_format,
		    "s 0123456789ABCDEF 0123456789abcde 0123456789abcdef0\n");
	next_record(&rd);
	assert_int_equal(flow_textrec_field_sum(&rd.r, 1, &v), FLOW_OK);
	assert_true(v == 0x0123456789abcdefu);
	v = 5;
	assert_int_equal(flow_textrec_field_sum(&rd.r, 2, &v), FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg,
			    "t.txt:1: invalid checksum '0123456789abcde' (expected 16 hex digits)");
	flow_diag_clear(&rd.diag);
	assert_int_equal(flow_textrec_field_sum(&rd.r, 3, &v), FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg,
			    "t.txt:1: invalid checksum '0123456789abcdef0' (expected 16 hex digits)");
	assert_int_equal(v, 5);
	flow_textrec_release(&rd.r);
}

static void test_textrec_field_sum_in_lowercase_only_when_asked(void **state)
{
	reader_t rd;
	uint64_t v = 0;
	(void)state;
	reader_open(&rd, &strict_format, "s 0123456789abcdef 0123456789ABCDEF\n");
	next_record(&rd);
	assert_int_equal(flow_textrec_field_sum(&rd.r, 1, &v), FLOW_OK);
	assert_true(v == 0x0123456789abcdefu);
	assert_int_equal(flow_textrec_field_sum(&rd.r, 2, &v), FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg,
			    "t.txt:1: invalid checksum '0123456789ABCDEF' (expected 16 lowercase hex digits)");
	flow_textrec_release(&rd.r);
}

/* text, then its closing record with the XXH3-64 of text. */
static void sealed(char *out, size_t cap, const char *end_key,
		   const char *text)
{
	char hex[17];
	flow_checksum_format(flow_checksum(text, strlen(text)), hex);
	assert_true((size_t)snprintf(out, cap, "%s%s %s\n", text, end_key,
				     hex) < cap);
}

/* Read every record of the reader's text, the last one the closing one,
 * and verify it. */
static flow_err_t read_to_end(reader_t *rd)
{
	char *line;
	size_t len;
	int st;
	uint64_t stored = 0;
	while ((st = flow_textrec_next(&rd->r, &line, &len)) == 1) {
		assert_int_equal(flow_textrec_split(&rd->r, line), FLOW_OK);
		if (rd->r.nfields > 0 &&
		    strcmp(rd->r.fields[0], rd->r.format->end_key) == 0)
			break;
	}
	assert_int_equal(st, 1);
	assert_int_equal(flow_textrec_field_sum(&rd->r, 1, &stored), FLOW_OK);
	return flow_textrec_verify_end(&rd->r, stored);
}

static void test_textrec_verify_end_checks_every_byte_before_it(void **state)
{
	reader_t rd;
	char text[256];
	(void)state;
	/* "checksums" is not the closing key: its line is summed too. */
	sealed(text, sizeof(text), "checksum",
	       "flow-x 1\n\tindented  line\nchecksums 2\n");
	reader_open(&rd, &blanks_format, text);
	assert_int_equal(read_to_end(&rd), FLOW_OK);
	assert_int_equal(rd.r.line, 4);
	flow_textrec_release(&rd.r);
	sealed(text, sizeof(text), "end", "flow-x 1\nendless 2\n");
	reader_open(&rd, &strict_format, text);
	assert_int_equal(read_to_end(&rd), FLOW_OK);
	flow_textrec_release(&rd.r);
}

static void test_textrec_verify_end_names_both_sums(void **state)
{
	reader_t rd;
	char text[256], want[256], hex[17];
	(void)state;
	sealed(text, sizeof(text), "checksum", "flow-x 1\nvalue 2\n");
	text[15] = '3'; /* "value 3" */
	flow_checksum_format(flow_checksum("flow-x 1\nvalue 3\n", 17), hex);
	snprintf(want, sizeof(want),
		 "t.txt:3: checksum mismatch: stored %.16s, computed %s",
		 text + 26, hex);
	reader_open(&rd, &blanks_format, text);
	assert_int_equal(read_to_end(&rd), FLOW_ERR_CHECKSUM);
	assert_int_equal(rd.diag.err, FLOW_ERR_CHECKSUM);
	assert_string_equal(rd.diag.msg, want);
	flow_textrec_release(&rd.r);

	sealed(text, sizeof(text), "end", "flow-x 1\nvalue 2\n");
	text[15] = '3';
	snprintf(want, sizeof(want),
		 "t.txt:3: checksum mismatch: stored %.16s, computed %s (damaged file)",
		 text + 21, hex);
	reader_open(&rd, &strict_format, text);
	assert_int_equal(read_to_end(&rd), FLOW_ERR_CHECKSUM);
	assert_string_equal(rd.diag.msg, want);
	flow_textrec_release(&rd.r);
}

static void test_textrec_error_eof_points_past_the_last_line(void **state)
{
	reader_t rd;
	char *line;
	size_t len;
	(void)state;
	reader_open(&rd, &blanks_format, "a\nb\n");
	while (flow_textrec_next(&rd.r, &line, &len) == 1)
		;
	assert_int_equal(flow_textrec_error_eof(&rd.r, "checksum SUM"),
			 FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg,
			    "t.txt:3: unexpected end of file, expected 'checksum SUM'");
	flow_textrec_release(&rd.r);

	reader_open(&rd, &strict_format, "");
	assert_int_equal(flow_textrec_next(&rd.r, &line, &len), 0);
	assert_int_equal(flow_textrec_error_eof(&rd.r, "flow-x 1"),
			 FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg,
			    "t.txt:1: unexpected end of file, expected 'flow-x 1' (truncated?)");
	flow_textrec_release(&rd.r);
}

static void test_textrec_error_prefixes_path_and_line(void **state)
{
	reader_t rd;
	(void)state;
	reader_open(&rd, &blanks_format, "a\nb\n");
	next_record(&rd);
	next_record(&rd);
	assert_int_equal(flow_textrec_error(&rd.r, "unknown key '%s'",
					    rd.r.fields[0]),
			 FLOW_ERR_FORMAT);
	assert_int_equal(rd.diag.err, FLOW_ERR_FORMAT);
	assert_string_equal(rd.diag.msg, "t.txt:2: unknown key 'b'");
	flow_textrec_release(&rd.r);
}

static void test_textrec_release_accepts_null_and_a_released_reader(void **state)
{
	reader_t rd;
	(void)state;
	flow_textrec_release(NULL);
	reader_open(&rd, &blanks_format, "a\n");
	flow_textrec_release(&rd.r);
	flow_textrec_release(&rd.r);
}

static void test_textrec_seal_closes_what_was_printed(void **state)
{
	flow_textrec_buf_t b = FLOW_TEXTREC_BUF_INIT;
	char want[64], hex[17];
	(void)state;
	flow_textrec_printf(&b, "flow-x %d\n", 1);
	flow_textrec_printf(&b, "name %s\n", "abc");
	uint64_t sum = flow_textrec_seal(&b, &strict_format);
	assert_false(b.failed);
	assert_true(sum == flow_checksum("flow-x 1\nname abc\n", 18));
	flow_checksum_format(sum, hex);
	snprintf(want, sizeof(want), "flow-x 1\nname abc\nend %s\n", hex);
	assert_string_equal(b.buf, want);
	assert_int_equal(b.len, strlen(want));

	/* What the writer seals, the reader accepts. */
	reader_t rd;
	reader_open(&rd, &strict_format, b.buf);
	assert_int_equal(read_to_end(&rd), FLOW_OK);
	flow_textrec_release(&rd.r);
	flow_textrec_buf_release(&b);
	assert_null(b.buf);
	assert_int_equal(b.len, 0);
	flow_textrec_buf_release(&b);
	flow_textrec_buf_release(NULL);
}

static void test_textrec_printf_grows_past_its_first_block(void **state)
{
	flow_textrec_buf_t b = FLOW_TEXTREC_BUF_INIT;
	(void)state;
	for (int i = 0; i < 1000; i++)
		flow_textrec_printf(&b, "line %04d\n", i);
	assert_false(b.failed);
	assert_int_equal(b.len, 10000);
	assert_true(b.cap > 4096);
	assert_memory_equal(b.buf + 9990, "line 0999\n", 10);
	assert_int_equal(b.buf[b.len], '\0');
	flow_textrec_buf_release(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_textrec_next_gives_each_line_then_the_end),
		cmocka_unit_test(test_textrec_next_leaves_a_nul_in_a_line_to_the_caller),
		cmocka_unit_test(test_textrec_next_refuses_a_last_line_without_newline),
		cmocka_unit_test(test_textrec_split_on_blanks_skips_runs_of_them),
		cmocka_unit_test(test_textrec_split_refuses_more_fields_than_the_most),
		cmocka_unit_test(test_textrec_split_on_single_spaces_keeps_tabs),
		cmocka_unit_test(test_textrec_split_on_single_spaces_refuses_empty_fields),
		cmocka_unit_test(test_textrec_expect_fields_names_the_syntax),
		cmocka_unit_test(test_textrec_parse_u64_takes_only_canonical_decimals),
		cmocka_unit_test(test_textrec_field_u64_holds_to_min_and_max),
		cmocka_unit_test(test_textrec_field_sum_reads_sixteen_hex_digits),
		cmocka_unit_test(test_textrec_field_sum_in_lowercase_only_when_asked),
		cmocka_unit_test(test_textrec_verify_end_checks_every_byte_before_it),
		cmocka_unit_test(test_textrec_verify_end_names_both_sums),
		cmocka_unit_test(test_textrec_error_eof_points_past_the_last_line),
		cmocka_unit_test(test_textrec_error_prefixes_path_and_line),
		cmocka_unit_test(test_textrec_release_accepts_null_and_a_released_reader),
		cmocka_unit_test(test_textrec_seal_closes_what_was_printed),
		cmocka_unit_test(test_textrec_printf_grows_past_its_first_block),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
