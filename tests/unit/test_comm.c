/* The communicator API on one rank (the multi-rank behaviour is tested
 * under real launchers in tests/cluster): the world communicator of a
 * singleton (tests/unit/test_world.c tests the world itself) is one rank
 * talking to itself, its collectives copy, and bad arguments are refused
 * the same way they would be on many ranks. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <unistd.h>

#include <flow/comm.h>

#include "worldutil.h"

static void test_comm_world_of_a_singleton_is_one_rank_of_self(void **state)
{
	(void)state;
	assert_int_equal(flow_comm_size(worldutil_comm), 1);
	assert_int_equal(flow_comm_rank(worldutil_comm), 0);
	assert_int_equal(flow_comm_world_rank(worldutil_comm, 0), 0);
	assert_string_equal(flow_comm_transport(worldutil_comm), "self");
	assert_int_equal(flow_comm_backend(worldutil_comm), FLOW_COMM_CPU);
	assert_int_equal(flow_comm_device(worldutil_comm), -1);
}

static void test_comm_one_rank_collectives_copy(void **state)
{
	float in[5] = { 1, -2, 3.5f, 4, 5 }, out[5] = { 0 };
	size_t counts[1] = { 5 };
	flow_diag_t diag = FLOW_DIAG_INIT;
	(void)state;
	uint64_t seq = flow_comm_seq(worldutil_comm);
	assert_int_equal(flow_all_reduce(worldutil_comm, in, out, 5, FLOW_DTYPE_F32, &diag),
			 FLOW_OK);
	assert_memory_equal(in, out, sizeof in);
	memset(out, 0, sizeof out);
	assert_int_equal(flow_all_gather(worldutil_comm, in, out, counts, FLOW_DTYPE_F32,
					 &diag),
			 FLOW_OK);
	assert_memory_equal(in, out, sizeof in);
	memset(out, 0, sizeof out);
	assert_int_equal(flow_reduce_scatter(worldutil_comm, in, out, counts,
					     FLOW_DTYPE_F32, &diag),
			 FLOW_OK);
	assert_memory_equal(in, out, sizeof in);
	memset(out, 0, sizeof out);
	assert_int_equal(flow_all_to_all(worldutil_comm, in, counts, out, counts,
					 FLOW_DTYPE_F32, &diag),
			 FLOW_OK);
	assert_memory_equal(in, out, sizeof in);
	assert_int_equal(flow_broadcast(worldutil_comm, in, 5, FLOW_DTYPE_F32, 0, &diag),
			 FLOW_OK);
	assert_int_equal(flow_barrier(worldutil_comm, &diag), FLOW_OK);
	/* In place, and zero elements. */
	assert_int_equal(flow_all_reduce(worldutil_comm, in, in, 5, FLOW_DTYPE_F32, &diag),
			 FLOW_OK);
	assert_int_equal(flow_all_reduce(worldutil_comm, NULL, NULL, 0, FLOW_DTYPE_F32,
					 &diag),
			 FLOW_OK);
	/* A group of two, summed one after the other off NCCL. */
	void *bufs[2] = { in, in + 3 };
	size_t group_counts[2] = { 3, 2 };
	assert_int_equal(flow_all_reduce_group(worldutil_comm, bufs,
					       group_counts, 2, FLOW_DTYPE_F32,
					       &diag),
			 FLOW_OK);
	assert_memory_equal(in, out, sizeof in);
	/* Every collective counts, point to point does not. */
	assert_int_equal(flow_comm_seq(worldutil_comm), seq + 10);
}

static void test_comm_bad_arguments_are_usage_errors(void **state)
{
	float x = 1;
	uint16_t h = 1;
	flow_diag_t diag = FLOW_DIAG_INIT;
	(void)state;
	assert_int_equal(flow_broadcast(worldutil_comm, &x, 1, FLOW_DTYPE_F32, 1, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg,
			    "root 1 is not a rank of a 1-rank communicator");
	flow_diag_clear(&diag);
	assert_int_equal(flow_all_reduce(worldutil_comm, &h, &h, 1, FLOW_DTYPE_U16, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "cannot sum dtype 'u16'");
	flow_diag_clear(&diag);
	assert_int_equal(flow_send(worldutil_comm, &x, 1, FLOW_DTYPE_F32, 0, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "rank 0 cannot send to itself");
	flow_diag_clear(&diag);
	assert_int_equal(flow_all_reduce(worldutil_comm, &x, &x, SIZE_MAX / 2,
					 FLOW_DTYPE_F32, &diag),
			 FLOW_ERR_RANGE);
	void *bufs[2] = { &x, &x };
	size_t counts[2] = { 1, SIZE_MAX };
	assert_int_equal(flow_all_reduce_group(worldutil_comm, bufs, counts, 2,
					       FLOW_DTYPE_F32, &diag),
			 FLOW_ERR_RANGE);
	flow_diag_clear(&diag);
	assert_int_equal(flow_all_reduce_group(worldutil_comm, bufs, counts, 1,
					       FLOW_DTYPE_U16, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "cannot sum dtype 'u16'");
	assert_false(flow_comm_can_reduce(FLOW_COMM_CPU, FLOW_DTYPE_U16));
	assert_true(flow_comm_can_reduce(FLOW_COMM_CPU, FLOW_DTYPE_BF16));
}

static void test_comm_split_and_mesh_axes_on_one_rank(void **state)
{
	flow_comm_t *child = NULL;
	flow_mesh_t mesh;
	flow_diag_t diag = FLOW_DIAG_INIT;
	(void)state;
	assert_int_equal(flow_comm_split(worldutil_comm, 3, 0, &child, &diag), FLOW_OK);
	assert_int_equal(flow_comm_size(child), 1);
	assert_int_equal(flow_comm_world_rank(child, 0), 0);
	flow_comm_free(child);
	assert_int_equal(flow_comm_split(worldutil_comm, -1, 0, &child, &diag),
			 FLOW_ERR_USAGE);
	assert_null(child);
	flow_diag_clear(&diag);
	assert_int_equal(flow_mesh_parse("1x1:dp,tp", &mesh, &diag), FLOW_OK);
	assert_int_equal(flow_comm_mesh_axes(worldutil_comm, &mesh, 1u, &child, &diag),
			 FLOW_OK);
	assert_int_equal(flow_comm_size(child), 1);
	flow_comm_free(child);
	assert_int_equal(flow_mesh_parse("2x2", &mesh, &diag), FLOW_OK);
	assert_int_equal(flow_comm_mesh_axes(worldutil_comm, &mesh, 1u, &child, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg,
			    "mesh '2x2' does not cover exactly the 1 ranks of the communicator");
}

/* NCCL lives in the CUDA module: without a GPU (or without CUDA in the
 * build) asking for it is one line, and no communicator. */
static void test_comm_nccl_needs_a_gpu(void **state)
{
	flow_comm_t *c = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	(void)state;
	if (access("/dev/nvidia0", F_OK) == 0)
		skip(); /* a GPU: tests/gpu/run.sh covers NCCL there */
	assert_int_equal(flow_comm_world(worldutil_world, FLOW_COMM_NCCL, &c, &diag),
			 FLOW_ERR_NOTSUP);
	assert_null(c);
	assert_null(strchr(diag.msg, '\n'));
#ifdef HAVE_CUDA
	assert_non_null(strstr(diag.msg, "no usable CUDA driver or device: "));
#else
	assert_string_equal(diag.msg, "this build of flow has no CUDA support "
				      "(configure found no CUDA toolkit)");
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_comm_world_of_a_singleton_is_one_rank_of_self),
		cmocka_unit_test(test_comm_one_rank_collectives_copy),
		cmocka_unit_test(test_comm_bad_arguments_are_usage_errors),
		cmocka_unit_test(test_comm_split_and_mesh_axes_on_one_rank),
		cmocka_unit_test(test_comm_nccl_needs_a_gpu),
	};
	return cmocka_run_group_tests(tests, worldutil_setup,
				      worldutil_teardown);
}
