/* The trainer's own logic that needs no ranks: a plan applied to a
 * configuration sets its fields, a plan for another world size is refused
 * naming its line, a one-rank world gets a data-parallel group of one,
 * and a checkpoint/resume round trip of a tiny model on a tiny dataset
 * gives the uninterrupted run's rows bit for bit.
 *
 * The dataset is built once (group setup) with flow_dataset_build from a
 * byte-level text, as flow-shard would build it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/ckpt.h>
#include <flow/comm.h>
#include <flow/file.h>
#include <flow/plan.h>
#include <flow/shard.h>
#include <flow/train.h>
#include <flow/world.h>

#include "testutil.h"
#include "worldutil.h"

/* Small enough that a step takes a millisecond. */
#define MODEL "gpt:layers=1,heads=2,dim=16,vocab=256,seq=16"
#define MAX_ROWS 16

static char tmpdir[256];
static char data_dir[512];

static int group_setup(void **state)
{
	(void)state;
	if (testutil_mkdtemp(tmpdir, sizeof tmpdir, "train") != 0)
		return -1;
	/* A text with structure to learn, the same on every run. */
	char text[64 * 200], input[512];
	size_t len = 0;
	for (int i = 0; i < 200; i++)
		len += (size_t)snprintf(text + len, sizeof text - len,
					"the quick fox jumps over dog %d.\n", i);
	snprintf(input, sizeof input, "%s/corpus.txt", tmpdir);
	snprintf(data_dir, sizeof data_dir, "%s/data", tmpdir);
	if (testutil_write_file(input, text, len) != 0)
		return -1;
	flow_dataset_options_t o;
	memset(&o, 0, sizeof o);
	o.input.format = FLOW_INPUT_TEXT;
	o.shard_tokens = 2048;
	const char *inputs[] = { input };
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_dataset_build(data_dir, inputs, 1, &o, &m, &diag) != FLOW_OK) {
		print_error("building %s: %s\n", data_dir,
			    flow_diag_message(&diag));
		return -1;
	}
	flow_manifest_release(&m);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	return testutil_rmtree(tmpdir);
}

/* A run of MODEL on the dataset, one rank, no MFU. */
static void config_of(flow_train_config_t *c, uint64_t steps)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_train_config_init(c);
	if (flow_gpt_parse(MODEL, &c->model, &diag) != FLOW_OK)
		fail_msg("%s", flow_diag_message(&diag));
	c->data_dir = data_dir;
	c->batch = 2;
	c->seq_len = 16;
	c->grad_accum = 2;
	c->steps = steps;
	c->lr.lr = 3e-3;
	c->peak_gflops = 0;
}

static flow_trainer_t *trainer_of(const flow_train_config_t *c)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_trainer_t *t = NULL;
	if (flow_trainer_new(c, &t, &diag) != FLOW_OK)
		fail_msg("%s", flow_diag_message(&diag));
	assert_non_null(t);
	return t;
}

/* Every row of t to the end of its run into rows; returns how many. */
static size_t run_to_end(flow_trainer_t *t, flow_train_row_t *rows)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	size_t n = 0;
	int rc;
	while (n < MAX_ROWS && (rc = flow_trainer_next(t, &rows[n], &diag)) > 0)
		n++;
	if (n == MAX_ROWS)
		fail_msg("more than %d rows", MAX_ROWS);
	if (rc < 0)
		fail_msg("%s", flow_diag_message(&diag));
	return n;
}

/* The same step, loss, learning rate and gradient norm, bit for bit. */
static void assert_same_row(const flow_train_row_t *a,
			    const flow_train_row_t *b)
{
	assert_int_equal(a->step, b->step);
	assert_int_equal(a->val, b->val);
	assert_memory_equal(&a->loss, &b->loss, sizeof a->loss);
	assert_memory_equal(&a->lr, &b->lr, sizeof a->lr);
	assert_memory_equal(&a->grad_norm, &b->grad_norm, sizeof a->grad_norm);
}

/* The standard data-parallel plan of MODEL on mesh, written to
 * tmpdir/name and read back, so that it names its file and lines as a
 * plan from flow-plan does. */
static flow_plan_t *plan_file(const char *name, const char *mesh, uint32_t B,
			      uint32_t T, uint32_t K)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *std = NULL, *p = NULL;
	char path[512];
	snprintf(path, sizeof path, "%s/%s", tmpdir, name);
	if (flow_plan_standard(MODEL, mesh, "dp", B, T, K, 0, &std, &diag))
		fail_msg("%s", flow_diag_message(&diag));
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	if (flow_plan_write(std, f, &diag) != FLOW_OK)
		fail_msg("%s", flow_diag_message(&diag));
	assert_int_equal(fclose(f), 0);
	flow_plan_free(std);
	if (flow_plan_read(path, &p, &diag) != FLOW_OK)
		fail_msg("%s", flow_diag_message(&diag));
	return p;
}

/* ---- the plan -------------------------------------------------------------- */

/* The model, batch, sequence length and gradient accumulation come from
 * the plan; every other setting stays the caller's. */
static void test_train_config_set_plan_takes_the_plans_settings(void **state)
{
	(void)state;
	flow_plan_t *p = plan_file("one.plan", "1", 6, 8, 3);
	flow_train_config_t c, before;
	flow_train_config_init(&c);
	c.steps = 7;
	c.seed = 99;
	before = c;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_train_config_set_plan(&c, p, &diag), FLOW_OK);
	assert_ptr_equal(c.plan, p);
	assert_int_equal(c.batch, 6);
	assert_int_equal(c.seq_len, 8);
	assert_int_equal(c.grad_accum, 3);
	assert_memory_equal(&c.model, &p->cfg, sizeof c.model);
	assert_int_equal(c.model.layers, 1);
	assert_int_equal(c.model.dim, 16);
	assert_int_equal(c.steps, before.steps);
	assert_int_equal(c.seed, before.seed);
	assert_null(c.world);
	assert_true(c.lr.lr == before.lr.lr);
	assert_true(c.adamw.beta2 == before.adamw.beta2);
	flow_plan_free(p);
}

/* A plan for two ranks on a one-rank world: the plan's mesh line, and
 * the configuration untouched. */
static void test_train_config_set_plan_refuses_another_world_size(void **state)
{
	(void)state;
	flow_plan_t *p = plan_file("two.plan", "2", 4, 16, 1);
	flow_train_config_t c, before;
	flow_train_config_init(&c);
	before = c;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_train_config_set_plan(&c, p, &diag),
			 FLOW_ERR_FORMAT);
	char want[FLOW_DIAG_MAX];
	snprintf(want, sizeof want,
		 "%s/two.plan:3: mesh '2:dp' has 2 ranks, not the world size 1",
		 tmpdir);
	assert_string_equal(flow_diag_message(&diag), want);
	assert_null(c.plan);
	assert_memory_equal(&c.model, &before.model, sizeof c.model);
	assert_int_equal(c.batch, before.batch);
	assert_int_equal(c.seq_len, before.seq_len);
	assert_int_equal(c.grad_accum, before.grad_accum);
	flow_plan_free(p);
}

/* On a one-rank world the plan's dp axis is a group of one: this rank. */
static void test_train_one_rank_world_gets_a_data_parallel_group_of_one(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_world_t *w = NULL;
	flow_comm_t *world = NULL;
	assert_int_equal(worldutil_singleton_open(5.0, &w, &world), 0);
	assert_int_equal(flow_comm_size(world), 1);
	flow_plan_t *p = plan_file("dp1.plan", "1", 2, 16, 2);
	flow_train_config_t c;
	config_of(&c, 1);
	c.world = world;
	assert_int_equal(flow_train_config_set_plan(&c, p, &diag), FLOW_OK);
	flow_trainer_t *t = trainer_of(&c);
	flow_comm_t *dp = flow_trainer_dp_comm(t);
	assert_non_null(dp);
	assert_ptr_not_equal(dp, world);
	assert_int_equal(flow_comm_size(dp), 1);
	assert_int_equal(flow_comm_rank(dp), 0);
	/* And it trains on it. */
	flow_train_row_t rows[MAX_ROWS];
	assert_int_equal(run_to_end(t, rows), 1);
	assert_int_equal(rows[0].step, 1);
	flow_trainer_free(t);
	flow_plan_free(p);
	assert_int_equal(worldutil_singleton_close(w, world), 0);
}

/* Without a world there is no group: one rank, no communicator. */
static void test_train_no_world_has_no_data_parallel_group(void **state)
{
	(void)state;
	flow_train_config_t c;
	config_of(&c, 0);
	flow_trainer_t *t = trainer_of(&c);
	assert_null(flow_trainer_dp_comm(t));
	flow_trainer_free(t);
}

/* ---- checkpoints and resume ------------------------------------------------- */

/* Six steps uninterrupted; the same with checkpoints every three steps
 * (which change nothing); then resumed from step 3: steps 4 to 6 again,
 * bit for bit. */
static void test_train_resume_repeats_the_uninterrupted_run(void **state)
{
	(void)state;
	flow_train_row_t full[MAX_ROWS], saved[MAX_ROWS], resumed[MAX_ROWS];
	char ck[512];
	snprintf(ck, sizeof ck, "%s/ck", tmpdir);

	flow_train_config_t c;
	config_of(&c, 6);
	flow_trainer_t *t = trainer_of(&c);
	assert_int_equal(run_to_end(t, full), 6);
	flow_trainer_free(t);

	c.ckpt_dir = ck;
	c.ckpt_every = 3;
	t = trainer_of(&c);
	assert_int_equal(run_to_end(t, saved), 6);
	flow_trainer_free(t);
	for (size_t i = 0; i < 6; i++) {
		assert_same_row(&saved[i], &full[i]);
		assert_int_equal(saved[i].checkpointed, (i + 1) % 3 == 0);
	}

	char *step3 = flow_ckpt_step_path(ck, 3);
	assert_non_null(step3);
	config_of(&c, 6);
	c.resume = step3;
	t = trainer_of(&c);
	assert_int_equal(flow_trainer_step(t), 3);
	assert_int_equal(run_to_end(t, resumed), 3);
	flow_trainer_free(t);
	for (size_t i = 0; i < 3; i++)
		assert_same_row(&resumed[i], &full[3 + i]);
	free(step3);

	/* "latest" is the last checkpoint, after the last step: nothing is
	 * left to run. */
	c.resume = "latest";
	c.ckpt_dir = ck;
	t = trainer_of(&c);
	assert_int_equal(flow_trainer_step(t), 6);
	assert_int_equal(run_to_end(t, resumed), 0);
	flow_trainer_free(t);
}

/* Train 2 steps with the checkpoint in tmpdir/name (ck, cap bytes):
 * returns its step directory (free()). */
static char *two_steps_into(const char *name, char *ck, size_t cap)
{
	flow_train_row_t rows[MAX_ROWS];
	snprintf(ck, cap, "%s/%s", tmpdir, name);
	flow_train_config_t c;
	config_of(&c, 2);
	c.ckpt_dir = ck;
	flow_trainer_t *t = trainer_of(&c);
	assert_int_equal(run_to_end(t, rows), 2);
	flow_trainer_free(t);
	char *step2 = flow_ckpt_step_path(ck, 2);
	assert_non_null(step2);
	return step2;
}

/* A checkpoint of another computation is refused, naming the first
 * setting that differs. */
static void test_train_resume_refuses_other_settings(void **state)
{
	(void)state;
	char ck[512];
	char *step2 = two_steps_into("other", ck, sizeof ck);
	flow_train_config_t c;
	flow_trainer_t *t;
	config_of(&c, 4);
	c.resume = step2;
	flow_diag_t diag = FLOW_DIAG_INIT;
	t = NULL;
	assert_int_equal(flow_trainer_new(&c, &t, &diag), FLOW_ERR_USAGE);
	assert_null(t);
	char want[FLOW_DIAG_MAX];
	snprintf(want, sizeof want,
		 "%s: steps is '2' in the checkpoint but '4' in this run",
		 step2);
	assert_string_equal(flow_diag_message(&diag), want);
	free(step2);
}

/* Commit step_dir again, as step `step`, with its state but key set to
 * value (NULL: unchanged): a checkpoint edited, or pieced together, with
 * a manifest whose checksum is right. */
static void recommit(const char *step_dir, uint64_t step, const char *key,
		     const char *value)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_ckpt_t *ck = NULL;
	assert_int_equal(flow_ckpt_open(step_dir, &ck, &diag), FLOW_OK);
	const flow_ckpt_kv_t *kv;
	size_t n = flow_ckpt_state(ck, &kv);
	flow_ckpt_kv_t edited[64];
	char keys[64][64], values[64][256];
	assert_true(n <= 64);
	for (size_t i = 0; i < n; i++) {
		snprintf(keys[i], sizeof keys[i], "%s", kv[i].key);
		snprintf(values[i], sizeof values[i], "%s",
			 key && strcmp(kv[i].key, key) == 0 ? value : kv[i].value);
		edited[i] = (flow_ckpt_kv_t){ keys[i], values[i] };
	}
	flow_ckpt_free(ck);
	assert_int_equal(flow_ckpt_commit(step_dir, step, 1, edited, n, &diag),
			 FLOW_OK);
}

/* What a checkpoint says of itself must agree: a loader position that is
 * not where its step leaves the stream, and a manifest of another step
 * than its directory's name, are refused with the file named. */
static void test_train_resume_checks_the_checkpoints_own_state(void **state)
{
	(void)state;
	char ck[512];
	char *step2 = two_steps_into("self", ck, sizeof ck);
	flow_train_config_t c;
	flow_trainer_t *t;
	flow_diag_t diag = FLOW_DIAG_INIT;
	char want[FLOW_DIAG_MAX];

	/* Step 2 of batch 2 x grad-accum 2 leaves the loader at sample 8. */
	recommit(step2, 2, "loader.index", "4");
	config_of(&c, 2);
	c.resume = step2;
	t = NULL;
	assert_int_equal(flow_trainer_new(&c, &t, &diag), FLOW_ERR_FORMAT);
	assert_null(t);
	assert_non_null(strstr(diag.msg, ": the loader stands at epoch 0 sample 4 (of "));
	assert_non_null(strstr(diag.msg, "), which is not where step 2 of batch 2 x grad-accum 2 leaves it"));
	recommit(step2, 2, "loader.index", "8");
	t = trainer_of(&c);
	flow_trainer_free(t);

	/* Renamed or copied: step-00000002 holding step 3. */
	recommit(step2, 3, NULL, NULL);
	c.resume = "latest";
	c.ckpt_dir = ck;
	flow_diag_clear(&diag);
	if (flow_trainer_new(&c, &t, &diag) != FLOW_ERR_FORMAT)
		fail_msg("%s", flow_diag_message(&diag));
	snprintf(want, sizeof want,
		 "%s/manifest: holds step 3, not the 2 its directory is named for",
		 step2);
	assert_string_equal(flow_diag_message(&diag), want);
	free(step2);
}

/* ---- the checkpoint layout ------------------------------------------------ */

/* Over every rank of plan: the writers are numbered 0..nwriters-1, each
 * part's desc and box is consistent with its tensor's, and the distinct
 * boxes of each tensor hold its elements exactly once.  Returns the
 * number of tensors, and the first part's mesh and sbp of tensor name in
 * mesh_out/sbp_out. */
static size_t check_layout(const char *model, const char *mesh,
			   const char *axes, uint32_t B, int zero,
			   const char *name, char *mesh_out, char *sbp_out)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *p = NULL;
	if (flow_plan_standard(model, mesh, axes, B, 16, 1, zero, &p, &diag))
		fail_msg("%s", flow_diag_message(&diag));
	int64_t world = flow_mesh_size(&p->mesh);
	flow_train_ckpt_layout_t *l = calloc((size_t)world, sizeof *l);
	assert_non_null(l);
	uint32_t nwriters = 0, writers = 0;
	for (int64_t r = 0; r < world; r++) {
		if (flow_train_ckpt_layout(p, r, FLOW_TRAIN_CKPT_TRAINING, &l[r],
					   &diag) != FLOW_OK)
			fail_msg("%s", flow_diag_message(&diag));
		nwriters = l[r].nwriters;
		if (l[r].writes)
			writers |= 1u << l[r].writer;
	}
	assert_int_equal(writers, (1u << nwriters) - 1);
	/* Tensors in rank 0's order (every rank has them all here). */
	size_t ntensors = 0;
	for (size_t i = 0; i < l[0].nparts; i++) {
		const flow_train_ckpt_part_t *a = &l[0].parts[i];
		flow_box_t whole;
		flow_box_whole(&a->desc.shape, &whole);
		int64_t numel = flow_box_numel(&whole), seen = 0;
		for (int64_t r = 0; r < world; r++) {
			for (size_t j = 0; j < l[r].nparts; j++) {
				const flow_train_ckpt_part_t *b = &l[r].parts[j];
				if (strcmp(a->desc.name, b->desc.name) != 0)
					continue;
				assert_true(flow_shape_equal(&a->desc.shape,
							     &b->desc.shape));
				assert_string_equal(a->desc.sbp, b->desc.sbp);
				assert_true(flow_box_inside(&b->box,
							    &b->desc.shape));
				bool dup = false;
				for (int64_t q = 0; q <= r && !dup; q++)
					for (size_t k = 0; k < l[q].nparts &&
							   !dup; k++) {
						const flow_train_ckpt_part_t *c =
							&l[q].parts[k];
						if (c == b)
							break;
						dup = strcmp(c->desc.name,
							     b->desc.name) == 0 &&
						      flow_box_equal(&c->box,
								     &b->box);
					}
				if (!dup)
					seen += flow_box_numel(&b->box);
			}
		}
		assert_int_equal(seen, numel);
		if (strcmp(a->desc.name, name) == 0) {
			snprintf(mesh_out, FLOW_CKPT_TEXT_MAX, "%s", a->desc.mesh);
			snprintf(sbp_out, FLOW_CKPT_TEXT_MAX, "%s", a->desc.sbp);
		}
		ntensors++;
	}
	for (int64_t r = 0; r < world; r++)
		flow_train_ckpt_layout_release(&l[r]);
	flow_train_ckpt_layout_release(&l[0]); /* twice: accepted */
	free(l);
	flow_plan_free(p);
	return ntensors;
}

/* One rank writes whole tensors, (B) on mesh 1; 2x2 (dp,tp) splits the
 * tensor-parallel weights and every rank writes; ZeRO 3 on dp=4 writes
 * row shards from the four dp ranks.  Each tensor is covered exactly
 * once, with its moments beside it. */
static void test_train_ckpt_layout_of_standard_plans(void **state)
{
	(void)state;
	char mesh[FLOW_CKPT_TEXT_MAX] = "", sbp[FLOW_CKPT_TEXT_MAX] = "";
	size_t n1 = check_layout(MODEL, "1", "dp", 4, 0, "wte", mesh, sbp);
	assert_string_equal(mesh, "1");
	assert_string_equal(sbp, "(B)");
	assert_true(n1 > 0 && n1 % 3 == 0);
	assert_int_equal(check_layout(MODEL, "2x2", "dp,tp", 4, 0,
				      "h.0.mlp.c_fc.weight", mesh, sbp),
			 n1);
	assert_string_equal(mesh, "2x2");
	assert_non_null(strstr(sbp, "S("));
	assert_int_equal(check_layout(MODEL, "4", "dp", 4, 3,
				      "adamw.m/wte", mesh, sbp),
			 n1);
	assert_string_equal(mesh, "4");
	assert_string_equal(sbp, "(S(0))");
}

/* A rank off the plan's mesh is a usage error naming it. */
static void test_train_ckpt_layout_refuses_a_rank_off_the_mesh(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *p = NULL;
	if (flow_plan_standard(MODEL, "2", "dp", 4, 16, 1, 0, &p, &diag))
		fail_msg("%s", flow_diag_message(&diag));
	flow_train_ckpt_layout_t l = { 0 };
	assert_int_equal(flow_train_ckpt_layout(p, 5, FLOW_TRAIN_CKPT_TRAINING, &l,
						&diag),
			 FLOW_ERR_USAGE);
	assert_non_null(strstr(flow_diag_message(&diag), "rank 5"));
	assert_null(l.parts);
	flow_plan_free(p);
}

/* ---- resharding ------------------------------------------------------------ */

/* The same bytes of file name in directories a and b. */
static void assert_same_file(const char *a, const char *b, const char *name)
{
	char pa[700], pb[700];
	snprintf(pa, sizeof pa, "%s/%s", a, name);
	snprintf(pb, sizeof pb, "%s/%s", b, name);
	flow_diag_t diag = FLOW_DIAG_INIT;
	char *da = NULL, *db = NULL;
	size_t la = 0, lb = 0;
	if (flow_file_read_all(pa, &da, &la, &diag) != FLOW_OK ||
	    flow_file_read_all(pb, &db, &lb, &diag) != FLOW_OK)
		fail_msg("%s", flow_diag_message(&diag));
	assert_int_equal(la, lb);
	assert_memory_equal(da, db, la);
	free(da);
	free(db);
}

/* A training checkpoint resharded onto 2x2 (dp,tp) is the same bytes
 * whether one thread or four write the ranks' files, and resharded back
 * onto one rank it holds every tensor of the source bit for bit; a budget
 * too small for one shard is refused before anything is written. */
static void test_train_ckpt_reshard_on_threads_writes_the_same_bytes(void **state)
{
	(void)state;
	char ck[512], out[4][600];
	char *step2 = two_steps_into("reshard", ck, sizeof ck);
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_ckpt_t *src = NULL, *back = NULL;
	flow_plan_t *tp = NULL, *one = NULL;
	if (flow_ckpt_open(step2, &src, &diag) != FLOW_OK ||
	    flow_plan_standard(MODEL, "2x2", "dp,tp", 4, 16, 1, 0, &tp, &diag) ||
	    flow_plan_standard(MODEL, "1", "dp", 4, 16, 1, 0, &one, &diag))
		fail_msg("%s", flow_diag_message(&diag));
	const int threads[] = { 1, 4 };
	for (int i = 0; i < 2; i++) {
		snprintf(out[i], sizeof out[i], "%s/reshard-t%d", tmpdir,
			 threads[i]);
		flow_train_reshard_options_t opt = { .threads = threads[i] };
		if (flow_train_ckpt_reshard(src, step2, tp, out[i], &opt,
					    &diag) != FLOW_OK)
			fail_msg("%s", flow_diag_message(&diag));
	}
	assert_same_file(out[0], out[1], "manifest");
	for (int r = 0; r < 4; r++) {
		char name[32];
		snprintf(name, sizeof name, "rank-%05d.bin", r);
		assert_same_file(out[0], out[1], name);
		snprintf(name, sizeof name, "rank-%05d.idx", r);
		assert_same_file(out[0], out[1], name);
	}

	flow_ckpt_t *mid = NULL;
	snprintf(out[2], sizeof out[2], "%s/reshard-back", tmpdir);
	if (flow_ckpt_open(out[1], &mid, &diag) != FLOW_OK ||
	    flow_train_ckpt_reshard(mid, out[1], one, out[2], NULL, &diag) ||
	    flow_ckpt_open(out[2], &back, &diag) != FLOW_OK)
		fail_msg("%s", flow_diag_message(&diag));
	assert_int_equal(flow_ckpt_tensor_count(back),
			 flow_ckpt_tensor_count(src));
	for (size_t i = 0; i < flow_ckpt_tensor_count(src); i++) {
		const flow_ckpt_tensor_desc_t *d = flow_ckpt_tensor_at(src, i);
		int j = flow_ckpt_tensor_find(back, d->name);
		assert_true(j >= 0);
		flow_box_t whole;
		flow_box_whole(&d->shape, &whole);
		size_t n = (size_t)flow_box_numel(&whole) * flow_dtype_size(d->dtype);
		void *a = malloc(n + 1), *b = malloc(n + 1);
		assert_int_equal(flow_ckpt_read(src, i, NULL, a, &diag), FLOW_OK);
		assert_int_equal(flow_ckpt_read(back, (size_t)j, NULL, b, &diag),
				 FLOW_OK);
		assert_memory_equal(a, b, n);
		free(a);
		free(b);
	}

	snprintf(out[3], sizeof out[3], "%s/reshard-small", tmpdir);
	flow_train_reshard_options_t tiny = { .max_memory = 64 };
	flow_diag_clear(&diag);
	assert_int_equal(flow_train_ckpt_reshard(src, step2, tp, out[3], &tiny,
						 &diag),
			 FLOW_ERR_USAGE);
	assert_non_null(strstr(flow_diag_message(&diag), "more than --max-memory 64"));
	assert_int_equal(testutil_count_entries(out[3]), -1);

	flow_ckpt_free(back);
	flow_ckpt_free(mid);
	flow_ckpt_free(src);
	flow_plan_free(one);
	flow_plan_free(tp);
	free(step2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_train_config_set_plan_takes_the_plans_settings),
		cmocka_unit_test(test_train_config_set_plan_refuses_another_world_size),
		cmocka_unit_test(test_train_one_rank_world_gets_a_data_parallel_group_of_one),
		cmocka_unit_test(test_train_no_world_has_no_data_parallel_group),
		cmocka_unit_test(test_train_resume_repeats_the_uninterrupted_run),
		cmocka_unit_test(test_train_resume_refuses_other_settings),
		cmocka_unit_test(test_train_resume_checks_the_checkpoints_own_state),
		cmocka_unit_test(test_train_ckpt_layout_of_standard_plans),
		cmocka_unit_test(test_train_ckpt_layout_refuses_a_rank_off_the_mesh),
		cmocka_unit_test(test_train_ckpt_reshard_on_threads_writes_the_same_bytes),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
