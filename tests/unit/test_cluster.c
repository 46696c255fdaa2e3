/* Cluster profiles: the built-in profile, every setting a profile file
 * can give, and every error the reader reports, each message exact and
 * naming the file and line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <flow/cluster.h>

#include "testutil.h"

typedef struct scratch {
	char dir[256];
	char path[300]; /* dir/cluster.prof */
} scratch_t;

static int setup(void **state)
{
	static scratch_t s;
	if (testutil_mkdtemp(s.dir, sizeof(s.dir), "cluster") != 0)
		return -1;
	snprintf(s.path, sizeof(s.path), "%s/cluster.prof", s.dir);
	*state = &s;
	return 0;
}

static int teardown(void **state)
{
	scratch_t *s = *state;
	return testutil_rmtree(s->dir);
}

/* Writes text as the scratch profile and returns its path. */
static const char *profile(void **state, const char *text)
{
	scratch_t *s = *state;
	assert_int_equal(testutil_write_file(s->path, text, strlen(text)), 0);
	return s->path;
}

static void test_cluster_default_is_the_documented_profile(void **state)
{
	(void)state;
	flow_cluster_t c;
	flow_cluster_default(&c);
	assert_int_equal(c.ranks_per_node, 8);
	assert_true(c.intra.alpha_s == 5e-6 && c.intra.beta_bps == 100e9);
	assert_true(c.inter.alpha_s == 10e-6 && c.inter.beta_bps == 12.5e9);
	assert_int_equal(c.memory_bytes, 0);
}

static void test_cluster_read_sets_what_the_profile_gives(void **state)
{
	/* Each setting as the reader converts it: microseconds and GB/s. */
	flow_cluster_t def, some, all;
	flow_cluster_default(&def);
	some = def;
	some.ranks_per_node = 4;
	some.inter = (flow_link_t){ 2.5 * 1e-6, 25 * 1e9 };
	all.ranks_per_node = 2;
	all.intra = (flow_link_t){ 1 * 1e-6, 200 * 1e9 };
	all.inter = (flow_link_t){ 3 * 1e-6, 50 * 1e9 };
	all.memory_bytes = 536870912;
	const struct {
		const char *text;
		const flow_cluster_t *want;
	} cases[] = {
		/* Missing settings keep the defaults; comments, blank lines,
		 * tabs and CRLF are allowed. */
		{ "# measured by flow-bench profile\n"
		  "\n"
		  "ranks_per_node 4   # two sockets\n"
		  "  link inter\t2.5 25\r\n", &some },
		{ "memory 0.5\nlink intra 1 200\nlink inter 3 50\nranks_per_node 2\n",
		  &all },
		{ "", &def },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *path = profile(state, cases[i].text);
		flow_cluster_t c;
		flow_diag_t diag = FLOW_DIAG_INIT;
		memset(&c, 0x33, sizeof(c));
		assert_int_equal(flow_cluster_read(path, &c, &diag), FLOW_OK);
		assert_int_equal(c.ranks_per_node, cases[i].want->ranks_per_node);
		assert_true(c.intra.alpha_s == cases[i].want->intra.alpha_s);
		assert_true(c.intra.beta_bps == cases[i].want->intra.beta_bps);
		assert_true(c.inter.alpha_s == cases[i].want->inter.alpha_s);
		assert_true(c.inter.beta_bps == cases[i].want->inter.beta_bps);
		assert_int_equal(c.memory_bytes, cases[i].want->memory_bytes);
	}
}

static void test_cluster_read_errors_name_file_and_line(void **state)
{
	static const struct {
		const char *text, *msg;
	} cases[] = {
		/* ranks_per_node */
		{ "ranks_per_node\n", "%s:1: expected 'ranks_per_node N'" },
		{ "ranks_per_node 1 2 3 4 5\n", "%s:1: expected 'ranks_per_node N'" },
		{ "ranks_per_node 0\n", "%s:1: integer '0' out of range [1, 9223372036854775807]" },
		{ "ranks_per_node 8x\n", "%s:1: invalid integer '8x'" },
		{ "ranks_per_node 2\nranks_per_node 2\n", "%s:2: 'ranks_per_node' given twice" },
		/* link */
		{ "\n# x\nlink intra 5\n", "%s:3: expected 'link intra|inter ALPHA_US BETA_GBPS'" },
		{ "link intra 5 100 7\n", "%s:1: expected 'link intra|inter ALPHA_US BETA_GBPS'" },
		{ "link cross 5 100\n", "%s:1: expected 'link intra|inter ALPHA_US BETA_GBPS'" },
		{ "link intra five 100\n", "%s:1: invalid number 'five'" },
		{ "link intra -1 100\n", "%s:1: number '-1' out of range [0, 1e+09]" },
		{ "link intra 5 fast\n", "%s:1: invalid number 'fast'" },
		{ "link intra 5 2e9\n", "%s:1: number '2e9' out of range [0, 1e+09]" },
		{ "link intra 5 0\n", "%s:1: bandwidth '0' is not positive" },
		{ "link intra 5 100\nlink intra 5 100\n", "%s:2: 'link intra' given twice" },
		{ "link inter 5 100\nlink inter 6 100\n", "%s:2: 'link inter' given twice" },
		/* memory */
		{ "memory\n", "%s:1: expected 'memory GIB'" },
		{ "memory 8 GiB\n", "%s:1: expected 'memory GIB'" },
		{ "memory lots\n", "%s:1: invalid number 'lots'" },
		{ "memory 0\n", "%s:1: number '0' out of range [0.000976562, 1.04858e+06]" },
		{ "memory 80\n# more\nmemory 40\n", "%s:3: 'memory' given twice" },
		/* anything else */
		{ "bandwidth 5\n", "%s:1: unknown setting 'bandwidth'" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *path = profile(state, cases[i].text);
		char want[512];
		flow_cluster_t c;
		memset(&c, 0x33, sizeof(c));
		flow_cluster_t before = c;
		flow_diag_t diag = FLOW_DIAG_INIT;
		assert_int_equal(flow_cluster_read(path, &c, &diag), FLOW_ERR_FORMAT);
		snprintf(want, sizeof(want), cases[i].msg, path);
		assert_string_equal(diag.msg, want);
		assert_memory_equal(&c, &before, sizeof(c));
	}
}

static void test_cluster_read_reports_files_it_cannot_read(void **state)
{
	scratch_t *s = *state;
	char want[512];
	flow_cluster_t c;
	memset(&c, 0x33, sizeof(c));
	flow_cluster_t before = c;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_cluster_read("/nonexistent/cluster.prof", &c, &diag), FLOW_ERR_IO);
	assert_string_equal(diag.msg, "cannot open cluster profile '/nonexistent/cluster.prof': No such file or directory");
	/* A directory opens, but reading it fails. */
	flow_diag_clear(&diag);
	assert_int_equal(flow_cluster_read(s->dir, &c, &diag), FLOW_ERR_IO);
	snprintf(want, sizeof(want), "cannot read cluster profile '%s': Is a directory", s->dir);
	assert_string_equal(diag.msg, want);
	assert_memory_equal(&c, &before, sizeof(c));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cluster_default_is_the_documented_profile),
		cmocka_unit_test(test_cluster_read_sets_what_the_profile_gives),
		cmocka_unit_test(test_cluster_read_errors_name_file_and_line),
		cmocka_unit_test(test_cluster_read_reports_files_it_cannot_read),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
