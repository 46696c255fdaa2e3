/* XXH3-64 checksums: known answers, streaming equals one-shot, hex form. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <flow/checksum.h>

static void test_checksum_known_answers(void **state)
{
	(void)state;
	/* XXH3_64bits of the empty input, from the xxHash specification. */
	assert_true(flow_checksum("", 0) == 0x2D06800538D394C2ull);
	assert_true(flow_checksum("a", 1) != flow_checksum("b", 1));
}

static void test_checksum_streaming_equals_one_shot(void **state)
{
	(void)state;
	unsigned char buf[5000];
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (unsigned char)(i * 131 + 7);
	flow_checksum_state_t *s = flow_checksum_state_new();
	assert_non_null(s);
	size_t pieces[] = { 1, 17, 240, 241, 1000, 3501 };
	size_t off = 0;
	for (size_t i = 0; i < 6; i++) {
		flow_checksum_update(s, buf + off, pieces[i]);
		off += pieces[i];
	}
	assert_int_equal(off, sizeof(buf));
	assert_true(flow_checksum_digest(s) == flow_checksum(buf, sizeof(buf)));
	flow_checksum_reset(s);
	assert_true(flow_checksum_digest(s) == flow_checksum("", 0));
	flow_checksum_state_free(s);
	flow_checksum_state_free(NULL);
}

static void test_checksum_hex_round_trip(void **state)
{
	(void)state;
	char hex[17];
	uint64_t back;
	flow_checksum_format(0x00ab00cd00ef0012ull, hex);
	assert_string_equal(hex, "00ab00cd00ef0012");
	assert_int_equal(flow_checksum_parse(hex, &back, NULL), FLOW_OK);
	assert_true(back == 0x00ab00cd00ef0012ull);
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_checksum_parse("00ab00cd00ef001", &back, &diag),
			 FLOW_ERR_FORMAT);
	assert_string_equal(diag.msg,
			    "invalid checksum '00ab00cd00ef001': expected 16 hex digits");
	assert_int_equal(flow_checksum_parse("00ab00cd00ef0012f", &back, NULL),
			 FLOW_ERR_FORMAT);
	assert_int_equal(flow_checksum_parse("00ab00cd00ef001g", &back, NULL),
			 FLOW_ERR_FORMAT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_checksum_known_answers),
		cmocka_unit_test(test_checksum_streaming_equals_one_shot),
		cmocka_unit_test(test_checksum_hex_round_trip),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
