/* Building and verifying dataset directories: the split and sharding
 * arithmetic, the atomic directory, and what a failed build leaves (no
 * output directory, no temporary directory). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flow/file.h>
#include <flow/shard.h>

#include "testutil.h"

static char dir[256];
static char out[512];
static char in_a[512], in_b[512];

/* Write n bytes (at most 1024) cycling through 26 letters from base. */
static int write_text(const char *path, size_t n, char base)
{
	char buf[1024];
	if (n > sizeof(buf))
		return -1;
	for (size_t i = 0; i < n; i++)
		buf[i] = (char)(base + (int)(i % 26));
	return testutil_write_file(path, buf, n);
}

static int setup(void **state)
{
	(void)state;
	if (testutil_mkdtemp(dir, sizeof(dir), "dataset") != 0)
		return -1;
	snprintf(out, sizeof(out), "%s/data", dir);
	snprintf(in_a, sizeof(in_a), "%s/a.txt", dir);
	snprintf(in_b, sizeof(in_b), "%s/b.txt", dir);
	if (write_text(in_a, 1000, 'a') != 0 || write_text(in_b, 537, 'A') != 0)
		return -1;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	return testutil_rmtree(dir);
}

static flow_dataset_options_t options(uint64_t shard, uint64_t val, int level)
{
	flow_dataset_options_t o;
	memset(&o, 0, sizeof(o));
	o.input.format = FLOW_INPUT_AUTO;
	o.shard_tokens = shard;
	o.val_tokens = val;
	o.zstd_level = level;
	o.frame_tokens = level ? 100 : 0;
	return o;
}

static void test_dataset_split_and_shard_sizes(void **state)
{
	(void)state;
	const char *inputs[] = { in_a, in_b };
	flow_dataset_options_t o = options(300, 450, 0);
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_dataset_build(out, inputs, 2, &o, &m, &diag), FLOW_OK);
	/* 1537 tokens: val 300 + 150, train 300 + 300 + 300 + 187. */
	static const struct { const char *file; uint64_t tokens; } want[] = {
		{ "val-000000.bin", 300 },   { "val-000001.bin", 150 },
		{ "train-000000.bin", 300 }, { "train-000001.bin", 300 },
		{ "train-000002.bin", 300 }, { "train-000003.bin", 187 },
	};
	assert_int_equal(m.nshards, 6);
	for (size_t i = 0; i < 6; i++) {
		assert_string_equal(m.shards[i].file, want[i].file);
		assert_int_equal(m.shards[i].info.tokens, want[i].tokens);
	}
	assert_int_equal(m.split_tokens[FLOW_SPLIT_VAL], 450);
	assert_int_equal(m.split_tokens[FLOW_SPLIT_TRAIN], 1087);
	assert_int_equal(m.vocab, 256);
	assert_int_equal(m.token_dtype, FLOW_DTYPE_U16);
	assert_int_equal(testutil_count_entries(out), 7);
	assert_int_equal(testutil_count_entries(dir), 3); /* a.txt, b.txt, data */

	/* The manifest on disk is the one returned, and tokens come back in
	 * input order across the inputs and the split. */
	flow_manifest_t back;
	assert_int_equal(flow_manifest_read(out, &back, &diag), FLOW_OK);
	assert_int_equal(back.checksum, m.checksum);
	char path[1024];
	snprintf(path, sizeof(path), "%s/train-000002.bin", out);
	flow_shard_t *s;
	uint32_t t[300];
	assert_int_equal(flow_shard_open(path, &s, &diag), FLOW_OK);
	assert_int_equal(flow_shard_read(s, 0, 300, t, &diag), FLOW_OK);
	/* train-000002 starts at token 450 + 600 = 1050: b.txt's token 50. */
	assert_int_equal(t[0], 'A' + 50 % 26);
	flow_shard_close(s);
	assert_int_equal(flow_dataset_verify(out, &diag), FLOW_OK);
	flow_manifest_release(&back);
	flow_manifest_release(&m);
}

static void test_dataset_compressed_with_vocab(void **state)
{
	(void)state;
	const char *inputs[] = { in_a };
	flow_dataset_options_t o = options(1000, 0, 3);
	o.vocab = 100000; /* beyond u16: u32 tokens */
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_dataset_build(out, inputs, 1, &o, &m, &diag), FLOW_OK);
	assert_int_equal(m.nshards, 1);
	assert_int_equal(m.token_dtype, FLOW_DTYPE_U32);
	assert_int_equal(m.zstd_level, 3);
	assert_int_equal(m.frame_tokens, 100);
	assert_int_equal(flow_dataset_verify(out, &diag), FLOW_OK);
	flow_manifest_release(&m);
}

static void test_dataset_existing_output_is_untouched(void **state)
{
	(void)state;
	const char *inputs[] = { in_a };
	flow_dataset_options_t o = options(100, 0, 0);
	assert_int_equal(mkdir(out, 0755), 0);
	char keep[1024];
	snprintf(keep, sizeof(keep), "%s/keep", out);
	assert_int_equal(write_text(keep, 3, 'x'), 0);
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_dataset_build(out, inputs, 1, &o, NULL, &diag), FLOW_ERR_IO);
	char want[600];
	snprintf(want, sizeof(want), "output directory '%s' already exists", out);
	assert_string_equal(diag.msg, want);
	assert_int_equal(testutil_count_entries(out), 1);
	assert_int_equal(testutil_count_entries(dir), 3);
}

static void test_dataset_failed_build_leaves_nothing(void **state)
{
	(void)state;
	/* The second input is missing: the first is already sharded when the
	 * error comes, so the temporary directory holds files by then. */
	char missing[600];
	snprintf(missing, sizeof(missing), "%s/missing.txt", dir);
	const char *inputs[] = { in_a, missing };
	flow_dataset_options_t o = options(100, 0, 0);
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_dataset_build(out, inputs, 2, &o, NULL, &diag);
	assert_int_equal(err, FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "missing.txt"));
	assert_int_equal(testutil_count_entries(dir), 2); /* a.txt, b.txt only */

	/* An error in the middle of the data, after shards were written. */
	char bad[600];
	snprintf(bad, sizeof(bad), "%s/bad.u16", dir);
	unsigned char ids[1000]; /* 500 u16 tokens of 1, but 0x7f7f at 401 */
	for (int i = 0; i < 500; i++) {
		ids[2 * i] = i == 401 ? 0x7f : 1;
		ids[2 * i + 1] = i == 401 ? 0x7f : 0;
	}
	assert_int_equal(testutil_write_file(bad, ids, sizeof(ids)), 0);
	const char *inputs2[] = { bad };
	o = options(100, 0, 0);
	o.input.format = FLOW_INPUT_RAW;
	o.input.raw_dtype = FLOW_DTYPE_U16;
	o.vocab = 1000;
	flow_diag_clear(&diag);
	assert_int_equal(flow_dataset_build(out, inputs2, 1, &o, NULL, &diag), FLOW_ERR_FORMAT);
	assert_non_null(strstr(diag.msg, "at byte 802"));
	unlink(bad);
	assert_int_equal(testutil_count_entries(dir), 2);
}

static void test_dataset_rejects_bad_options(void **state)
{
	(void)state;
	const char *inputs[] = { in_a };
	flow_dataset_options_t o = options(0, 0, 0);
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_dataset_build(out, inputs, 1, &o, NULL, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "tokens per shard must be at least 1");
	o = options(100, 1000, 0);
	flow_diag_clear(&diag);
	assert_int_equal(flow_dataset_build(out, inputs, 1, &o, NULL, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "the inputs hold 1000 tokens, no more than the 1000 validation tokens: none left to train on");
	o = options(100, 0, 0);
	flow_diag_clear(&diag);
	assert_int_equal(flow_dataset_build(out, inputs, 0, &o, NULL, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "no input files");
	assert_int_equal(testutil_count_entries(dir), 2);
}

static void test_dataset_verify_names_the_bad_shard(void **state)
{
	(void)state;
	const char *inputs[] = { in_a };
	flow_dataset_options_t o = options(400, 0, 0);
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_dataset_build(out, inputs, 1, &o, NULL, &diag), FLOW_OK);
	char path[1024];
	snprintf(path, sizeof(path), "%s/train-000001.bin", out);
	FILE *f = fopen(path, "r+b");
	fseek(f, 100, SEEK_SET);
	fputc(0, f);
	fclose(f);
	assert_int_equal(flow_dataset_verify(out, &diag), FLOW_ERR_CHECKSUM);
	char want[1200];
	snprintf(want, sizeof(want), "%s: checksum mismatch at byte 864", path);
	if (strncmp(diag.msg, want, strlen(want)) != 0)
		fail_msg("got '%s'", diag.msg);
	unlink(path);
	flow_diag_clear(&diag);
	assert_int_equal(flow_dataset_verify(out, &diag), FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "train-000001.bin"));
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_dataset_split_and_shard_sizes),
		T(test_dataset_compressed_with_vocab),
		T(test_dataset_existing_output_is_untouched),
		T(test_dataset_failed_build_leaves_nothing),
		T(test_dataset_rejects_bad_options),
		T(test_dataset_verify_names_the_bad_shard),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
