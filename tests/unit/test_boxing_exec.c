/* The distributed boxing executor (lib/runtime/boxing_exec.c) on a
 * one-rank world: a process started without a launcher is a singleton,
 * and its world communicator carries every step a plan can have on a
 * one-rank mesh.  What flow_boxing_comms_new and flow_boxing_run refuse,
 * with their messages, and that every plan, from the planner or made by
 * hand with one step of each kind on each set of axes, leaves in the
 * destination exactly the bits the reference executor
 * (flow_boxing_simulate) gives, without touching the source or anything
 * past the destination.
 *
 * Many ranks, where the steps move data between them, run in
 * tests/cluster/boxing.bats (boxing_check, the same comparison on every
 * rank of 2 to 4 under flow's launcher, mpirun and TCP). */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <flow/boxing_exec.h>
#include <flow/comm.h>
#include <flow/exec.h>
#include <flow/kernels.h>
#include <flow/mem.h>
#include <flow/world.h>

#include "sbputil.h"
#include "worldutil.h"

/* Bytes after the destination piece the executor must leave alone. */
#define GUARD_BYTES 64
#define GUARD_BYTE 0xa5
/* nd-SBPs of a 3-D tensor on a 2-axis mesh: at most (3 + 2)^2. */
#define MAX_LAYOUTS 25

static flow_shape_t shape_of(int ndim, const int64_t *dims)
{
	flow_shape_t s;
	memset(&s, 0, sizeof(s));
	s.ndim = ndim;
	for (int i = 0; i < ndim; i++)
		s.dims[i] = dims[i];
	return s;
}

/* The nd-SBP with `on` on the mesh axes of mask and B on the others. */
static flow_nd_sbp_t layout(int ndim, unsigned mask, flow_sbp_t on)
{
	flow_nd_sbp_t x = { .ndim = ndim };
	for (int i = 0; i < ndim; i++)
		x.sbp[i] = mask >> i & 1 ? on : (flow_sbp_t){ FLOW_SBP_BROADCAST, 0 };
	return x;
}

static const flow_sbp_t B = { FLOW_SBP_BROADCAST, 0 };
static const flow_sbp_t P = { FLOW_SBP_PARTIAL, 0 };

static flow_sbp_t S(int k)
{
	return (flow_sbp_t){ FLOW_SBP_SPLIT, k };
}

/* One step of kind on mesh's axes of mask, from `from` on them to `to`. */
static flow_boxing_step_t step_of(flow_boxing_kind_t kind,
				  const flow_mesh_t *mesh, unsigned mask,
				  flow_sbp_t from, flow_sbp_t to)
{
	flow_boxing_step_t st;
	memset(&st, 0, sizeof(st));
	st.kind = kind;
	st.axes = kind == FLOW_BOXING_SEND_RECV ? 0 : mask;
	st.mesh = st.to_mesh = *mesh;
	st.from = layout(mesh->ndim, mask, from);
	st.to = layout(mesh->ndim, mask, to);
	return st;
}

/* A plan of the given steps, from the first one's layout to the last's. */
static flow_boxing_plan_t plan_of_steps(const flow_shape_t *shape,
					flow_dtype_t dtype,
					const flow_mesh_t *mesh,
					const flow_boxing_step_t *steps,
					size_t nsteps)
{
	flow_boxing_plan_t plan;
	memset(&plan, 0, sizeof(plan));
	plan.shape = *shape;
	plan.dtype = dtype;
	plan.src_mesh = plan.dst_mesh = *mesh;
	plan.src = steps[0].from;
	plan.dst = steps[nsteps - 1].to;
	plan.nsteps = nsteps;
	memcpy(plan.steps, steps, nsteps * sizeof(steps[0]));
	return plan;
}

static size_t piece_bytes(const flow_boxing_plan_t *plan,
			  const flow_nd_sbp_t *sbp)
{
	flow_box_t box;
	flow_nd_sbp_local_box(&plan->shape, sbp, &plan->src_mesh, 0, &box);
	return (size_t)flow_box_numel(&box) * flow_dtype_size(plan->dtype);
}

/* Integer-valued elements, different from each other, in plan->dtype. */
static void fill(void *buf, size_t bytes, flow_dtype_t dtype)
{
	size_t n = bytes / flow_dtype_size(dtype);
	for (size_t e = 0; e < n; e++) {
		if (dtype == FLOW_DTYPE_F32)
			((float *)buf)[e] = (float)(3 * (int)e - 40);
		else if (dtype == FLOW_DTYPE_I32)
			((int32_t *)buf)[e] = 7 * (int32_t)e - 1000;
		else
			((uint8_t *)buf)[e] = (uint8_t)(e * 13 + 1);
	}
}

/* Run plan on this rank and through the reference executor from the same
 * source piece; the destinations must be equal bit for bit.  Once on host
 * memory, once on the staged storage, where every scratch, zeroing and
 * copy goes through the storage and every move through the kernel set,
 * as on a GPU. */
static void assert_runs_as_simulated_on(const flow_boxing_plan_t *plan,
					const flow_exec_storage_t *storage)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_boxing_comms_t *comms = NULL;
	size_t src_bytes = piece_bytes(plan, &plan->src);
	size_t dst_bytes = piece_bytes(plan, &plan->dst);
	unsigned char *src = flow_alloc(src_bytes);
	unsigned char *src_copy = flow_alloc(src_bytes);
	unsigned char *dst = flow_alloc(dst_bytes + GUARD_BYTES);
	void *local[1] = { flow_alloc(src_bytes) };
	assert_non_null(src);
	assert_non_null(src_copy);
	assert_non_null(dst);
	assert_non_null(local[0]);
	fill(src, src_bytes, plan->dtype);
	memcpy(src_copy, src, src_bytes);
	memcpy(local[0], src, src_bytes);
	memset(dst, GUARD_BYTE, dst_bytes + GUARD_BYTES);

	if (flow_boxing_simulate(plan, local, 1, NULL, NULL, &diag) != FLOW_OK)
		fail_msg("simulate: %s", diag.msg);
	if (flow_boxing_comms_new(worldutil_comm, &plan->src_mesh,
				  storage ? &flow_cpu_kernels : NULL, storage,
				  &comms, &diag) != FLOW_OK ||
	    flow_boxing_run(plan, comms, src, dst, &diag) != FLOW_OK)
		fail_msg("run: %s", diag.msg);
	assert_memory_equal(dst, local[0], dst_bytes);
	assert_memory_equal(src, src_copy, src_bytes);
	for (size_t i = 0; i < GUARD_BYTES; i++)
		assert_int_equal(dst[dst_bytes + i], GUARD_BYTE);

	flow_boxing_comms_free(comms);
	flow_free(local[0]);
	flow_free(dst);
	flow_free(src_copy);
	flow_free(src);
}

static void assert_runs_as_simulated(const flow_boxing_plan_t *plan)
{
	assert_runs_as_simulated_on(plan, NULL);
	assert_runs_as_simulated_on(plan, &flow_exec_storage_staged);
}

/* ---- flow_boxing_comms_new and _axes ----------------------------------- */

/* flow_boxing_comms_new of mesh, which must refuse with err and message
 * and leave its output alone. */
static void assert_comms_new_refused(const flow_mesh_t *mesh, flow_err_t err,
				     const char *message)
{
	flow_boxing_comms_t *comms = (flow_boxing_comms_t *)&comms;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_boxing_comms_new(worldutil_comm, mesh, NULL, NULL,
					       &comms, &diag), err);
	assert_string_equal(diag.msg, message);
	assert_ptr_equal(comms, (flow_boxing_comms_t *)&comms);
}

static void test_boxing_exec_comms_new_refuses_a_mesh_of_another_size(void **state)
{
	flow_mesh_t mesh = mesh_of("2x2");
	(void)state;
	assert_comms_new_refused(&mesh, FLOW_ERR_USAGE,
				 "boxing: mesh '2x2' has 4 ranks, the communicator 1");
}

static void test_boxing_exec_comms_new_refuses_a_mesh_of_other_ranks(void **state)
{
	flow_mesh_t mesh = mesh_of("1@3");
	(void)state;
	assert_comms_new_refused(&mesh, FLOW_ERR_USAGE,
				 "boxing: mesh '1@3' does not cover world rank 0 of the communicator");
}

static void test_boxing_exec_comms_new_refuses_an_invalid_mesh(void **state)
{
	flow_diag_t want = FLOW_DIAG_INIT;
	flow_mesh_t mesh = mesh_of("1");
	(void)state;
	mesh.dims[0] = 0;
	/* The mesh's own check words it. */
	assert_int_equal(flow_mesh_check(&mesh, &want), FLOW_ERR_USAGE);
	assert_comms_new_refused(&mesh, FLOW_ERR_USAGE, want.msg);
}

/* A CPU communicator moves host memory only (host_memory, the staged
 * storage's too); device memory it cannot read. */
static void test_boxing_exec_comms_new_refuses_memory_the_communicator_cannot_move(void **state)
{
	flow_exec_storage_t device = flow_exec_storage_staged;
	char want[FLOW_DIAG_MAX];
	device.name = "device";
	device.host_memory = false;
	(void)state;
	snprintf(want, sizeof want,
		 "boxing: the '%s' communicator cannot move 'device' memory",
		 flow_comm_transport(worldutil_comm));
	flow_mesh_t mesh = mesh_of("1");
	flow_boxing_comms_t *comms = (flow_boxing_comms_t *)&comms;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_boxing_comms_new(worldutil_comm, &mesh,
					       &flow_cpu_kernels, &device,
					       &comms, &diag),
			 FLOW_ERR_NOTSUP);
	assert_string_equal(diag.msg, want);
	assert_ptr_equal(comms, (flow_boxing_comms_t *)&comms);
}

/* The storage and the kernel set of its device come together. */
static void test_boxing_exec_comms_new_refuses_a_storage_without_kernels(void **state)
{
	flow_mesh_t mesh = mesh_of("1");
	flow_boxing_comms_t *comms = (flow_boxing_comms_t *)&comms;
	flow_diag_t diag = FLOW_DIAG_INIT;
	(void)state;
	assert_int_equal(flow_boxing_comms_new(worldutil_comm, &mesh, NULL,
					       &flow_exec_storage_staged,
					       &comms, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg,
			    "boxing: a storage without its kernel set, or the other way round");
	assert_int_equal(flow_boxing_comms_new(worldutil_comm, &mesh,
					       &flow_cpu_kernels, NULL, &comms,
					       &diag),
			 FLOW_ERR_USAGE);
	assert_ptr_equal(comms, (flow_boxing_comms_t *)&comms);
}

/* An NCCL communicator moves a GPU's memory, not the host's. */
static void test_boxing_exec_comms_new_refuses_host_memory_over_nccl(void **state)
{
	flow_comm_t *nccl = NULL;
	flow_boxing_comms_t *comms = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_mesh_t mesh = mesh_of("1");
	(void)state;
	if (flow_comm_world(worldutil_world, FLOW_COMM_NCCL, &nccl, &diag) != FLOW_OK)
		skip(); /* no NCCL in this build, or no GPU */
	assert_int_equal(flow_boxing_comms_new(nccl, &mesh, NULL, NULL, &comms,
					       &diag),
			 FLOW_ERR_NOTSUP);
	assert_string_equal(diag.msg,
			    "boxing: the 'nccl' communicator cannot move 'host' memory");
	assert_null(comms);
	flow_comm_free(nccl);
}

static void test_boxing_exec_comms_axes_gives_one_communicator_per_group(void **state)
{
	flow_boxing_comms_t *comms = NULL;
	flow_comm_t *a = NULL, *b = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_mesh_t mesh = mesh_of("1x1:dp,tp");
	(void)state;
	assert_int_equal(flow_boxing_comms_new(worldutil_comm, &mesh, NULL, NULL,
					       &comms, &diag),
			 FLOW_OK);
	assert_int_equal(flow_boxing_comms_axes(comms, 3u, &a, &diag), FLOW_OK);
	assert_int_equal(flow_comm_size(a), 1);
	/* Made on first use, then the same one. */
	assert_int_equal(flow_boxing_comms_axes(comms, 3u, &b, &diag), FLOW_OK);
	assert_ptr_equal(a, b);
	assert_int_equal(flow_boxing_comms_axes(comms, 4u, &b, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg,
			    "boxing: axes 0x4 are not axes of mesh '1x1:dp,tp'");
	assert_ptr_equal(b, a);
	flow_boxing_comms_free(comms);
	flow_boxing_comms_free(NULL);
}

/* ---- flow_boxing_run's refusals ------------------------------------------ */

/* Run plan on mesh "1", which must refuse with err and message before
 * writing anything. */
static void assert_run_refused(const flow_boxing_plan_t *plan, flow_err_t err,
			       const char *message)
{
	flow_boxing_comms_t *comms = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_mesh_t mesh = mesh_of("1");
	float src[60] = { 1 }, dst[60];
	memset(dst, GUARD_BYTE, sizeof(dst));
	assert_int_equal(flow_boxing_comms_new(worldutil_comm, &mesh, NULL, NULL,
					       &comms, &diag),
			 FLOW_OK);
	assert_int_equal(flow_boxing_run(plan, comms, src, dst, &diag), err);
	assert_string_equal(diag.msg, message);
	for (size_t i = 0; i < sizeof(dst); i++)
		assert_int_equal(((unsigned char *)dst)[i], GUARD_BYTE);
	flow_boxing_comms_free(comms);
}

static flow_boxing_plan_t one_step_plan(flow_boxing_kind_t kind,
					flow_sbp_t from, flow_sbp_t to)
{
	static const int64_t dims[] = { 3, 4, 5 };
	flow_shape_t shape = shape_of(3, dims);
	flow_mesh_t mesh = mesh_of("1");
	flow_boxing_step_t st = step_of(kind, &mesh, 1u, from, to);
	return plan_of_steps(&shape, FLOW_DTYPE_F32, &mesh, &st, 1);
}

static void test_boxing_exec_run_refuses_a_plan_of_another_mesh(void **state)
{
	flow_boxing_plan_t plan = one_step_plan(FLOW_BOXING_ALL_GATHER, S(0), B);
	(void)state;
	plan.src_mesh = mesh_of("1x1");
	assert_run_refused(&plan, FLOW_ERR_USAGE,
			   "boxing: the plan's placements differ from the executor's mesh '1'");
	plan = one_step_plan(FLOW_BOXING_ALL_GATHER, S(0), B);
	plan.nsteps = 2;
	plan.steps[1] = plan.steps[0];
	plan.steps[1].to_mesh = mesh_of("1@1");
	assert_run_refused(&plan, FLOW_ERR_USAGE,
			   "boxing step 2: runs on another mesh than '1'");
}

static void test_boxing_exec_run_refuses_bad_steps(void **state)
{
	flow_boxing_plan_t plan = one_step_plan(FLOW_BOXING_ALL_GATHER, S(0), B);
	(void)state;
	plan.steps[0].axes = 0;
	assert_run_refused(&plan, FLOW_ERR_USAGE,
			   "boxing step 1: axes 0x0 are not axes of mesh '1'");
	plan.steps[0].axes = 2;
	assert_run_refused(&plan, FLOW_ERR_USAGE,
			   "boxing step 1: axes 0x2 are not axes of mesh '1'");
	plan = one_step_plan(FLOW_BOXING_ALL_GATHER, S(0), B);
	plan.steps[0].kind = (flow_boxing_kind_t)FLOW_BOXING_KIND_COUNT;
	assert_run_refused(&plan, FLOW_ERR_USAGE,
			   "boxing step 1: unknown kind 9");
	plan = one_step_plan(FLOW_BOXING_ALL_GATHER, S(0), B);
	plan.nsteps = FLOW_BOXING_MAX_STEPS + 1;
	assert_run_refused(&plan, FLOW_ERR_USAGE,
			   "boxing: plan has 17 steps, at most 16");
	plan = one_step_plan(FLOW_BOXING_ALL_GATHER, S(0), B);
	plan.dtype = (flow_dtype_t)99;
	assert_run_refused(&plan, FLOW_ERR_USAGE, "boxing: unknown dtype 99");
}

static void test_boxing_exec_run_refuses_a_broadcast_step(void **state)
{
	flow_boxing_plan_t plan = one_step_plan(FLOW_BOXING_BROADCAST, B, B);
	(void)state;
	assert_run_refused(&plan, FLOW_ERR_NOTSUP,
			   "boxing step 1: the distributed executor does not run 'broadcast' steps");
}

static void test_boxing_exec_run_refuses_a_sum_of_a_dtype_it_cannot_add(void **state)
{
	flow_boxing_plan_t plan = one_step_plan(FLOW_BOXING_ALL_REDUCE, P, B);
	(void)state;
	plan.dtype = FLOW_DTYPE_U16;
	assert_run_refused(&plan, FLOW_ERR_USAGE,
			   "boxing step 1: cannot sum dtype 'u16' in 'all-reduce'");
	plan = one_step_plan(FLOW_BOXING_REDUCE_SCATTER, P, S(2));
	plan.dtype = FLOW_DTYPE_U16;
	assert_run_refused(&plan, FLOW_ERR_USAGE,
			   "boxing step 1: cannot sum dtype 'u16' in 'reduce-scatter'");
}

static void test_boxing_exec_run_refuses_overlapping_pieces(void **state)
{
	flow_boxing_plan_t plan = one_step_plan(FLOW_BOXING_ALL_GATHER, S(0), B);
	flow_boxing_comms_t *comms = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	float buf[61] = { 0 };
	(void)state;
	assert_int_equal(flow_boxing_comms_new(worldutil_comm, &plan.src_mesh,
					       NULL, NULL, &comms, &diag),
			 FLOW_OK);
	assert_int_equal(flow_boxing_run(&plan, comms, buf, buf + 1, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg,
			    "boxing: source and destination pieces overlap");
	flow_boxing_comms_free(comms);
}

/* ---- device memory: moves, then a wait, then the collective --------------- */

/* A kernel set that logs, in order, each box move ('m') and each wait for
 * the kernels ('w'), and fails its wait when told, as a GPU's set reports
 * a failed kernel. */
static char spy_log[64];
static size_t spy_n;
static bool spy_fail;

static void spy_move(flow_dtype_t dtype, const void *src,
		     const flow_box_t *src_box, void *dst,
		     const flow_box_t *dst_box, const flow_box_t *region,
		     bool add)
{
	if (spy_n + 1 < sizeof spy_log)
		spy_log[spy_n++] = 'm';
	flow_boxing_move_region(dtype, src, src_box, dst, dst_box, region, add);
}

static flow_err_t spy_last(flow_diag_t *diag)
{
	if (spy_n + 1 < sizeof spy_log)
		spy_log[spy_n++] = 'w';
	return spy_fail ? flow_diag_set(diag, FLOW_ERR_DEVICE,
					"a kernel failed") :
			  FLOW_OK;
}

/* Run plan on the staged storage with the spying set: its log, and the
 * run's error. */
static flow_err_t spy_run(const flow_boxing_plan_t *plan, bool fail,
			  flow_diag_t *diag)
{
	flow_kernels_t spy = flow_cpu_kernels;
	flow_boxing_comms_t *comms = NULL;
	float src[60] = { 0 }, dst[60];
	spy.box_move = spy_move;
	spy.last = spy_last;
	memset(spy_log, 0, sizeof spy_log);
	spy_n = 0;
	spy_fail = fail;
	assert_int_equal(flow_boxing_comms_new(worldutil_comm, &plan->src_mesh,
					       &spy, &flow_exec_storage_staged,
					       &comms, diag),
			 FLOW_OK);
	flow_err_t err = flow_boxing_run(plan, comms, src, dst, diag);
	flow_boxing_comms_free(comms);
	return err;
}

/* A collective runs on a stream of its own on a GPU: the kernels that
 * wrote its input (the slice before it) are waited for first; a step
 * without a collective waits for nothing. */
static void test_boxing_exec_waits_for_the_kernels_before_each_collective(void **state)
{
	static const int64_t dims[] = { 3, 4, 5 };
	flow_shape_t shape = shape_of(3, dims);
	flow_mesh_t mesh = mesh_of("1");
	flow_diag_t diag = FLOW_DIAG_INIT;
	const flow_boxing_step_t steps[] = {
		step_of(FLOW_BOXING_SLICE, &mesh, 1u, B, S(1)),
		step_of(FLOW_BOXING_ALL_GATHER, &mesh, 1u, S(1), B),
		step_of(FLOW_BOXING_ALL_REDUCE, &mesh, 1u, P, B),
	};
	(void)state;
	flow_boxing_plan_t plan = plan_of_steps(&shape, FLOW_DTYPE_F32, &mesh,
						steps, 1);
	assert_int_equal(spy_run(&plan, false, &diag), FLOW_OK);
	assert_string_equal(spy_log, "m");
	plan = plan_of_steps(&shape, FLOW_DTYPE_F32, &mesh, steps, 2);
	assert_int_equal(spy_run(&plan, false, &diag), FLOW_OK);
	assert_string_equal(spy_log, "mw");
	plan = plan_of_steps(&shape, FLOW_DTYPE_F32, &mesh, &steps[2], 1);
	assert_int_equal(spy_run(&plan, false, &diag), FLOW_OK);
	assert_string_equal(spy_log, "w");
}

/* A failed kernel, reported by the wait, stops the plan before its
 * collective, with the kernel's line. */
static void test_boxing_exec_a_failed_kernel_stops_the_plan(void **state)
{
	static const int64_t dims[] = { 3, 4, 5 };
	flow_shape_t shape = shape_of(3, dims);
	flow_mesh_t mesh = mesh_of("1");
	flow_diag_t diag = FLOW_DIAG_INIT;
	const flow_boxing_step_t steps[] = {
		step_of(FLOW_BOXING_ALL_REDUCE, &mesh, 1u, P, B),
		step_of(FLOW_BOXING_SLICE, &mesh, 1u, B, S(1)),
	};
	(void)state;
	flow_boxing_plan_t plan = plan_of_steps(&shape, FLOW_DTYPE_F32, &mesh,
						steps, 2);
	assert_int_equal(spy_run(&plan, true, &diag), FLOW_ERR_DEVICE);
	assert_string_equal(diag.msg, "a kernel failed");
	assert_string_equal(spy_log, "w"); /* the slice never ran */
}

/* ---- plans run as the reference executor runs them ------------------------ */

static const flow_dtype_t dtypes[] = { FLOW_DTYPE_F32, FLOW_DTYPE_I32 };

/* The planner's plans between every pair of valid layouts (on one rank
 * all of them are copies: size-1 axes are B). */
static void test_boxing_exec_planner_plans_run_as_simulated(void **state)
{
	static const char *const meshes[] = { "1", "1x1" };
	static const int64_t dims[] = { 3, 1, 5 };
	flow_shape_t shape = shape_of(3, dims);
	(void)state;
	for (size_t m = 0; m < sizeof(meshes) / sizeof(meshes[0]); m++) {
		flow_mesh_t mesh = mesh_of(meshes[m]);
		flow_nd_sbp_t all[MAX_LAYOUTS];
		size_t n = all_layouts(&shape, &mesh, all, MAX_LAYOUTS);
		assert_true(n > 0);
		for (size_t i = 0; i < n; i++)
			for (size_t j = 0; j < n; j++)
				for (size_t d = 0; d < 2; d++) {
					flow_boxing_plan_t plan;
					flow_diag_t diag = FLOW_DIAG_INIT;
					if (flow_boxing_plan(&shape, dtypes[d], &mesh,
							     &all[i], &mesh, &all[j],
							     NULL, &plan, &diag) != FLOW_OK)
						fail_msg("%s", diag.msg);
					assert_runs_as_simulated(&plan);
				}
	}
}

/* Each kind of step on each set of axes of 1-, 2- and 3-axis meshes. */
static void test_boxing_exec_every_kind_of_step_runs_as_simulated(void **state)
{
	static const char *const meshes[] = { "1", "1x1", "1x1x1" };
	static const int64_t dims[] = { 3, 4, 5 };
	flow_shape_t shape = shape_of(3, dims);
	(void)state;
	for (size_t m = 0; m < sizeof(meshes) / sizeof(meshes[0]); m++) {
		flow_mesh_t mesh = mesh_of(meshes[m]);
		for (unsigned mask = 1; mask < 1u << mesh.ndim; mask++) {
			const flow_boxing_step_t steps[] = {
				step_of(FLOW_BOXING_ALL_REDUCE, &mesh, mask, P, B),
				step_of(FLOW_BOXING_REDUCE_SCATTER, &mesh, mask, P, S(1)),
				step_of(FLOW_BOXING_ALL_GATHER, &mesh, mask, S(2), B),
				step_of(FLOW_BOXING_ALL_TO_ALL, &mesh, mask, S(0), S(2)),
				step_of(FLOW_BOXING_SLICE, &mesh, mask, B, S(1)),
				step_of(FLOW_BOXING_ZERO_FILL, &mesh, mask, B, P),
				step_of(FLOW_BOXING_PAD_ZERO, &mesh, mask, S(0), P),
				step_of(FLOW_BOXING_SEND_RECV, &mesh, mask, S(1), S(2)),
				step_of(FLOW_BOXING_SEND_RECV, &mesh, mask, P, B),
			};
			for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++)
				for (size_t d = 0; d < 2; d++) {
					flow_boxing_plan_t plan = plan_of_steps(
						&shape, dtypes[d], &mesh, &steps[k], 1);
					assert_runs_as_simulated(&plan);
				}
		}
	}
}

/* Steps chained, so the pieces between them go through the executor's
 * scratch buffers; u8 for a dtype no step sums. */
static void test_boxing_exec_a_plan_of_many_steps_runs_as_simulated(void **state)
{
	static const int64_t dims[] = { 2, 3, 7 };
	flow_shape_t shape = shape_of(3, dims);
	flow_mesh_t mesh = mesh_of("1x1");
	const flow_boxing_step_t summing[] = {
		step_of(FLOW_BOXING_SLICE, &mesh, 1u, B, S(1)),
		step_of(FLOW_BOXING_ALL_TO_ALL, &mesh, 1u, S(1), S(2)),
		step_of(FLOW_BOXING_ALL_GATHER, &mesh, 1u, S(2), B),
		step_of(FLOW_BOXING_ZERO_FILL, &mesh, 3u, B, P),
		step_of(FLOW_BOXING_REDUCE_SCATTER, &mesh, 3u, P, S(0)),
		step_of(FLOW_BOXING_PAD_ZERO, &mesh, 3u, S(0), P),
		step_of(FLOW_BOXING_ALL_REDUCE, &mesh, 3u, P, B),
	};
	const flow_boxing_step_t moving[] = {
		step_of(FLOW_BOXING_SLICE, &mesh, 2u, B, S(2)),
		step_of(FLOW_BOXING_SEND_RECV, &mesh, 2u, S(2), S(0)),
		step_of(FLOW_BOXING_ALL_GATHER, &mesh, 2u, S(0), B),
	};
	(void)state;
	size_t n = sizeof(summing) / sizeof(summing[0]);
	for (size_t d = 0; d < 2; d++) {
		flow_boxing_plan_t plan = plan_of_steps(&shape, dtypes[d], &mesh,
							summing, n);
		assert_runs_as_simulated(&plan);
	}
	flow_boxing_plan_t plan = plan_of_steps(&shape, FLOW_DTYPE_U8, &mesh,
						moving, 3);
	assert_runs_as_simulated(&plan);
}

static void test_boxing_exec_an_empty_plan_copies(void **state)
{
	static const int64_t dims[] = { 4, 6 };
	flow_shape_t shape = shape_of(2, dims);
	flow_mesh_t mesh = mesh_of("1");
	flow_boxing_step_t st = step_of(FLOW_BOXING_SLICE, &mesh, 1u, B, B);
	(void)state;
	flow_boxing_plan_t plan = plan_of_steps(&shape, FLOW_DTYPE_F32, &mesh,
						&st, 1);
	plan.nsteps = 0;
	assert_runs_as_simulated(&plan);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_boxing_exec_comms_new_refuses_a_mesh_of_another_size),
		cmocka_unit_test(test_boxing_exec_comms_new_refuses_a_mesh_of_other_ranks),
		cmocka_unit_test(test_boxing_exec_comms_new_refuses_an_invalid_mesh),
		cmocka_unit_test(test_boxing_exec_comms_new_refuses_memory_the_communicator_cannot_move),
		cmocka_unit_test(test_boxing_exec_comms_new_refuses_a_storage_without_kernels),
		cmocka_unit_test(test_boxing_exec_comms_new_refuses_host_memory_over_nccl),
		cmocka_unit_test(test_boxing_exec_waits_for_the_kernels_before_each_collective),
		cmocka_unit_test(test_boxing_exec_a_failed_kernel_stops_the_plan),
		cmocka_unit_test(test_boxing_exec_comms_axes_gives_one_communicator_per_group),
		cmocka_unit_test(test_boxing_exec_run_refuses_a_plan_of_another_mesh),
		cmocka_unit_test(test_boxing_exec_run_refuses_bad_steps),
		cmocka_unit_test(test_boxing_exec_run_refuses_a_broadcast_step),
		cmocka_unit_test(test_boxing_exec_run_refuses_a_sum_of_a_dtype_it_cannot_add),
		cmocka_unit_test(test_boxing_exec_run_refuses_overlapping_pieces),
		cmocka_unit_test(test_boxing_exec_planner_plans_run_as_simulated),
		cmocka_unit_test(test_boxing_exec_every_kind_of_step_runs_as_simulated),
		cmocka_unit_test(test_boxing_exec_a_plan_of_many_steps_runs_as_simulated),
		cmocka_unit_test(test_boxing_exec_an_empty_plan_copies),
	};
	return cmocka_run_group_tests(tests, worldutil_setup,
				      worldutil_teardown);
}
