/* Resharding a checkpoint offline (flow_train_ckpt_reshard, flow-ckpt
 * reshard and import): the layouts a plan's ranks write
 * (flow_train_ckpt_layout), each target part read as a box from the
 * source shards that intersect it (flow_ckpt_read_bounded) and appended to
 * its rank's file, the ranks' files written by several threads at once
 * within one budget of bytes, then committed like flow-train's own. */
#include <config.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <flow/file.h>
#include <flow/log.h>
#include <flow/model.h>
#include <flow/train.h>

/* A read buffer larger than this saves no reads. */
#define RESHARD_SCRATCH_MAX ((size_t)64 << 20)
/* Threads at most: the work is memory copies, hashing and writes. */
#define RESHARD_THREADS_MAX 8
/* What each thread beyond the first costs besides its buffers (its stack
 * and allocator arena as touched, about 0.3 MiB), counted in the budget
 * so that the process, not just its buffers, stays within it. */
#define RESHARD_THREAD_OVERHEAD ((uint64_t)1 << 20)

/* Buffers straight from the kernel and back to it: malloc's arenas (one
 * per thread) keep freed memory resident, and the budget counts what is
 * resident.  NULL when out of memory. */
static void *buffer_new(size_t n)
{
	void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void buffer_free(void *p, size_t n)
{
	if (p)
		munmap(p, n ? n : 1);
}

static size_t part_bytes(const flow_train_ckpt_part_t *p)
{
	return (size_t)flow_box_numel(&p->box) * flow_dtype_size(p->desc.dtype);
}

/* Every part of every layout is a tensor of the source with its dtype and
 * shape, every tensor of the source is written, and the model specs are
 * equal: else the plan is for another model, named by the first tensor
 * that does not match (or by both specs, when only the heads differ). */
static flow_err_t match_model(const flow_ckpt_t *ck, const char *ck_path,
			      const flow_plan_t *plan,
			      const flow_train_ckpt_layout_t *layouts,
			      size_t nlayouts, flow_diag_t *diag)
{
	size_t nt = flow_ckpt_tensor_count(ck);
	bool *seen = calloc(nt ? nt : 1, sizeof *seen);
	if (!seen)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	flow_err_t err = FLOW_OK;
	for (size_t r = 0; r < nlayouts && err == FLOW_OK; r++) {
		for (size_t i = 0; i < layouts[r].nparts; i++) {
			const flow_ckpt_tensor_desc_t *want =
				&layouts[r].parts[i].desc;
			int j = flow_ckpt_tensor_find(ck, want->name);
			if (j < 0) {
				err = flow_diag_set(
					diag, FLOW_ERR_FORMAT,
					"%s: plan is for another model: "
					"checkpoint '%s' has no tensor '%s'",
					plan->path, ck_path, want->name);
				break;
			}
			const flow_ckpt_tensor_desc_t *have =
				flow_ckpt_tensor_at(ck, (size_t)j);
			if (have->dtype != want->dtype ||
			    !flow_shape_equal(&have->shape, &want->shape)) {
				char hs[192], ws[192];
				flow_shape_format(&have->shape, hs, sizeof hs);
				flow_shape_format(&want->shape, ws, sizeof ws);
				err = flow_diag_set(
					diag, FLOW_ERR_FORMAT,
					"%s: plan is for another model: tensor "
					"'%s' is %s %s in the plan but %s %s in "
					"'%s'",
					plan->path, want->name,
					flow_dtype_name(want->dtype), ws,
					flow_dtype_name(have->dtype), hs,
					ck_path);
				break;
			}
			seen[j] = true;
		}
	}
	for (size_t j = 0; j < nt && err == FLOW_OK; j++)
		if (!seen[j])
			err = flow_diag_set(diag, FLOW_ERR_FORMAT,
					    "%s: plan is for another model: it "
					    "has no tensor '%s' of '%s'",
					    plan->path,
					    flow_ckpt_tensor_at(ck, j)->name,
					    ck_path);
	/* What the shapes do not show (the heads) is in the spec. */
	const char *model = flow_ckpt_get(ck, "model");
	char spec[FLOW_GPT_SPEC_MAX];
	flow_gpt_format(&plan->cfg, spec, sizeof spec);
	if (err == FLOW_OK && (!model || strcmp(model, spec) != 0))
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: plan is for another model: '%s', "
				    "but '%s' holds '%s'",
				    plan->path, spec, ck_path,
				    model ? model : "(none)");
	free(seen);
	return err;
}

/* ---- the writers ---------------------------------------------------------------- */

/* The work the threads share.  Each takes the next target rank and writes
 * its file part by part.  A thread holds a read buffer of scap bytes for
 * its whole life (reserved up front) and a part buffer grown to the
 * largest part it has written, counted in held, within parts_budget for
 * all threads together: a thread that needs more first gives back what it
 * holds and then waits, so a waiting thread holds nothing and the budget
 * cannot deadlock (one part alone always fits: checked before). */
typedef struct reshard_work {
	const flow_ckpt_t *ck;
	const char *dir;
	const flow_train_ckpt_layout_t *layouts;
	size_t nlayouts;
	size_t scap;
	uint64_t parts_budget;

	pthread_mutex_t lock;
	pthread_cond_t freed;
	uint64_t held;       /* bytes of part buffers, all threads */
	int waiting;         /* threads waiting for bytes */
	size_t next;         /* the next layout to take */
	bool failed;
	flow_diag_t diag;    /* the first failure */
} reshard_work_t;

typedef struct reshard_thread {
	reshard_work_t *work;
	void *scratch;
	void *buf;
	size_t cap;          /* of buf, counted in work->held */
} reshard_thread_t;

static void thread_release(reshard_thread_t *th)
{
	reshard_work_t *w = th->work;
	buffer_free(th->buf, th->cap);
	th->buf = NULL;
	pthread_mutex_lock(&w->lock);
	w->held -= th->cap;
	pthread_cond_broadcast(&w->freed);
	pthread_mutex_unlock(&w->lock);
	th->cap = 0;
}

/* A part buffer of at least n bytes; false when another thread failed. */
static bool thread_reserve(reshard_thread_t *th, size_t n, flow_diag_t *diag)
{
	reshard_work_t *w = th->work;
	if (n <= th->cap)
		return true;
	thread_release(th);
	pthread_mutex_lock(&w->lock);
	w->waiting++;
	while (!w->failed && w->held + n > w->parts_budget)
		pthread_cond_wait(&w->freed, &w->lock);
	w->waiting--;
	bool ok = !w->failed;
	if (ok)
		w->held += n;
	pthread_mutex_unlock(&w->lock);
	if (!ok)
		return false;
	th->cap = n;
	if (!(th->buf = buffer_new(n))) {
		flow_diag_set(diag, FLOW_ERR_NOMEM,
			      "out of memory for a %zu-byte shard", n);
		return false;
	}
	return true;
}

/* Write layout l's file into w->dir. */
static flow_err_t write_rank(reshard_thread_t *th,
			     const flow_train_ckpt_layout_t *l,
			     flow_diag_t *diag)
{
	reshard_work_t *w = th->work;
	flow_ckpt_writer_t *cw;
	flow_err_t err = flow_ckpt_writer_new(w->dir, l->writer, &cw, diag);
	if (err != FLOW_OK)
		return err;
	for (size_t i = 0; i < l->nparts && err == FLOW_OK; i++) {
		const flow_train_ckpt_part_t *p = &l->parts[i];
		size_t n = part_bytes(p);
		if (!thread_reserve(th, n ? n : 1, diag)) {
			/* Out of memory (diag set), or another thread
			 * failed (which said why). */
			err = diag->err != FLOW_OK ? diag->err : FLOW_ERR_IO;
			break;
		}
		int j = flow_ckpt_tensor_find(w->ck, p->desc.name);
		err = flow_ckpt_read_bounded(w->ck, (size_t)j, &p->box, th->buf,
					     th->scratch, w->scap, diag);
		if (err == FLOW_OK)
			err = flow_ckpt_writer_add(cw, &p->desc, &p->box,
						   th->buf, diag);
		/* Let a waiting thread have the bytes between parts. */
		pthread_mutex_lock(&w->lock);
		bool give_back = w->waiting > 0;
		pthread_mutex_unlock(&w->lock);
		if (give_back)
			thread_release(th);
	}
	if (err != FLOW_OK) {
		flow_ckpt_writer_abort(cw);
		return err;
	}
	err = flow_ckpt_writer_finish(cw, diag);
	if (err == FLOW_OK)
		flow_log(FLOW_LOG_INFO, "wrote rank %" PRIu32 " (%zu tensors)",
			 l->writer, l->nparts);
	return err;
}

static void *reshard_thread_main(void *arg)
{
	reshard_thread_t *th = arg;
	reshard_work_t *w = th->work;
	for (;;) {
		pthread_mutex_lock(&w->lock);
		while (w->next < w->nlayouts && !w->layouts[w->next].writes)
			w->next++;
		size_t r = w->next < w->nlayouts && !w->failed ? w->next++
							       : SIZE_MAX;
		pthread_mutex_unlock(&w->lock);
		if (r == SIZE_MAX)
			break;
		flow_diag_t diag = FLOW_DIAG_INIT;
		if (write_rank(th, &w->layouts[r], &diag) != FLOW_OK) {
			pthread_mutex_lock(&w->lock);
			/* The first failure is a real one: a thread stopped
			 * by another's comes after it. */
			if (!w->failed)
				w->diag = diag;
			w->failed = true;
			pthread_cond_broadcast(&w->freed);
			pthread_mutex_unlock(&w->lock);
			break;
		}
	}
	thread_release(th);
	return NULL;
}

/* Write every layout's file on nthreads threads. */
static flow_err_t write_ranks(reshard_work_t *w, int nthreads,
			      flow_diag_t *diag)
{
	reshard_thread_t th[RESHARD_THREADS_MAX];
	pthread_t tid[RESHARD_THREADS_MAX];
	int started = 0;
	flow_err_t err = FLOW_OK;
	memset(th, 0, sizeof th);
	for (int i = 0; i < nthreads; i++) {
		th[i].work = w;
		if (!(th[i].scratch = buffer_new(w->scap))) {
			err = flow_diag_set(diag, FLOW_ERR_NOMEM,
					    "out of memory for a %zu-byte read "
					    "buffer",
					    w->scap);
			goto out_free;
		}
	}
	/* The first thread is this one. */
	for (int i = 1; i < nthreads; i++) {
		if (pthread_create(&tid[i], NULL, reshard_thread_main,
				   &th[i]) != 0)
			break;
		started = i;
	}
	reshard_thread_main(&th[0]);
	for (int i = 1; i <= started; i++)
		pthread_join(tid[i], NULL);
	/* The failing thread always says why (write_rank sets its diag). */
	if (w->failed) {
		*diag = w->diag;
		err = w->diag.err;
	}
out_free:
	for (int i = 0; i < nthreads; i++)
		buffer_free(th[i].scratch, w->scap);
	return err;
}

/* ---- the whole ----------------------------------------------------------------- */

flow_err_t flow_train_ckpt_reshard(const flow_ckpt_t *ck, const char *ck_path,
				   const flow_plan_t *plan, const char *out,
				   const flow_train_reshard_options_t *opt,
				   flow_diag_t *diag)
{
	flow_train_reshard_options_t o = { 0 };
	if (opt)
		o = *opt;
	flow_train_ckpt_layout_t *layouts = NULL;
	size_t nlayouts = 0;
	flow_temp_dir_t *tmp = NULL;
	flow_err_t err;

	flow_train_ckpt_contents_t contents;
	if ((err = flow_train_ckpt_contents(ck, ck_path, &contents, diag)) !=
	    FLOW_OK)
		return err;

	int64_t world = flow_mesh_top_rank(&plan->mesh) + 1;
	layouts = calloc((size_t)world, sizeof *layouts);
	if (!layouts)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	for (; nlayouts < (size_t)world; nlayouts++)
		if ((err = flow_train_ckpt_layout(plan, (int64_t)nlayouts,
						  contents, &layouts[nlayouts],
						  diag)) != FLOW_OK)
			goto out_free;
	if ((err = match_model(ck, ck_path, plan, layouts, nlayouts, diag)) !=
	    FLOW_OK)
		goto out_free;

	/* The working set: the target shards being written (one alone up
	 * to the largest) and a read buffer per thread to stream the source
	 * shards through, which must hold a row of each tensor read. */
	size_t largest = 0, max_row = 1;
	const char *largest_name = "", *row_name = "";
	uint32_t writers = 0;
	for (size_t r = 0; r < nlayouts; r++) {
		writers += layouts[r].writes;
		for (size_t i = 0; i < layouts[r].nparts; i++) {
			const flow_train_ckpt_part_t *p = &layouts[r].parts[i];
			if (part_bytes(p) > largest) {
				largest = part_bytes(p);
				largest_name = p->desc.name;
			}
		}
	}
	for (size_t j = 0; j < flow_ckpt_tensor_count(ck); j++) {
		const flow_ckpt_tensor_desc_t *d = flow_ckpt_tensor_at(ck, j);
		if (flow_ckpt_row_bytes(d) > max_row) {
			max_row = flow_ckpt_row_bytes(d);
			row_name = d->name;
		}
	}
	uint64_t budget = o.max_memory ? o.max_memory : 2 * (uint64_t)largest;
	if (largest > budget) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "a shard of '%s' needs %zu bytes, more "
				    "than --max-memory %" PRIu64,
				    largest_name, largest, budget);
		goto out_free;
	}
	if (largest + max_row > budget) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "reading '%s' needs %zu bytes besides the "
				    "%zu-byte largest shard, more than "
				    "--max-memory %" PRIu64,
				    row_name, max_row, largest, budget);
		goto out_free;
	}
	/* As many threads as cores and writers allow while each keeps a
	 * read buffer of at least 1 MiB (or a row) beside the largest
	 * shard; the buffers share what the largest shard leaves. */
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	int nthreads = o.threads > 0 ? o.threads : (int)(cores > 0 ? cores : 1);
	if (nthreads > RESHARD_THREADS_MAX)
		nthreads = RESHARD_THREADS_MAX;
	if ((uint32_t)nthreads > writers)
		nthreads = writers ? (int)writers : 1;
	size_t min_scratch = max_row > ((size_t)1 << 20) ? max_row
							 : (size_t)1 << 20;
	uint64_t overhead = 0;
	for (;; nthreads--) {
		overhead = (uint64_t)(nthreads - 1) * RESHARD_THREAD_OVERHEAD;
		if (nthreads == 1 || largest + overhead +
					     (uint64_t)nthreads * min_scratch <=
				     budget)
			break;
	}
	uint64_t scap = (budget - largest - overhead) / (uint64_t)nthreads;
	if (scap > RESHARD_SCRATCH_MAX)
		scap = RESHARD_SCRATCH_MAX;

	reshard_work_t w = {
		.ck = ck,
		.layouts = layouts,
		.nlayouts = nlayouts,
		.scap = (size_t)scap,
		.parts_budget = budget - overhead - (uint64_t)nthreads * scap,
		.lock = PTHREAD_MUTEX_INITIALIZER,
		.freed = PTHREAD_COND_INITIALIZER,
		.diag = FLOW_DIAG_INIT,
	};
	if ((err = flow_temp_dir_create(out, &tmp, diag)) != FLOW_OK)
		goto out_free;
	w.dir = flow_temp_dir_path(tmp);
	flow_log(FLOW_LOG_INFO, "resharding onto %" PRId64 " ranks (%" PRIu32
		 " writers) on %d threads, %" PRIu64 " bytes at most",
		 world, writers, nthreads, budget);
	const flow_ckpt_kv_t *kv;
	size_t nkv = flow_ckpt_state(ck, &kv);
	if ((err = write_ranks(&w, nthreads, diag)) != FLOW_OK ||
	    (err = flow_ckpt_commit(w.dir, flow_ckpt_step(ck),
				    layouts[0].nwriters, kv, nkv, diag)) !=
		    FLOW_OK)
		goto out_free;
	flow_temp_dir_t *t = tmp;
	tmp = NULL;
	err = flow_temp_dir_commit(t, diag);
	if (err == FLOW_OK)
		flow_log(FLOW_LOG_INFO, "wrote '%s': step %" PRIu64
			 " for %" PRId64 " ranks of '%s'",
			 out, flow_ckpt_step(ck), world, plan->path);

out_free:
	flow_temp_dir_abort(tmp);
	for (size_t r = 0; r < nlayouts; r++)
		flow_train_ckpt_layout_release(&layouts[r]);
	free(layouts);
	return err;
}
