/* The manifest: write/read round trip, the checksum, and parse errors that
 * name the line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <flow/checksum.h>
#include <flow/file.h>
#include <flow/shard.h>

#include "testutil.h"

static char dir[256];
static char mpath[512];

static int setup(void **state)
{
	(void)state;
	if (testutil_mkdtemp(dir, sizeof(dir), "manifest") != 0)
		return -1;
	snprintf(mpath, sizeof(mpath), "%s/manifest", dir);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	return testutil_rmtree(dir);
}

static flow_manifest_shard_t shards[3] = {
	{ "val-000000.bin", FLOW_SPLIT_VAL, { 100, 280, 0x0123456789abcdefull } },
	{ "train-000000.bin", FLOW_SPLIT_TRAIN, { 1000, 2080, 0xfedcba9876543210ull } },
	{ "train-000001.bin", FLOW_SPLIT_TRAIN, { 7, 94, 1 } },
};

static flow_manifest_t sample(void)
{
	flow_manifest_t m;
	memset(&m, 0, sizeof(m));
	m.version = 1;
	m.vocab = 50257;
	m.token_dtype = FLOW_DTYPE_U16;
	m.zstd_level = 3;
	m.frame_tokens = 65536;
	m.split_tokens[FLOW_SPLIT_TRAIN] = 1007;
	m.split_tokens[FLOW_SPLIT_VAL] = 100;
	m.nshards = 3;
	m.shards = shards;
	return m;
}

/* Write text (with a correct checksum line appended when sum is true). */
static void put_manifest(const char *text, bool sum)
{
	FILE *f = fopen(mpath, "wb");
	fputs(text, f);
	if (sum) {
		char hex[17];
		flow_checksum_format(flow_checksum(text, strlen(text)), hex);
		fprintf(f, "checksum %s\n", hex);
	}
	fclose(f);
}

static void test_manifest_round_trip(void **state)
{
	(void)state;
	flow_manifest_t m = sample(), back;
	flow_diag_t diag = FLOW_DIAG_INIT;
	FILE *f = fopen(mpath, "wb");
	assert_int_equal(flow_manifest_write(&m, f, &diag), FLOW_OK);
	fclose(f);
	char *text;
	size_t len;
	assert_int_equal(flow_file_read_all(mpath, &text, &len, NULL), FLOW_OK);
	const char *want =
		"flow-manifest 1\n"
		"vocab 50257\n"
		"token_dtype u16\n"
		"compression zstd 3 65536\n"
		"split train 1007 tokens 2 shards\n"
		"split val 100 tokens 1 shards\n"
		"shard val-000000.bin 100 280 0123456789abcdef\n"
		"shard train-000000.bin 1000 2080 fedcba9876543210\n"
		"shard train-000001.bin 7 94 0000000000000001\n";
	assert_memory_equal(text, want, strlen(want));
	char hex[17];
	flow_checksum_format(flow_checksum(want, strlen(want)), hex);
	char last[64];
	snprintf(last, sizeof(last), "checksum %s\n", hex);
	assert_string_equal(text + strlen(want), last);
	free(text);

	assert_int_equal(flow_manifest_read(dir, &back, &diag), FLOW_OK);
	assert_int_equal(back.checksum, m.checksum);
	assert_int_equal(back.version, 1);
	assert_int_equal(back.vocab, 50257);
	assert_int_equal(back.token_dtype, FLOW_DTYPE_U16);
	assert_int_equal(back.zstd_level, 3);
	assert_int_equal(back.frame_tokens, 65536);
	assert_int_equal(back.split_tokens[FLOW_SPLIT_TRAIN], 1007);
	assert_int_equal(back.split_tokens[FLOW_SPLIT_VAL], 100);
	assert_int_equal(back.nshards, 3);
	for (size_t i = 0; i < 3; i++) {
		assert_string_equal(back.shards[i].file, shards[i].file);
		assert_int_equal(back.shards[i].split, shards[i].split);
		assert_int_equal(back.shards[i].info.tokens, shards[i].info.tokens);
		assert_int_equal(back.shards[i].info.bytes, shards[i].info.bytes);
		assert_int_equal(back.shards[i].info.checksum, shards[i].info.checksum);
	}
	flow_manifest_release(&back);
	flow_manifest_release(&back); /* twice is fine */
}

static void test_manifest_uncompressed_and_comments(void **state)
{
	(void)state;
	put_manifest("# made by hand\n"
		     "flow-manifest 1\n"
		     "vocab 256\n"
		     "\n"
		     "token_dtype u16\n"
		     "compression none\n"
		     "split train 5 tokens 1 shards\n"
		     "split val 0 tokens 0 shards\n"
		     "# the shards\n"
		     "shard train-000000.bin 5 82 0000000000000002\n", true);
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_manifest_read(dir, &m, &diag), FLOW_OK);
	assert_int_equal(m.zstd_level, 0);
	assert_int_equal(m.frame_tokens, 0);
	assert_int_equal(m.nshards, 1);
	flow_manifest_release(&m);
}

static const char good_head[] =
	"flow-manifest 1\n"
	"vocab 256\n"
	"token_dtype u16\n"
	"compression none\n"
	"split train 5 tokens 1 shards\n"
	"split val 0 tokens 0 shards\n";

static void expect_error(const char *text, bool sum, flow_err_t err,
			 const char *want)
{
	put_manifest(text, sum);
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_manifest_read(dir, &m, &diag), err);
	char full[600];
	snprintf(full, sizeof(full), "%s/manifest:%s", dir, want);
	if (strcmp(diag.msg, full) != 0)
		fail_msg("got '%s', want '%s'", diag.msg, full);
}

static void test_manifest_errors_name_the_line(void **state)
{
	(void)state;
	char buf[1024];
	expect_error("flow-manifst 1\n", false, FLOW_ERR_FORMAT,
		     "1: expected 'flow-manifest', got 'flow-manifst'");
	expect_error("flow-manifest 2\n", false, FLOW_ERR_FORMAT,
		     "1: unsupported manifest version 2 (expected 1)");
	expect_error("flow-manifest 1\nvocab x\n", false, FLOW_ERR_FORMAT,
		     "2: invalid vocabulary size 'x'");
	expect_error("flow-manifest 1\nvocab 70000\ntoken_dtype u16\n", false,
		     FLOW_ERR_FORMAT,
		     "3: token dtype u16 cannot hold the vocabulary size 70000");
	expect_error("flow-manifest 1\nvocab 256\ntoken_dtype f32\n", false,
		     FLOW_ERR_FORMAT,
		     "3: unknown token dtype 'f32' (expected u16 or u32)");
	expect_error("flow-manifest 1\nvocab 256\ntoken_dtype u16\ncompression lz4 1 2\n",
		     false, FLOW_ERR_FORMAT,
		     "4: unknown compression 'lz4' (expected zstd or none)");
	expect_error("flow-manifest 1\nvocab 256\ntoken_dtype u16\ncompression none\nsplit val 0 tokens 0 shards\n",
		     false, FLOW_ERR_FORMAT, "5: expected split 'train', got 'val'");
	snprintf(buf, sizeof(buf), "%sshrad train-000000.bin 5 82 0000000000000002\n", good_head);
	expect_error(buf, true, FLOW_ERR_FORMAT, "7: expected 'shard', got 'shrad'");
	snprintf(buf, sizeof(buf), "%sshard ../x.bin 5 82 0000000000000002\n", good_head);
	expect_error(buf, true, FLOW_ERR_FORMAT, "7: invalid shard file name '../x.bin'");
	snprintf(buf, sizeof(buf), "%sshard test-0.bin 5 82 0000000000000002\n", good_head);
	expect_error(buf, true, FLOW_ERR_FORMAT,
		     "7: shard file name 'test-0.bin' does not start with 'train-' or 'val-'");
	snprintf(buf, sizeof(buf), "%sshard train-0.bin 5 82 00000002\n", good_head);
	expect_error(buf, true, FLOW_ERR_FORMAT,
		     "7: invalid checksum '00000002' (expected 16 hex digits)");
	snprintf(buf, sizeof(buf), "%sshard train-0.bin 5\n", good_head);
	expect_error(buf, true, FLOW_ERR_FORMAT,
		     "7: expected 'shard FILE TOKENS BYTES CHECKSUM', got 3 fields");
	snprintf(buf, sizeof(buf), "%sshard train-0.bin 6 82 0000000000000002\n", good_head);
	expect_error(buf, true, FLOW_ERR_FORMAT,
		     "8: split 'train' has 5 tokens, its shards add up to 6");
	snprintf(buf, sizeof(buf), "%sshard train-0.bin 5 82 0000000000000002\nshard train-1.bin 0 72 0000000000000002\n", good_head);
	expect_error(buf, true, FLOW_ERR_FORMAT,
		     "9: split 'train' lists 1 shards, the manifest has 2");
	snprintf(buf, sizeof(buf), "%sshard train-0.bin 5 82 0000000000000002\n", good_head);
	expect_error(buf, false, FLOW_ERR_FORMAT,
		     "8: unexpected end of file, expected 'checksum'");
	snprintf(buf, sizeof(buf), "%sshard train-0.bin 5 82 0000000000000002\nchecksum 0000000000000000\n", good_head);
	put_manifest(buf, false);
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_manifest_read(dir, &m, &diag), FLOW_ERR_CHECKSUM);
	assert_non_null(strstr(diag.msg, "manifest:8: checksum mismatch: stored 0000000000000000, computed "));
}

static void test_manifest_trailing_line_and_missing_file(void **state)
{
	(void)state;
	char buf[1024];
	snprintf(buf, sizeof(buf), "%sshard train-0.bin 5 82 0000000000000002\n", good_head);
	put_manifest(buf, true);
	FILE *f = fopen(mpath, "ab");
	fputs("# after\n", f);
	fclose(f);
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_manifest_read(dir, &m, &diag), FLOW_ERR_FORMAT);
	assert_non_null(strstr(diag.msg, "manifest:9: unexpected line after the checksum"));
	unlink(mpath);
	flow_diag_clear(&diag);
	assert_int_equal(flow_manifest_read(dir, &m, &diag), FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "cannot open '"));
	put_manifest("flow-manifest 1", false);
	flow_diag_clear(&diag);
	assert_int_equal(flow_manifest_read(dir, &m, &diag), FLOW_ERR_FORMAT);
	assert_non_null(strstr(diag.msg, "manifest:1: missing newline at the end of the file"));
}

static void test_manifest_write_rejects_inconsistent_counts(void **state)
{
	(void)state;
	flow_manifest_t m = sample();
	m.split_tokens[FLOW_SPLIT_TRAIN] = 1;
	flow_diag_t diag = FLOW_DIAG_INIT;
	FILE *f = fopen(mpath, "wb");
	assert_int_equal(flow_manifest_write(&m, f, &diag), FLOW_ERR_USAGE);
	fclose(f);
	assert_string_equal(diag.msg, "manifest: split 'train' has 1 tokens, its shards add up to 1007");
}

static void test_manifest_print_tsv_and_json(void **state)
{
	(void)state;
	flow_manifest_t m = sample();
	m.checksum = 0xabcull;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_int_equal(flow_manifest_print(&m, f, false, NULL), FLOW_OK);
	fclose(f);
	assert_non_null(strstr(buf, "# checksum 0000000000000abc\n"
				    "file\tsplit\ttokens\tbytes\tchecksum\n"
				    "val-000000.bin\tval\t100\t280\t0123456789abcdef\n"
				    "train-000000.bin\ttrain\t1000\t2080\tfedcba9876543210\n"));
	free(buf);
	f = open_memstream(&buf, &len);
	assert_int_equal(flow_manifest_print(&m, f, true, NULL), FLOW_OK);
	fclose(f);
	assert_non_null(strstr(buf, "\"compression\": {\"codec\": \"zstd\", \"level\": 3, \"frame_tokens\": 65536}"));
	assert_non_null(strstr(buf, "{\"file\": \"train-000001.bin\", \"split\": \"train\", \"tokens\": 7, \"bytes\": 94, \"checksum\": \"0000000000000001\"}"));
	free(buf);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_manifest_round_trip),
		T(test_manifest_uncompressed_and_comments),
		T(test_manifest_errors_name_the_line),
		T(test_manifest_trailing_line_and_missing_file),
		T(test_manifest_write_rejects_inconsistent_counts),
		T(test_manifest_print_tsv_and_json),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
