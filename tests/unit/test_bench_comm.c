/* flow-bench's collectives (lib/bench/bench_comm.c) on one rank: the bus
 * bandwidth factors of nccl-tests, collective names, and that every
 * collective is run and checked.  On many ranks: tests/cluster/comm.bats
 * runs flow-bench comm --nproc 3 for every collective. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <flow/bench_comm.h>
#include <flow/comm.h>

#include "worldutil.h"

static void test_bench_comm_factors_follow_nccl_tests(void **state)
{
	flow_bench_coll_t op;
	flow_diag_t diag = FLOW_DIAG_INIT;
	(void)state;
	assert_true(flow_bench_coll_busbw_factor(FLOW_BENCH_ALL_REDUCE, 4) == 1.5);
	assert_true(flow_bench_coll_busbw_factor(FLOW_BENCH_ALL_GATHER, 4) == 0.75);
	assert_true(flow_bench_coll_busbw_factor(FLOW_BENCH_REDUCE_SCATTER, 2) == 0.5);
	assert_true(flow_bench_coll_busbw_factor(FLOW_BENCH_ALL_TO_ALL, 8) == 0.875);
	assert_true(flow_bench_coll_busbw_factor(FLOW_BENCH_BROADCAST, 8) == 1.0);
	assert_int_equal(flow_bench_coll_lookup("all_to_all", &op, &diag), FLOW_OK);
	assert_int_equal(op, FLOW_BENCH_ALL_TO_ALL);
	assert_int_equal(flow_bench_coll_lookup("allreduce", &op, &diag),
			 FLOW_ERR_USAGE);
	assert_non_null(strstr(diag.msg, "unknown collective 'allreduce'"));
}

static void test_bench_comm_checks_every_collective(void **state)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	(void)state;
	for (int op = 0; op < FLOW_BENCH_NCOLLS; op++) {
		flow_bench_comm_result_t r;
		assert_int_equal(flow_bench_comm_run(worldutil_comm, (flow_bench_coll_t)op,
						     FLOW_DTYPE_BF16, 1000, 2, 1,
						     &r, &diag),
				 FLOW_OK);
		assert_int_equal(r.bytes, 1000);
		assert_int_equal(r.count, 500);
		assert_int_equal(r.wrong, 0);
		assert_true(r.time_us >= 0);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bench_comm_factors_follow_nccl_tests),
		cmocka_unit_test(test_bench_comm_checks_every_collective),
	};
	return cmocka_run_group_tests(tests, worldutil_setup,
				      worldutil_teardown);
}
