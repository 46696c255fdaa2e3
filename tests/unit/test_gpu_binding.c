/* Which CUDA device a rank takes (lib/device/gpu_binding.c): every rule of
 * flow/gpu_binding.h with its exact ordinal, description and message, the
 * names CUDA_VISIBLE_DEVICES gives a device, the environment reader, and
 * the rule over every node shape up to 16 ranks and 8 devices.  No GPU is
 * needed: the device count is an input.  The refusal of a GPU-less node by
 * flow-train under Slurm is tests/cluster/gpu_sbatch.bats. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/gpu_binding.h>

/* rank 0 of 1 on node gpu07 with one device and no environment. */
static flow_gpu_binding_input_t input(int rank, int local_rank, int local_size,
				      int visible)
{
	flow_gpu_binding_input_t in = {
		.rank = rank,
		.local_rank = local_rank,
		.local_size = local_size,
		.visible_count = visible,
		.node = "gpu07",
	};
	return in;
}

/* Pick, expecting success; returns the binding. */
static flow_gpu_binding_t pick_ok(const flow_gpu_binding_input_t *in)
{
	flow_gpu_binding_t b;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_gpu_binding_pick(in, &b, &diag);
	if (err != FLOW_OK)
		fail_msg("unexpected %s: %s", flow_err_name(err), diag.msg);
	return b;
}

/* Pick, expecting err with exactly message msg, and *out untouched. */
static void pick_fails(const flow_gpu_binding_input_t *in, flow_err_t err,
		       const char *msg)
{
	flow_gpu_binding_t b, before;
	memset(&b, 0x5a, sizeof b);
	before = b;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_gpu_binding_pick(in, &b, &diag), err);
	assert_int_equal(diag.err, err);
	assert_string_equal(diag.msg, msg);
	assert_null(strchr(diag.msg, '\n'));
	assert_memory_equal(&b, &before, sizeof b);
}

/* ---- rule 4: one device per local rank ----------------------------------------- */

static void test_gpu_binding_local_rank_takes_its_own_device(void **state)
{
	(void)state;
	flow_gpu_binding_input_t in = input(3, 1, 8, 8);
	flow_gpu_binding_t b = pick_ok(&in);
	assert_int_equal(b.device, 1);
	assert_int_equal(b.how, FLOW_GPU_BINDING_LOCAL_RANK);
	assert_string_equal(b.desc, "rank 3: cuda:1 (local rank 1 of 8)");

	/* A single rank on a one-device node is rule 4 too, whatever the
	 * environment says. */
	in = input(0, 0, 1, 1);
	in.slurm_step_gpus = "0";
	b = pick_ok(&in);
	assert_int_equal(b.device, 0);
	assert_int_equal(b.how, FLOW_GPU_BINDING_LOCAL_RANK);
	assert_string_equal(b.desc, "rank 0: cuda:0 (local rank 0 of 1)");

	/* Fewer ranks than devices: the first ones are used. */
	in = input(9, 1, 2, 8);
	b = pick_ok(&in);
	assert_int_equal(b.device, 1);
}

/* ---- the names CUDA_VISIBLE_DEVICES gives ------------------------------------------ */

static void test_gpu_binding_names_the_physical_device(void **state)
{
	(void)state;
	flow_gpu_binding_input_t in = input(3, 1, 2, 2);
	in.cuda_visible_devices = "2,3";
	flow_gpu_binding_t b = pick_ok(&in);
	assert_int_equal(b.device, 1);
	assert_string_equal(b.desc,
			    "rank 3: cuda:1 (local rank 1 of 2); device 1 of CUDA_VISIBLE_DEVICES=2,3 (physical 3)");

	/* Blanks around an entry are not part of its name. */
	in.cuda_visible_devices = "4, 6";
	b = pick_ok(&in);
	assert_string_equal(b.desc,
			    "rank 3: cuda:1 (local rank 1 of 2); device 1 of CUDA_VISIBLE_DEVICES=4, 6 (physical 6)");
}

static void test_gpu_binding_names_uuid_and_mig_entries_as_written(void **state)
{
	(void)state;
	flow_gpu_binding_input_t in = input(0, 0, 2, 2);
	in.cuda_visible_devices = "GPU-8f2c1d4e,GPU-0b3a77e1";
	flow_gpu_binding_t b = pick_ok(&in);
	assert_string_equal(b.desc,
			    "rank 0: cuda:0 (local rank 0 of 2); device 0 of CUDA_VISIBLE_DEVICES=GPU-8f2c1d4e,GPU-0b3a77e1 (GPU-8f2c1d4e)");

	in = input(1, 1, 2, 2);
	in.cuda_visible_devices = "MIG-5c6a0f2b-1d7e-5a3c-9e1f-2b4d6f8a0c1e,MIG-11111111-2222-3333-4444-555555555555";
	b = pick_ok(&in);
	assert_string_equal(b.desc,
			    "rank 1: cuda:1 (local rank 1 of 2); device 1 of CUDA_VISIBLE_DEVICES=MIG-5c6a0f2b-1d7e-5a3c-9e1f-2b4d6f8a0c1e,MIG-11111111-2222-3333-4444-555555555555 (MIG-11111111-2222-3333-4444-555555555555)");
}

static void test_gpu_binding_counts_a_long_device_list(void **state)
{
	(void)state;
	/* Eight full GPU UUIDs (40 characters each) are too long to copy. */
	char list[8 * 41];
	size_t at = 0;
	for (int i = 0; i < 8; i++)
		at += (size_t)snprintf(list + at, sizeof list - at,
				       "%sGPU-%08d-aaaa-bbbb-cccc-dddddddddddd",
				       i ? "," : "", i);
	assert_true(strlen(list) > 160);
	flow_gpu_binding_input_t in = input(5, 5, 8, 8);
	in.cuda_visible_devices = list;
	flow_gpu_binding_t b = pick_ok(&in);
	assert_int_equal(b.device, 5);
	assert_string_equal(b.desc,
			    "rank 5: cuda:5 (local rank 5 of 8); device 5 of the 8 entries of CUDA_VISIBLE_DEVICES (GPU-00000005-aaaa-bbbb-cccc-dddddddddddd)");
}

static void test_gpu_binding_leaves_out_an_entry_the_list_lacks(void **state)
{
	(void)state;
	/* CUDA counted more devices than the variable lists (it was changed
	 * after CUDA read it): the list is shown, no entry is guessed. */
	flow_gpu_binding_input_t in = input(2, 2, 3, 3);
	in.cuda_visible_devices = "0,1";
	flow_gpu_binding_t b = pick_ok(&in);
	assert_string_equal(b.desc,
			    "rank 2: cuda:2 (local rank 2 of 3); device 2 of CUDA_VISIBLE_DEVICES=0,1");
	in.cuda_visible_devices = "0,1,";
	b = pick_ok(&in);
	assert_string_equal(b.desc,
			    "rank 2: cuda:2 (local rank 2 of 3); device 2 of CUDA_VISIBLE_DEVICES=0,1,");
}

/* ---- rule 3: bound by Slurm ------------------------------------------------------- */

static void test_gpu_binding_slurm_per_task_binding_takes_ordinal_0(void **state)
{
	(void)state;
	/* srun --gpus-per-task=1: local rank 3 sees only physical GPU 3. */
	flow_gpu_binding_input_t in = input(11, 3, 8, 1);
	in.cuda_visible_devices = "3";
	in.slurm_step_gpus = "3";
	flow_gpu_binding_t b = pick_ok(&in);
	assert_int_equal(b.device, 0);
	assert_int_equal(b.how, FLOW_GPU_BINDING_SLURM);
	assert_string_equal(b.desc,
			    "rank 11: cuda:0 (local rank 3 of 8, bound by Slurm); device 0 of CUDA_VISIBLE_DEVICES=3 (physical 3)");

	/* Any one of the three variables is enough. */
	const char *names[] = { "SLURM_STEP_GPUS", "SLURM_JOB_GPUS",
				"CUDA_VISIBLE_DEVICES" };
	for (int v = 0; v < 3; v++) {
		in = input(11, 3, 8, 1);
		if (v == 0)
			in.slurm_step_gpus = "3";
		else if (v == 1)
			in.slurm_job_gpus = "0,1,2,3,4,5,6,7";
		else
			in.cuda_visible_devices = "GPU-8f2c1d4e";
		b = pick_ok(&in);
		if (b.device != 0 || b.how != FLOW_GPU_BINDING_SLURM)
			fail_msg("%s alone: cuda:%d, how %d", names[v],
				 b.device, (int)b.how);
	}
	in.cuda_visible_devices = "GPU-8f2c1d4e";
	b = pick_ok(&in);
	assert_string_equal(b.desc,
			    "rank 11: cuda:0 (local rank 3 of 8, bound by Slurm); device 0 of CUDA_VISIBLE_DEVICES=GPU-8f2c1d4e (GPU-8f2c1d4e)");

	/* With shared_ok the answer is the same: Slurm's binding. */
	in.shared_ok = true;
	b = pick_ok(&in);
	assert_int_equal(b.how, FLOW_GPU_BINDING_SLURM);
}

static void test_gpu_binding_empty_slurm_variables_are_unset(void **state)
{
	(void)state;
	/* One device, two ranks, nothing from Slurm: they would share it. */
	flow_gpu_binding_input_t in = input(1, 1, 2, 1);
	in.slurm_step_gpus = "";
	in.slurm_job_gpus = "";
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 1 (local rank 1 of 2): only 1 CUDA device is visible on node gpu07; two ranks would share a GPU (pass --comm cpu to allow it, or launch at most 1 rank per node)");
}

/* ---- rule 6 and rule 5: more ranks than devices ------------------------------------- */

static void test_gpu_binding_refuses_two_ranks_on_one_gpu(void **state)
{
	(void)state;
	flow_gpu_binding_input_t in = input(5, 5, 8, 4);
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 5 (local rank 5 of 8): only 4 CUDA devices are visible on node gpu07; two ranks would share a GPU (pass --comm cpu to allow it, or launch at most 4 ranks per node)");
	/* Every rank of the node refuses, the first ones too. */
	in = input(8, 0, 8, 4);
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 8 (local rank 0 of 8): only 4 CUDA devices are visible on node gpu07; two ranks would share a GPU (pass --comm cpu to allow it, or launch at most 4 ranks per node)");
	/* The variable that hid the other devices is shown. */
	in = input(5, 5, 8, 4);
	in.node = "node02";
	in.cuda_visible_devices = "0,1,2,3";
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 5 (local rank 5 of 8): only 4 CUDA devices are visible on node node02 (CUDA_VISIBLE_DEVICES=0,1,2,3); two ranks would share a GPU (pass --comm cpu to allow it, or launch at most 4 ranks per node)");
}

static void test_gpu_binding_shared_ok_spreads_ranks_over_devices(void **state)
{
	(void)state;
	flow_gpu_binding_input_t in = input(5, 5, 8, 4);
	in.shared_ok = true;
	flow_gpu_binding_t b = pick_ok(&in);
	assert_int_equal(b.device, 1);
	assert_int_equal(b.how, FLOW_GPU_BINDING_SHARED);
	assert_string_equal(b.desc,
			    "rank 5: cuda:1 (local rank 5 of 8, 8 ranks share 4 devices)");

	in = input(1, 1, 2, 1);
	in.shared_ok = true;
	b = pick_ok(&in);
	assert_int_equal(b.device, 0);
	assert_string_equal(b.desc,
			    "rank 1: cuda:0 (local rank 1 of 2, 2 ranks share 1 device)");

	/* Enough devices: shared_ok changes nothing. */
	in = input(3, 3, 4, 4);
	in.shared_ok = true;
	b = pick_ok(&in);
	assert_int_equal(b.device, 3);
	assert_int_equal(b.how, FLOW_GPU_BINDING_LOCAL_RANK);
}

/* ---- rule 1: no device ----------------------------------------------------------- */

static void test_gpu_binding_refuses_a_node_without_devices(void **state)
{
	(void)state;
	flow_gpu_binding_input_t in = input(0, 0, 1, 0);
	pick_fails(&in, FLOW_ERR_DEVICE,
		   "rank 0 (local rank 0 of 1): no CUDA device is visible on node gpu07");
	in.cuda_visible_devices = "";
	pick_fails(&in, FLOW_ERR_DEVICE,
		   "rank 0 (local rank 0 of 1): no CUDA device is visible on node gpu07 (CUDA_VISIBLE_DEVICES is empty)");
	/* Slurm's word for a step that asked for no GPU. */
	in = input(4, 1, 2, 0);
	in.cuda_visible_devices = "NoDevFiles";
	in.shared_ok = true;
	in.cuda_device = "0";
	pick_fails(&in, FLOW_ERR_DEVICE,
		   "rank 4 (local rank 1 of 2): no CUDA device is visible on node gpu07 (CUDA_VISIBLE_DEVICES=NoDevFiles)");
}

/* ---- rule 2: FLOW_CUDA_DEVICE ------------------------------------------------------ */

static void test_gpu_binding_flow_cuda_device_overrides(void **state)
{
	(void)state;
	flow_gpu_binding_input_t in = input(0, 0, 1, 4);
	in.cuda_device = "2";
	in.cuda_visible_devices = "4,5,6,7";
	flow_gpu_binding_t b = pick_ok(&in);
	assert_int_equal(b.device, 2);
	assert_int_equal(b.how, FLOW_GPU_BINDING_OVERRIDE);
	assert_string_equal(b.desc,
			    "rank 0: cuda:2 (local rank 0 of 1, FLOW_CUDA_DEVICE=2); device 2 of CUDA_VISIBLE_DEVICES=4,5,6,7 (physical 6)");

	/* It wins over Slurm's binding and over the sharing refusal: it is
	 * taken as given. */
	in = input(11, 3, 8, 1);
	in.slurm_step_gpus = "3";
	in.cuda_device = "0";
	b = pick_ok(&in);
	assert_int_equal(b.how, FLOW_GPU_BINDING_OVERRIDE);
	assert_int_equal(b.device, 0);
	in = input(5, 5, 8, 4);
	in.cuda_device = "3";
	b = pick_ok(&in);
	assert_int_equal(b.device, 3);
	assert_string_equal(b.desc,
			    "rank 5: cuda:3 (local rank 5 of 8, FLOW_CUDA_DEVICE=3)");

	/* Leading zeros are the same ordinal; empty is unset. */
	in = input(0, 0, 1, 4);
	in.cuda_device = "03";
	b = pick_ok(&in);
	assert_int_equal(b.device, 3);
	assert_string_equal(b.desc,
			    "rank 0: cuda:3 (local rank 0 of 1, FLOW_CUDA_DEVICE=3)");
	in.cuda_device = "";
	b = pick_ok(&in);
	assert_int_equal(b.how, FLOW_GPU_BINDING_LOCAL_RANK);
	assert_int_equal(b.device, 0);
}

static void test_gpu_binding_refuses_an_out_of_range_flow_cuda_device(void **state)
{
	(void)state;
	flow_gpu_binding_input_t in = input(3, 1, 2, 4);
	in.cuda_device = "4";
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 3 (local rank 1 of 2): FLOW_CUDA_DEVICE=4 is out of range: only 4 CUDA devices are visible on node gpu07");
	in.cuda_device = "99999999999999999999";
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 3 (local rank 1 of 2): FLOW_CUDA_DEVICE=99999999999999999999 is out of range: only 4 CUDA devices are visible on node gpu07");
	in = input(0, 0, 1, 1);
	in.cuda_device = "1";
	in.cuda_visible_devices = "GPU-8f2c1d4e";
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 0 (local rank 0 of 1): FLOW_CUDA_DEVICE=1 is out of range: only 1 CUDA device is visible on node gpu07 (CUDA_VISIBLE_DEVICES=GPU-8f2c1d4e)");
}

static void test_gpu_binding_refuses_a_malformed_flow_cuda_device(void **state)
{
	(void)state;
	const char *bad[] = { "cuda:1", "1x", " 1", "1 ", "-1", "0x1", "1.0" };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		flow_gpu_binding_input_t in = input(3, 1, 2, 4);
		in.cuda_device = bad[i];
		char want[256];
		snprintf(want, sizeof want,
			 "rank 3 (local rank 1 of 2): invalid FLOW_CUDA_DEVICE '%s': expected a device ordinal from 0 to 3",
			 bad[i]);
		pick_fails(&in, FLOW_ERR_USAGE, want);
	}
	flow_gpu_binding_input_t in = input(0, 0, 1, 1);
	in.cuda_device = "gpu0";
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 0 (local rank 0 of 1): invalid FLOW_CUDA_DEVICE 'gpu0': expected 0, the ordinal of the one CUDA device visible on node gpu07");
}

/* ---- inputs and the environment ------------------------------------------------------ */

static void test_gpu_binding_refuses_inputs_out_of_range(void **state)
{
	(void)state;
	flow_gpu_binding_input_t in = input(0, 0, 0, 4);
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 0: invalid GPU binding input (local rank 0 of 0, visible_count 4, node gpu07)");
	in = input(8, 8, 8, 8);
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 8: invalid GPU binding input (local rank 8 of 8, visible_count 8, node gpu07)");
	in = input(1, -1, 2, 2);
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 1: invalid GPU binding input (local rank -1 of 2, visible_count 2, node gpu07)");
	in = input(0, 0, 1, -1);
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 0: invalid GPU binding input (local rank 0 of 1, visible_count -1, node gpu07)");
	in = input(0, 0, 1, 1);
	in.node = NULL;
	pick_fails(&in, FLOW_ERR_USAGE,
		   "rank 0: invalid GPU binding input (local rank 0 of 1, visible_count 1, node unnamed)");
}

static void test_gpu_binding_input_from_env_reads_four_variables(void **state)
{
	(void)state;
	assert_int_equal(setenv("CUDA_VISIBLE_DEVICES", "2,3", 1), 0);
	assert_int_equal(setenv("SLURM_STEP_GPUS", "2", 1), 0);
	assert_int_equal(setenv("SLURM_JOB_GPUS", "0,1,2,3", 1), 0);
	assert_int_equal(setenv("FLOW_CUDA_DEVICE", "1", 1), 0);
	flow_gpu_binding_input_t in = input(7, 3, 4, 2);
	in.shared_ok = true;
	flow_gpu_binding_input_from_env(&in);
	assert_string_equal(in.cuda_visible_devices, "2,3");
	assert_string_equal(in.slurm_step_gpus, "2");
	assert_string_equal(in.slurm_job_gpus, "0,1,2,3");
	assert_string_equal(in.cuda_device, "1");
	/* The rest is the caller's. */
	assert_int_equal(in.rank, 7);
	assert_int_equal(in.local_rank, 3);
	assert_int_equal(in.local_size, 4);
	assert_int_equal(in.visible_count, 2);
	assert_string_equal(in.node, "gpu07");
	assert_true(in.shared_ok);
	flow_gpu_binding_t b = pick_ok(&in);
	assert_string_equal(b.desc,
			    "rank 7: cuda:1 (local rank 3 of 4, FLOW_CUDA_DEVICE=1); device 1 of CUDA_VISIBLE_DEVICES=2,3 (physical 3)");

	assert_int_equal(unsetenv("CUDA_VISIBLE_DEVICES"), 0);
	assert_int_equal(unsetenv("SLURM_STEP_GPUS"), 0);
	assert_int_equal(unsetenv("SLURM_JOB_GPUS"), 0);
	assert_int_equal(unsetenv("FLOW_CUDA_DEVICE"), 0);
	flow_gpu_binding_input_from_env(&in);
	assert_null(in.cuda_visible_devices);
	assert_null(in.slurm_step_gpus);
	assert_null(in.slurm_job_gpus);
	assert_null(in.cuda_device);
}

/* ---- the rule over every node shape ----------------------------------------------------- */

/* Every local rank of one node shape gets what flow/gpu_binding.h says:
 * its local rank when the devices suffice; ordinal 0 when Slurm binds one
 * device per task; otherwise local_rank % visible under shared_ok, which
 * spreads the ranks evenly (no device has two ranks more than another),
 * and a refusal of every rank without it. */
static void check_node_shape(int size, int visible, bool shared, bool slurm)
{
	bool bound = slurm && visible == 1 && size > 1;
	bool enough = size <= visible;
	flow_gpu_binding_how_t how = bound    ? FLOW_GPU_BINDING_SLURM
				     : enough ? FLOW_GPU_BINDING_LOCAL_RANK
					      : FLOW_GPU_BINDING_SHARED;
	int per_device[8] = { 0 };
	for (int lr = 0; lr < size; lr++) {
		flow_gpu_binding_input_t in = input(100 + lr, lr, size, visible);
		in.shared_ok = shared;
		if (slurm)
			in.slurm_step_gpus = "0";
		flow_gpu_binding_t b;
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_err_t err = flow_gpu_binding_pick(&in, &b, &diag);
		if (!bound && !enough && !shared) {
			if (err != FLOW_ERR_USAGE ||
			    !strstr(diag.msg, "two ranks would share a GPU"))
				fail_msg("local rank %d of %d, %d devices, slurm %d: %s %s",
					 lr, size, visible, slurm,
					 flow_err_name(err), diag.msg);
			continue;
		}
		int want = bound ? 0 : enough ? lr : lr % visible;
		if (err != FLOW_OK || b.device != want || b.how != how)
			fail_msg("local rank %d of %d, %d devices, shared %d, slurm %d: %s, cuda:%d how %d (want cuda:%d how %d) %s",
				 lr, size, visible, shared, slurm,
				 flow_err_name(err), b.device, (int)b.how, want,
				 (int)how, diag.msg);
		char head[64];
		snprintf(head, sizeof head, "rank %d: cuda:%d (", 100 + lr, want);
		assert_true(strncmp(b.desc, head, strlen(head)) == 0);
		per_device[b.device]++;
	}
	/* One rank per device without sharing (Slurm's ordinal 0 is each
	 * task's own GPU); as even as can be with it. */
	if (how == FLOW_GPU_BINDING_LOCAL_RANK)
		for (int d = 0; d < visible; d++)
			assert_true(per_device[d] == (d < size));
	if (how == FLOW_GPU_BINDING_SHARED && shared) {
		int lo = size, hi = 0;
		for (int d = 0; d < visible; d++) {
			lo = per_device[d] < lo ? per_device[d] : lo;
			hi = per_device[d] > hi ? per_device[d] : hi;
		}
		if (hi - lo > 1 || lo < 1)
			fail_msg("%d ranks on %d devices: %d to %d per device",
				 size, visible, lo, hi);
	}
}

/* local_size 1..16 x visible 1..8 x shared_ok x Slurm's variables. */
static void test_gpu_binding_rule_holds_for_every_node_shape(void **state)
{
	(void)state;
	int shapes = 0;
	for (int size = 1; size <= 16; size++)
		for (int visible = 1; visible <= 8; visible++)
			for (int shared = 0; shared <= 1; shared++)
				for (int slurm = 0; slurm <= 1; slurm++) {
					check_node_shape(size, visible, shared, slurm);
					shapes++;
				}
	assert_int_equal(shapes, 16 * 8 * 2 * 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gpu_binding_local_rank_takes_its_own_device),
		cmocka_unit_test(test_gpu_binding_names_the_physical_device),
		cmocka_unit_test(test_gpu_binding_names_uuid_and_mig_entries_as_written),
		cmocka_unit_test(test_gpu_binding_counts_a_long_device_list),
		cmocka_unit_test(test_gpu_binding_leaves_out_an_entry_the_list_lacks),
		cmocka_unit_test(test_gpu_binding_slurm_per_task_binding_takes_ordinal_0),
		cmocka_unit_test(test_gpu_binding_empty_slurm_variables_are_unset),
		cmocka_unit_test(test_gpu_binding_refuses_two_ranks_on_one_gpu),
		cmocka_unit_test(test_gpu_binding_shared_ok_spreads_ranks_over_devices),
		cmocka_unit_test(test_gpu_binding_refuses_a_node_without_devices),
		cmocka_unit_test(test_gpu_binding_flow_cuda_device_overrides),
		cmocka_unit_test(test_gpu_binding_refuses_an_out_of_range_flow_cuda_device),
		cmocka_unit_test(test_gpu_binding_refuses_a_malformed_flow_cuda_device),
		cmocka_unit_test(test_gpu_binding_refuses_inputs_out_of_range),
		cmocka_unit_test(test_gpu_binding_input_from_env_reads_four_variables),
		cmocka_unit_test(test_gpu_binding_rule_holds_for_every_node_shape),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
