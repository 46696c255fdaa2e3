/* test_cuda_exec: the executor on the CUDA kernel set against the CPU set,
 * on a whole GPT graph: the same parameters (the executor's init, copied
 * up), the same tokens, then the loss of a forward pass, every parameter
 * gradient of a backward pass, and every parameter and the gradient norm
 * after one clipped AdamW step (the parameters carry the moments' values),
 * and the loss of the next
 * batch copied up on the copy stream; and, in a build with NCCL, a
 * communicator split from a one-rank NCCL world (every group of a plan is
 * one), summing device memory.  Between the kernel test
 * (tests/gpu/test_cuda_kernels.c, one kernel at a time) and the trainer
 * (tests/gpu/train.sh): a failure here is in the executor's device paths
 * (storage, copies, dispatch, the optimizer on the device), not a kernel's
 * arithmetic nor the trainer's.
 *
 * Output (stdout): '#' lines naming the device and the graph, then one TSV
 * row per check, in test_cuda_kernels' columns:
 *
 *   check  pass  max_abs_err  max_rel_err  wrong  time_us
 *
 * Tolerances: the loss within 1e-5 relative (cross-entropy in double on
 * both sides over float logits from GEMMs of K <= 512: ~1e-6); gradients
 * and updated parameters within atol 1e-5 * the tensor's largest |cpu|
 * value + rtol 1e-3 (the backward pass chains a dozen GEMMs and
 * reductions in different orders; an indexing or copy error is of the
 * tensor's own scale); the gradient norm within 1e-5 relative.  The
 * AdamW step takes eps 1e-3, not 1e-8: at step 1 the update is
 * lr g / (|g| + eps), which with a tiny eps is +-lr for any g above it,
 * so a gradient that is rounding noise on both sides (the key third of
 * c_attn's bias: softmax ignores a constant per row) would move by up to
 * 2 lr between CPU and GPU; with 1e-3 the update is smooth in g (slope
 * lr / eps) and still about lr / 2 (an emulation with the reference set
 * for the GPU: 125 wrong elements with 1e-8, none with 1e-3, worst 0.08
 * of the tolerance).  An out-of-place all-reduce through the NCCL split,
 * so one that does nothing fails.
 *
 * Then the same graph in mixed precision (act_dtype bf16: the executor
 * dispatches the bf16 twins), CPU against GPU: the loss within 1e-3
 * relative and every parameter gradient within atol 2e-2 * the tensor's
 * largest |cpu| value + rtol 5e-2.  Each bf16 activation carries 8 bits,
 * and the two sides round differently in places by design (sums in
 * another order straddling a rounding boundary, the fused GELU of the
 * unrounded sum, cuDNN's flash attention), so activations differ by a
 * rounding (2^-8 relative) here and there and a dozen of them chain
 * through two layers forward and back: a few 2^-8 per element, a loss
 * averaged over 256 tokens much less; a dispatch error (bf16 read as
 * fp32, a twin that does not accumulate) is of the tensor's own scale.
 *
 * Exit status: 0 every check passed; 1 a check failed or an error; 77
 * (skipped) without a CUDA driver, device or module. */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/caching_alloc.h>
#include <flow/comm.h>
#include <flow/device.h>
#include <flow/exec.h>
#include <flow/mem.h>
#include <flow/model.h>
#include <flow/optim.h>
#include <flow/world.h>

#define PROG "test_cuda_exec"
#define SPEC "gpt:layers=2,heads=4,dim=128,vocab=256,seq=64"
#define BATCH 4

static int g_checks, g_failed;

__attribute__((noreturn)) static void die(const char *what,
					  const flow_diag_t *diag)
{
	fflush(stdout);
	fprintf(stderr, PROG ": %s: %s\n", what, flow_diag_message(diag));
	exit(1);
}

/* One check's row: got against ref over n floats. */
static void check(const char *name, const float *ref, const float *got,
		  size_t n, double rtol, double atol_scale)
{
	double scale = 0.0, max_abs = 0.0, max_rel = 0.0;
	size_t wrong = 0;
	for (size_t i = 0; i < n; i++)
		scale = fmax(scale, fabs(ref[i]));
	double atol = atol_scale * scale;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - ref[i]);
		if (isnan(d))
			d = INFINITY;
		max_abs = fmax(max_abs, d);
		if (ref[i] != 0.0f)
			max_rel = fmax(max_rel, d / fabs(ref[i]));
		if (!(d <= atol + rtol * fabs(ref[i]))) {
			if (wrong < 5)
				fprintf(stderr,
					PROG ": %s[%zu]: gpu %.9g, cpu %.9g\n",
					name, i, got[i], ref[i]);
			wrong++;
		}
	}
	g_checks++;
	g_failed += wrong != 0;
	printf("%s\t%s\t%.3e\t%.3e\t%zu\t-\n", name, wrong ? "no" : "yes",
	       max_abs, max_rel, wrong);
	fflush(stdout);
}

static flow_exec_t *exec_on(const flow_graph_t *g, flow_kernel_set_t set)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_exec_t *x = NULL;
	if (flow_exec_new(g, set, &x, &diag) != FLOW_OK ||
	    flow_exec_init_params(x, 1234, &diag) != FLOW_OK)
		die("flow_exec_new", &diag);
	return x;
}

/* Tensor t of x, whatever its storage, in a new host buffer. */
static float *host_tensor(flow_exec_t *x, const flow_graph_t *g, int t)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	float *h = flow_alloc(flow_graph_tensor_bytes(g, t) + 4);
	if (!h || flow_exec_tensor_download(x, t, h, &diag) != FLOW_OK)
		die("flow_exec_tensor_download", &diag);
	return h;
}

/* Every tensor of role in both executors, one row each (prefix + name),
 * within check's rtol and atol_scale. */
static void check_role(flow_exec_t *cpu, flow_exec_t *gpu,
		       const flow_graph_t *g, flow_role_t role,
		       const char *prefix, double rtol, double atol_scale)
{
	for (size_t t = 0; t < g->ntensors; t++) {
		if (g->tensors[t].role != role)
			continue;
		char name[160];
		float *a = host_tensor(cpu, g, (int)t);
		float *b = host_tensor(gpu, g, (int)t);
		snprintf(name, sizeof name, "%s%s", prefix, g->tensors[t].name);
		check(name, a, b, flow_graph_tensor_numel(g, (int)t), rtol,
		      atol_scale);
		flow_free(a);
		flow_free(b);
	}
}

/* The graph of SPEC in mixed precision on both devices: the loss of a
 * forward pass on the tokens ids (then targets), and every parameter
 * gradient of a backward pass.  Rows prefixed "bf16 ". */
static void check_bf16_graph(const flow_gpt_config_t *cfg, const int32_t *ids)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_graph_t g;
	double lc = 0.0, lg = 0.0;

	flow_graph_init(&g);
	if (flow_graph_set_act_dtype(&g, FLOW_DTYPE_BF16, &diag) != FLOW_OK ||
	    flow_gpt_build(cfg, BATCH, cfg->seq, &g, &diag) != FLOW_OK ||
	    flow_graph_backward(&g, &diag) != FLOW_OK)
		die(SPEC " in bf16", &diag);
	flow_exec_t *cpu = exec_on(&g, FLOW_KERNELS_CPU);
	flow_exec_t *gpu = exec_on(&g, FLOW_KERNELS_CUDA);
	int tok = flow_graph_find(&g, "tokens");
	int tgt = flow_graph_find(&g, "targets");
	size_t ntok = flow_graph_tensor_numel(&g, tok);
	if (flow_exec_tensor_upload(cpu, tok, ids, &diag) ||
	    flow_exec_tensor_upload(cpu, tgt, ids + ntok, &diag) ||
	    flow_exec_tensor_upload(gpu, tok, ids, &diag) ||
	    flow_exec_tensor_upload(gpu, tgt, ids + ntok, &diag))
		die("upload in bf16", &diag);
	flow_exec_zero_param_grads(cpu);
	flow_exec_zero_param_grads(gpu);
	if (flow_exec_forward(cpu, &lc, &diag) ||
	    flow_exec_backward(cpu, &diag) ||
	    flow_exec_forward(gpu, &lg, &diag) ||
	    flow_exec_backward(gpu, &diag))
		die("forward and backward in bf16", &diag);
	float lcf = (float)lc, lgf = (float)lg;
	printf("# bf16: loss cpu %.9g, gpu %.9g\n", lc, lg);
	check("bf16 loss", &lcf, &lgf, 1, 1e-3, 0.0);
	check_role(cpu, gpu, &g, FLOW_ROLE_PARAM_GRAD, "bf16 grad ", 5e-2,
		   2e-2);
	flow_exec_free(gpu);
	flow_exec_free(cpu);
	flow_graph_release(&g);
}

#ifdef HAVE_NCCL
/* A plan's groups are NCCL communicators split from the world's: one
 * split of a one-rank world (a singleton, no launcher), then an all-reduce
 * on device memory through the child.  One row. */
static void check_nccl_split(flow_exec_t *gpu)
{
	const flow_exec_storage_t *st = flow_exec_storage(gpu);
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_world_t *w = NULL;
	flow_comm_t *world = NULL, *child = NULL;
	const float x[4] = { 1.5f, -2.0f, 3.25f, 0.0f };
	float got[4] = { 0 };
	void *d = st->alloc(sizeof x), *sum = st->alloc(sizeof x);

	if (!d || !sum || flow_world_init(&w, 30.0, &diag) != FLOW_OK ||
	    flow_comm_world(w, FLOW_COMM_NCCL, &world, &diag) != FLOW_OK ||
	    flow_comm_split(world, 0, 0, &child, &diag) != FLOW_OK)
		die("an NCCL split", &diag);
	/* Out of place into zeroed memory: one that does nothing fails. */
	if (flow_exec_copy_in(gpu, d, x, sizeof x, &diag) != FLOW_OK ||
	    flow_all_reduce(child, d, sum, 4, FLOW_DTYPE_F32, &diag) != FLOW_OK ||
	    flow_exec_copy_out(gpu, got, sum, sizeof got, &diag) != FLOW_OK)
		die("an all-reduce on the split", &diag);
	check("nccl split all_reduce", x, got, 4, 0.0, 0.0);
	st->free(sum);
	st->free(d);
	flow_comm_free(child);
	flow_comm_free(world);
	if (flow_world_free(w, &diag) != FLOW_OK)
		die("flow_world_free", &diag);
}
#endif

int main(void)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_gpt_config_t cfg;
	flow_graph_t g;
	flow_cuda_device_info_t info;

	if (flow_cuda_open(&diag) != FLOW_OK) {
		fprintf(stderr, PROG ": skipped: %s\n", flow_diag_message(&diag));
		return 77;
	}
	if (flow_cuda_select(0, &diag) != FLOW_OK ||
	    flow_cuda_info(0, &info, &diag) != FLOW_OK)
		die("device 0", &diag);
	flow_graph_init(&g);
	if (flow_gpt_parse(SPEC, &cfg, &diag) != FLOW_OK ||
	    flow_gpt_build(&cfg, BATCH, cfg.seq, &g, &diag) != FLOW_OK ||
	    flow_graph_backward(&g, &diag) != FLOW_OK)
		die(SPEC, &diag);
	printf("# device 0: %s; graph %s, B=%d, T=%u\n", info.name, SPEC, BATCH,
	       cfg.seq);
	printf("check\tpass\tmax_abs_err\tmax_rel_err\twrong\ttime_us\n");

	flow_exec_t *cpu = exec_on(&g, FLOW_KERNELS_CPU);
	flow_exec_t *gpu = exec_on(&g, FLOW_KERNELS_CUDA);
	check_role(cpu, gpu, &g, FLOW_ROLE_PARAM, "init ", 1e-3, 1e-5);

	/* The same tokens into both. */
	int tok = flow_graph_find(&g, "tokens"), tgt = flow_graph_find(&g, "targets");
	size_t ntok = flow_graph_tensor_numel(&g, tok);
	int32_t *ids = calloc(2 * ntok, sizeof *ids);
	if (!ids)
		return 1;
	for (size_t i = 0; i < 2 * ntok; i++)
		ids[i] = (int32_t)((i * 2654435761u >> 8) % cfg.vocab);
	if (flow_exec_tensor_upload(cpu, tok, ids, &diag) ||
	    flow_exec_tensor_upload(cpu, tgt, ids + ntok, &diag) ||
	    flow_exec_tensor_upload(gpu, tok, ids, &diag) ||
	    flow_exec_tensor_upload(gpu, tgt, ids + ntok, &diag))
		die("upload", &diag);

	double lc, lg;
	if (flow_exec_forward(cpu, &lc, &diag) || flow_exec_forward(gpu, &lg, &diag))
		die("forward", &diag);
	float lcf = (float)lc, lgf = (float)lg;
	printf("# loss cpu %.9g, gpu %.9g\n", lc, lg);
	check("loss", &lcf, &lgf, 1, 1e-5, 0.0);
	flow_exec_zero_param_grads(cpu);
	flow_exec_zero_param_grads(gpu);
	if (flow_exec_forward(cpu, &lc, &diag) || flow_exec_backward(cpu, &diag) ||
	    flow_exec_forward(gpu, &lg, &diag) || flow_exec_backward(gpu, &diag))
		die("forward and backward", &diag);
	check_role(cpu, gpu, &g, FLOW_ROLE_PARAM_GRAD, "grad ", 1e-3, 1e-5);

	/* One clipped AdamW step on each device. */
	flow_adamw_params_t hp = { 6e-4f, 0.9f, 0.95f, 1e-3f, 0.1f };
	flow_adamw_t *oc = NULL, *og = NULL;
	if (flow_adamw_new(cpu, &hp, &oc, &diag) || flow_adamw_new(gpu, &hp, &og, &diag))
		die("flow_adamw_new", &diag);
	float nc = flow_adamw_clip_grad_norm(oc, 0.5f);
	float ng = flow_adamw_clip_grad_norm(og, 0.5f);
	printf("# grad norm cpu %.9g, gpu %.9g\n", nc, ng);
	check("grad_norm", &nc, &ng, 1, 1e-5, 0.0);
	flow_adamw_step(oc, 1, 6e-4f);
	flow_adamw_step(og, 1, 6e-4f);
	check_role(cpu, gpu, &g, FLOW_ROLE_PARAM, "step1 ", 1e-3, 1e-5);

	/* The next batch as the trainer copies it: from page-locked memory on
	 * the copy stream, behind the pass that last read the inputs, the
	 * next pass's kernels waiting for it on the device. */
	const flow_exec_storage_t *st = flow_exec_storage(gpu);
	int32_t *pinned = st->host_alloc(2 * ntok * sizeof *pinned);
	void *read = st->event_new(), *copied = st->event_new();
	if (!pinned || !read || !copied || !st->copy_in_ahead)
		die("the copy stream's buffers and events", &diag);
	for (size_t i = 0; i < 2 * ntok; i++)
		pinned[i] = ids[i] = (int32_t)((i * 40503u >> 4) % cfg.vocab);
	if (flow_exec_tensor_upload(cpu, tok, ids, &diag) ||
	    flow_exec_tensor_upload(cpu, tgt, ids + ntok, &diag) ||
	    flow_exec_forward(cpu, &lc, &diag))
		die("the next batch on the CPU", &diag);
	st->event_record(read);
	st->copy_in_ahead(flow_exec_tensor(gpu, tok), pinned,
			  ntok * sizeof *pinned, read, NULL);
	st->copy_in_ahead(flow_exec_tensor(gpu, tgt), pinned + ntok,
			  ntok * sizeof *pinned, NULL, copied);
	st->kernels_wait(copied);
	if (flow_exec_forward(gpu, &lg, &diag))
		die("the next batch through the copy stream", &diag);
	st->event_wait(copied);
	lcf = (float)lc;
	lgf = (float)lg;
	check("loss after copy_in_ahead", &lcf, &lgf, 1, 1e-5, 0.0);
	st->event_free(read);
	st->event_free(copied);
	st->host_free(pinned);

#ifdef HAVE_NCCL
	check_nccl_split(gpu);
#endif
	check_bf16_graph(&cfg, ids);

	flow_alloc_stats_t mem;
	if (flow_cuda_memory_stats(0, &mem, &diag) == FLOW_OK)
		printf("# device memory: %.1f MiB in use, %.1f MiB reserved, %llu "
		       "cudaMalloc calls\n",
		       (double)mem.peak_in_use_bytes / 1048576.0,
		       (double)mem.peak_reserved_bytes / 1048576.0,
		       (unsigned long long)mem.backend_allocs);
	flow_adamw_free(og);
	flow_adamw_free(oc);
	flow_exec_free(gpu);
	flow_exec_free(cpu);
	flow_graph_release(&g);
	free(ids);
	printf("# %s: %d of %d checks failed\n", g_failed ? "FAIL" : "PASS",
	       g_failed, g_checks);
	return g_failed ? 1 : 0;
}
