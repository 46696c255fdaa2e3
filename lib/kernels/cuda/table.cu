/* The CUDA kernel set as the executor calls it (flow/kernels.h,
 * flow_kernels_t): each kernel of kernels_cuda.h wrapped in a function of
 * the table's type that enqueues on the calling thread's stream and keeps
 * the first failure beside it, and last(), which waits for that stream and
 * returns the kept failure.  With them, the executor's storage over device
 * memory (flow_cuda_storage_*).
 *
 * The stream is cudaStreamPerThread: each host thread gets its own, so
 * ranks run as threads (tests) or several executors on several threads
 * never serialise on one stream, and no stream has to be created or
 * destroyed.  After a failure every later kernel of the thread is skipped
 * until last() reports it: what follows a failed kernel cannot be
 * trusted. */
#include <config.h>

#include <cmath>
#include <cstring>
#include <mutex>

#include <flow/caching_alloc.h>

#include "cuda_internal.h"

#define STREAM cudaStreamPerThread

namespace {

struct thread_state {
	flow_err_t err;    /* the first failure since last() */
	flow_diag_t diag;  /* its line */
	double *sum;       /* one device double for sum_squares */
	int sum_device;    /* the device sum lives on */
};

thread_local thread_state ts = { FLOW_OK, FLOW_DIAG_INIT, nullptr, -1 };

/* Keep the first failure of this thread. */
void keep(flow_err_t err, const flow_diag_t *diag)
{
	if (err != FLOW_OK && ts.err == FLOW_OK) {
		ts.err = err;
		ts.diag = *diag;
	}
}

/* Run one kernel call unless an earlier one failed. */
#define ENQUEUE(call)                                                       \
	do {                                                                \
		if (ts.err == FLOW_OK) {                                    \
			flow_diag_t diag_ = FLOW_DIAG_INIT;                 \
			flow_diag_t *diag = &diag_;                         \
			keep((call), diag);                                 \
		}                                                           \
	} while (0)

void matmul_forward(float *out, const float *inp, const float *weight,
		    const float *bias, size_t n, size_t in_dim, size_t out_dim)
{
	ENQUEUE(flow_cuda_matmul_forward(out, inp, weight, bias, n, in_dim,
					 out_dim, diag, STREAM));
}

void matmul_backward(float *dinp, float *dweight, float *dbias,
		     const float *dout, const float *inp, const float *weight,
		     size_t n, size_t in_dim, size_t out_dim)
{
	ENQUEUE(flow_cuda_matmul_backward(dinp, dweight, dbias, dout, inp,
					  weight, n, in_dim, out_dim, diag,
					  STREAM));
}

void embedding_forward(float *out, const int32_t *tokens, const float *wte,
		       const float *wpe, int64_t row0, size_t rows, size_t B,
		       size_t T, size_t C)
{
	ENQUEUE(flow_cuda_embedding_forward(out, tokens, wte, wpe, row0, rows,
					    B, T, C, diag, STREAM));
}

void embedding_backward(float *dwte, float *dwpe, const float *dout,
			const int32_t *tokens, int64_t row0, size_t rows,
			size_t B, size_t T, size_t C)
{
	ENQUEUE(flow_cuda_embedding_backward(dwte, dwpe, dout, tokens, row0,
					     rows, B, T, C, diag, STREAM));
}

void matmul_gelu_forward(float *pre, float *out, const float *inp,
			 const float *weight, const float *bias, size_t n,
			 size_t in_dim, size_t out_dim)
{
	ENQUEUE(flow_cuda_matmul_gelu_forward(pre, out, inp, weight, bias, n,
					      in_dim, out_dim, diag, STREAM));
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
		       const float *weight, const float *bias, size_t n,
		       size_t C)
{
	ENQUEUE(flow_cuda_layernorm_forward(out, mean, rstd, inp, weight, bias,
					    n, C, diag, STREAM));
}

void layernorm_backward(float *dinp, float *dweight, float *dbias,
			const float *dout, const float *inp,
			const float *weight, const float *mean,
			const float *rstd, size_t n, size_t C)
{
	ENQUEUE(flow_cuda_layernorm_backward(dinp, dweight, dbias, dout, inp,
					     weight, mean, rstd, n, C, diag,
					     STREAM));
}

void gelu_forward(float *out, const float *inp, size_t n)
{
	ENQUEUE(flow_cuda_gelu_forward(out, inp, n, diag, STREAM));
}

void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
	ENQUEUE(flow_cuda_gelu_backward(dinp, inp, dout, n, diag, STREAM));
}

void attention_forward(float *out, float *lse, void *scratch,
		       const float *qkv, size_t B, size_t T, size_t C,
		       size_t NH)
{
	ENQUEUE(flow_cuda_attention_forward(out, lse, scratch, qkv, B, T, C,
					    NH, diag, STREAM));
}

void attention_backward(float *dqkv, void *scratch, const float *dout,
			const float *qkv, const float *lse, const float *out,
			size_t B, size_t T, size_t C, size_t NH)
{
	ENQUEUE(flow_cuda_attention_backward(dqkv, scratch, dout, qkv, lse,
					     out, B, T, C, NH, diag, STREAM));
}

void residual_forward(float *out, const float *a, const float *b, size_t n)
{
	ENQUEUE(flow_cuda_residual_forward(out, a, b, n, diag, STREAM));
}

void residual_layernorm_forward(float *res, float *out, float *mean,
				float *rstd, const float *a, const float *b,
				const float *weight, const float *bias,
				size_t n, size_t C)
{
	ENQUEUE(flow_cuda_residual_layernorm_forward(res, out, mean, rstd, a,
						     b, weight, bias, n, C,
						     diag, STREAM));
}

void layernorm_residual_backward(float *dres, float *da, float *db,
				 float *dweight, float *dbias,
				 const float *dout, const float *res,
				 const float *weight, const float *mean,
				 const float *rstd, size_t n, size_t C)
{
	ENQUEUE(flow_cuda_layernorm_residual_backward(
		dres, da, db, dweight, dbias, dout, res, weight, mean, rstd, n,
		C, diag, STREAM));
}

void residual_backward(float *da, float *db, const float *dout, size_t n)
{
	ENQUEUE(flow_cuda_residual_backward(da, db, dout, n, diag, STREAM));
}

void cross_entropy_forward_backward(float *losses, float *logits,
				    const int32_t *targets, size_t n, size_t V,
				    size_t Vp, float dloss)
{
	ENQUEUE(flow_cuda_cross_entropy_forward_backward(
		losses, logits, targets, n, V, Vp, dloss, diag, STREAM));
}

void cross_entropy_split_max(float *max, const float *logits,
			     const flow_logits_shard_t *s)
{
	ENQUEUE(flow_cuda_cross_entropy_split_max(max, logits, s, diag,
						  STREAM));
}

void cross_entropy_split_sums(float *sums, float *max, const float *gathered,
			      size_t p, const float *logits,
			      const flow_logits_shard_t *s)
{
	ENQUEUE(flow_cuda_cross_entropy_split_sums(sums, max, gathered, p,
						   logits, s, diag, STREAM));
}

void cross_entropy_split_finish(float *losses, float *logits,
				const int32_t *targets, const float *max,
				const float *sums, const flow_logits_shard_t *s,
				float dloss)
{
	ENQUEUE(flow_cuda_cross_entropy_split_finish(losses, logits, targets,
						     max, sums, s, dloss, diag,
						     STREAM));
}

/* ---- the bf16 twins ---- */

void matmul_bf16_forward(flow_bf16_t *out, void *scratch,
			 const flow_bf16_t *inp, const float *weight,
			 const float *bias, size_t n, size_t in_dim,
			 size_t out_dim)
{
	ENQUEUE(flow_cuda_matmul_bf16_forward(out, scratch, inp, weight, bias,
					      n, in_dim, out_dim, diag,
					      STREAM));
}

void matmul_bf16_backward(flow_bf16_t *dinp, float *dweight, float *dbias,
			  void *scratch, const flow_bf16_t *dout,
			  const flow_bf16_t *inp, const float *weight,
			  size_t n, size_t in_dim, size_t out_dim)
{
	ENQUEUE(flow_cuda_matmul_bf16_backward(dinp, dweight, dbias, scratch,
					       dout, inp, weight, n, in_dim,
					       out_dim, diag, STREAM));
}

void matmul_gelu_bf16_forward(flow_bf16_t *pre, flow_bf16_t *out,
			      void *scratch, const flow_bf16_t *inp,
			      const float *weight, const float *bias, size_t n,
			      size_t in_dim, size_t out_dim)
{
	ENQUEUE(flow_cuda_matmul_gelu_bf16_forward(pre, out, scratch, inp,
						   weight, bias, n, in_dim,
						   out_dim, diag, STREAM));
}

void layernorm_bf16_forward(flow_bf16_t *out, float *mean, float *rstd,
			    const float *inp, const float *weight,
			    const float *bias, size_t n, size_t C)
{
	ENQUEUE(flow_cuda_layernorm_bf16_forward(out, mean, rstd, inp, weight,
						 bias, n, C, diag, STREAM));
}

void layernorm_bf16_backward(float *dinp, float *dweight, float *dbias,
			     const flow_bf16_t *dout, const float *inp,
			     const float *weight, const float *mean,
			     const float *rstd, size_t n, size_t C)
{
	ENQUEUE(flow_cuda_layernorm_bf16_backward(dinp, dweight, dbias, dout,
						  inp, weight, mean, rstd, n,
						  C, diag, STREAM));
}

void gelu_bf16_forward(flow_bf16_t *out, const flow_bf16_t *inp, size_t n)
{
	ENQUEUE(flow_cuda_gelu_bf16_forward(out, inp, n, diag, STREAM));
}

void gelu_bf16_backward(flow_bf16_t *dinp, const flow_bf16_t *inp,
			const flow_bf16_t *dout, size_t n)
{
	ENQUEUE(flow_cuda_gelu_bf16_backward(dinp, inp, dout, n, diag,
					     STREAM));
}

void residual_bf16_forward(float *out, const float *a, const flow_bf16_t *b,
			   size_t n)
{
	ENQUEUE(flow_cuda_residual_bf16_forward(out, a, b, n, diag, STREAM));
}

void residual_bf16_backward(float *da, flow_bf16_t *db, const float *dout,
			    size_t n)
{
	ENQUEUE(flow_cuda_residual_bf16_backward(da, db, dout, n, diag,
						 STREAM));
}

void residual_layernorm_bf16_forward(float *res, flow_bf16_t *out,
				     float *mean, float *rstd, const float *a,
				     const flow_bf16_t *b, const float *weight,
				     const float *bias, size_t n, size_t C)
{
	ENQUEUE(flow_cuda_residual_layernorm_bf16_forward(
		res, out, mean, rstd, a, b, weight, bias, n, C, diag, STREAM));
}

void layernorm_residual_bf16_backward(float *dres, float *da, flow_bf16_t *db,
				      float *dweight, float *dbias,
				      const flow_bf16_t *dout,
				      const float *res, const float *weight,
				      const float *mean, const float *rstd,
				      size_t n, size_t C)
{
	ENQUEUE(flow_cuda_layernorm_residual_bf16_backward(
		dres, da, db, dweight, dbias, dout, res, weight, mean, rstd, n,
		C, diag, STREAM));
}

void attention_bf16_forward(flow_bf16_t *out, float *lse, void *scratch,
			    const flow_bf16_t *qkv, size_t B, size_t T,
			    size_t C, size_t NH)
{
	ENQUEUE(flow_cuda_attention_bf16_forward(out, lse, scratch, qkv, B, T,
						 C, NH, diag, STREAM));
}

void attention_bf16_backward(flow_bf16_t *dqkv, void *scratch,
			     const flow_bf16_t *dout, const flow_bf16_t *qkv,
			     const float *lse, const flow_bf16_t *out,
			     size_t B, size_t T, size_t C, size_t NH)
{
	ENQUEUE(flow_cuda_attention_bf16_backward(dqkv, scratch, dout, qkv,
						  lse, out, B, T, C, NH, diag,
						  STREAM));
}

void cross_entropy_bf16_forward_backward(float *losses, flow_bf16_t *logits,
					 const int32_t *targets, size_t n,
					 size_t V, size_t Vp, float dloss)
{
	ENQUEUE(flow_cuda_cross_entropy_bf16_forward_backward(
		losses, logits, targets, n, V, Vp, dloss, diag, STREAM));
}

void cross_entropy_bf16_split_max(float *max, const flow_bf16_t *logits,
				  const flow_logits_shard_t *s)
{
	ENQUEUE(flow_cuda_cross_entropy_bf16_split_max(max, logits, s, diag,
						       STREAM));
}

void cross_entropy_bf16_split_sums(float *sums, float *max,
				   const float *gathered, size_t p,
				   const flow_bf16_t *logits,
				   const flow_logits_shard_t *s)
{
	ENQUEUE(flow_cuda_cross_entropy_bf16_split_sums(sums, max, gathered, p,
							logits, s, diag,
							STREAM));
}

void cross_entropy_bf16_split_finish(float *losses, flow_bf16_t *logits,
				     const int32_t *targets, const float *max,
				     const float *sums,
				     const flow_logits_shard_t *s, float dloss)
{
	ENQUEUE(flow_cuda_cross_entropy_bf16_split_finish(
		losses, logits, targets, max, sums, s, dloss, diag, STREAM));
}

void box_move(flow_dtype_t dtype, const void *src, const flow_box_t *src_box,
	      void *dst, const flow_box_t *dst_box, const flow_box_t *region,
	      bool add)
{
	ENQUEUE(flow_cuda_box_move(dtype, src, src_box, dst, dst_box, region,
				   add, diag, STREAM));
}

void adamw_update(float *param, const float *grad, float *m, float *v,
		  size_t n, const flow_adamw_params_t *hp, uint64_t t,
		  bool decay)
{
	ENQUEUE(flow_cuda_adamw_update(param, grad, m, v, n, hp, t, decay,
				       diag, STREAM));
}

void adamw_update_all(float *const *params, const float *const *grads,
		      float *const *m, float *const *v, const size_t *counts,
		      const bool *decay, size_t ntensors,
		      const flow_adamw_params_t *hp, uint64_t t)
{
	ENQUEUE(flow_cuda_adamw_update_all(params, grads, m, v, counts, decay,
					   ntensors, hp, t, diag, STREAM));
}

/* The table's sum_squares returns its value, so this one waits: a
 * measurement, not a step of the training loop. */
double sum_squares(const float *x, size_t n)
{
	double sum = NAN;
	int device = -1;
	if (ts.err != FLOW_OK)
		return sum;
	flow_diag_t diag_ = FLOW_DIAG_INIT;
	flow_diag_t *diag = &diag_;
	flow_err_t err = FLOW_OK;
	FLOW_CUDA_TRY(cudaGetDevice(&device), out);
	if (ts.sum && ts.sum_device != device) {
		/* A thread that moved to another device. */
		(void)cudaFree(ts.sum);
		ts.sum = nullptr;
	}
	if (!ts.sum) {
		FLOW_CUDA_TRY(cudaMalloc(&ts.sum, sizeof(double)), out);
		ts.sum_device = device;
	}
	FLOW_TRY(flow_cuda_sum_squares(x, n, ts.sum, diag, STREAM), out);
	FLOW_CUDA_TRY(cudaMemcpyAsync(&sum, ts.sum, sizeof sum,
				      cudaMemcpyDeviceToHost, STREAM),
		      out);
	FLOW_CUDA_TRY(cudaStreamSynchronize(STREAM), out);
out:
	keep(err, diag);
	return err == FLOW_OK ? sum : NAN;
}

void scale(float *x, size_t n, float s)
{
	ENQUEUE(flow_cuda_scale(x, n, s, diag, STREAM));
}

/* Waits for the norm (the trainer reports it every step). */
float clip_grad_norm(float *const *grads, const size_t *counts,
		     size_t ntensors, float max_norm)
{
	float norm = NAN;
	ENQUEUE(flow_cuda_clip_grad_norm(grads, counts, ntensors, max_norm,
					 &norm, diag, STREAM));
	return norm;
}

flow_err_t last(flow_diag_t *diag)
{
	flow_diag_t mine = FLOW_DIAG_INIT;
	cudaError_t e = cudaStreamSynchronize(STREAM);
	if (e != cudaSuccess)
		keep(flow_cuda__fail(&mine, e, "cudaStreamSynchronize",
				     __FILE__, __LINE__),
		     &mine);
	flow_err_t err = ts.err;
	if (err != FLOW_OK)
		flow_diag_set(diag, err, "%s", flow_diag_message(&ts.diag));
	ts.err = FLOW_OK;
	ts.diag = FLOW_DIAG_INIT;
	return err;
}

} // namespace

void flow_cuda_table_gemm(bool trans_a, bool trans_b, size_t m, size_t n,
			  size_t k, const float *a, const float *b, float beta,
			  float *c)
{
	ENQUEUE(flow_cuda_gemm(trans_a, trans_b, m, n, k, a, b, beta, c, diag,
			       STREAM));
}

extern "C" const flow_kernels_t flow_cuda_kernels = {
	"cuda",
	matmul_forward,
	matmul_backward,
	embedding_forward,
	embedding_backward,
	layernorm_forward,
	layernorm_backward,
	gelu_forward,
	gelu_backward,
	matmul_gelu_forward,
	attention_forward,
	flow_cuda_attention_scratch_bound,
	attention_backward,
	residual_forward,
	residual_backward,
	residual_layernorm_forward,
	layernorm_residual_backward,
	cross_entropy_forward_backward,
	cross_entropy_split_max,
	cross_entropy_split_sums,
	cross_entropy_split_finish,
	flow_cuda_matmul_bf16_scratch_bound,
	matmul_bf16_forward,
	matmul_bf16_backward,
	matmul_gelu_bf16_forward,
	layernorm_bf16_forward,
	layernorm_bf16_backward,
	gelu_bf16_forward,
	gelu_bf16_backward,
	residual_bf16_forward,
	residual_bf16_backward,
	residual_layernorm_bf16_forward,
	layernorm_residual_bf16_backward,
	attention_bf16_forward,
	attention_bf16_backward,
	cross_entropy_bf16_forward_backward,
	cross_entropy_bf16_split_max,
	cross_entropy_bf16_split_sums,
	cross_entropy_bf16_split_finish,
	box_move,
	adamw_update,
	adamw_update_all,
	sum_squares,
	scale,
	clip_grad_norm,
	last,
};

/* ---- the executor's storage ------------------------------------------------ */
/* Device memory comes from one caching allocator per device
 * (flow/caching_alloc.h) over cudaMalloc: an executor allocates all its
 * buffers when it is made, and a later one (a resumed run, an evaluation
 * model, a test) reuses them without cudaMalloc's synchronisation.  The
 * allocators are shared by the threads of the process, under one lock. */

namespace {

std::mutex alloc_lock;
flow_caching_alloc_t *allocs[FLOW_CUDA_MAX_DEVICES];

flow_err_t backend_alloc(void *ctx, size_t bytes, void **ptr_out,
			 flow_diag_t *diag)
{
	(void)ctx;
	cudaError_t e = cudaMalloc(ptr_out, bytes);
	if (e == cudaErrorMemoryAllocation) {
		(void)cudaGetLastError(); /* not sticky; clear it */
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "cudaMalloc: %s",
				     cudaGetErrorString(e));
	}
	if (e != cudaSuccess)
		return flow_cuda__fail(diag, e, "cudaMalloc", __FILE__, __LINE__);
	return FLOW_OK;
}

void backend_free(void *ctx, void *ptr)
{
	(void)ctx;
	(void)cudaFree(ptr);
}

const flow_alloc_backend_t backend = { "cuda", nullptr, backend_alloc,
				       backend_free };

/* The current device's allocator, made on first use; under alloc_lock. */
flow_caching_alloc_t *device_alloc(flow_diag_t *diag)
{
	int dev = -1;
	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 ||
	    dev >= FLOW_CUDA_MAX_DEVICES)
		return nullptr;
	if (!allocs[dev] &&
	    flow_caching_alloc_new(&backend, &allocs[dev], diag) != FLOW_OK)
		return nullptr;
	return allocs[dev];
}

} // namespace

void *flow_cuda_storage_alloc(size_t bytes)
{
	void *p = nullptr;
	flow_diag_t diag_ = FLOW_DIAG_INIT;
	flow_diag_t *diag = &diag_;
	flow_caching_alloc_t *a = nullptr;
	{
		std::lock_guard<std::mutex> hold(alloc_lock);
		a = device_alloc(diag);
		if (!a ||
		    flow_caching_alloc_malloc(a, bytes, &p, diag) != FLOW_OK)
			return nullptr;
	}
	/* Zeroed, as the storage contract says, and waited for: a plain
	 * cudaMemset may return before it is done and orders only the
	 * blocking streams after it, not NCCL's non-blocking one, which may
	 * write the memory first (a ZeRO landing buffer).  Outside the lock:
	 * this thread's queue may wait on a collective whose other ranks
	 * (threads) are allocating. */
	if (bytes && (cudaMemsetAsync(p, 0, bytes, STREAM) != cudaSuccess ||
		      cudaStreamSynchronize(STREAM) != cudaSuccess)) {
		std::lock_guard<std::mutex> hold(alloc_lock);
		flow_caching_alloc_release(a, p);
		return nullptr;
	}
	return p;
}

void flow_cuda_storage_free(void *ptr)
{
	if (!ptr)
		return;
	/* Kernels of this thread may still use it; once they are done it
	 * goes back to the cache, not to the driver. */
	(void)cudaStreamSynchronize(STREAM);
	std::lock_guard<std::mutex> hold(alloc_lock);
	flow_caching_alloc_t *a = device_alloc(nullptr);
	if (a)
		flow_caching_alloc_release(a, ptr);
}

flow_err_t flow_cuda_storage_stats(int device, flow_alloc_stats_t *stats_out,
				   flow_diag_t *diag)
{
	if (device < 0 || device >= FLOW_CUDA_MAX_DEVICES)
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "CUDA device %d is beyond the %d devices "
				     "libflow supports",
				     device, FLOW_CUDA_MAX_DEVICES);
	std::lock_guard<std::mutex> hold(alloc_lock);
	if (allocs[device])
		flow_caching_alloc_stats(allocs[device], stats_out);
	else
		std::memset(stats_out, 0, sizeof *stats_out);
	return FLOW_OK;
}

void *flow_cuda_storage_host_alloc(size_t bytes)
{
	void *p = nullptr;
	/* Page-locked: copies from and to it need no staging of the driver's. */
	if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
		(void)cudaGetLastError();
		return nullptr;
	}
	return p;
}

void flow_cuda_storage_host_free(void *ptr)
{
	if (ptr) {
		/* A copy in flight may still read it. */
		(void)cudaStreamSynchronize(STREAM);
		(void)cudaFreeHost(ptr);
	}
}

void *flow_cuda_storage_event_new(void)
{
	cudaEvent_t e = nullptr;
	/* No timing: the cheapest kind to record and wait for. */
	if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
		(void)cudaGetLastError();
		return nullptr;
	}
	return (void *)e;
}

void flow_cuda_storage_event_record(void *event)
{
	ENQUEUE(flow_cuda__event_record((cudaEvent_t)event, diag, STREAM));
}

void flow_cuda_storage_event_wait(void *event)
{
	/* A failure here is the stream's: last() reports it on the thread
	 * that enqueued the work. */
	(void)cudaEventSynchronize((cudaEvent_t)event);
}

void flow_cuda_storage_event_free(void *event)
{
	if (event)
		(void)cudaEventDestroy((cudaEvent_t)event);
}

void flow_cuda_storage_zero(void *ptr, size_t bytes)
{
	ENQUEUE(flow_cuda_zero(ptr, bytes, diag, STREAM));
}

void flow_cuda_storage_copy_in(void *dst, const void *src, size_t bytes)
{
	flow_err_t err = FLOW_OK;
	flow_diag_t diag_ = FLOW_DIAG_INIT;
	flow_diag_t *diag = &diag_;
	if (ts.err != FLOW_OK || bytes == 0)
		return;
	/* From pageable memory the copy has left src when this returns. */
	FLOW_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
				      STREAM),
		      out);
out:
	keep(err, diag);
}

void flow_cuda__table_release_thread(void)
{
	if (ts.sum && cudaSetDevice(ts.sum_device) == cudaSuccess)
		(void)cudaFree(ts.sum); /* synchronises: it is done with */
	ts.sum = nullptr;
	ts.sum_device = -1;
}

void flow_cuda_storage_copy_in_ahead(void *dst, const void *src, size_t bytes,
				     void *after, void *done)
{
	flow_err_t err = FLOW_OK;
	flow_diag_t diag_ = FLOW_DIAG_INIT;
	flow_diag_t *diag = &diag_;
	cudaStream_t copies = nullptr;
	if (ts.err != FLOW_OK)
		return;
	FLOW_TRY(flow_cuda__copy_stream(&copies, diag), out);
	if (after)
		FLOW_CUDA_TRY(cudaStreamWaitEvent(copies, (cudaEvent_t)after, 0),
			      out);
	if (bytes)
		FLOW_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes,
					      cudaMemcpyHostToDevice, copies),
			      out);
	if (done)
		FLOW_TRY(flow_cuda__event_record((cudaEvent_t)done, diag,
						 copies),
			 out);
out:
	keep(err, diag);
}

void flow_cuda_storage_kernels_wait(void *event)
{
	flow_err_t err = FLOW_OK;
	flow_diag_t diag_ = FLOW_DIAG_INIT;
	flow_diag_t *diag = &diag_;
	if (ts.err != FLOW_OK)
		return;
	FLOW_CUDA_TRY(cudaStreamWaitEvent(STREAM, (cudaEvent_t)event, 0), out);
out:
	keep(err, diag);
}

void flow_cuda_storage_copy(void *dst, const void *src, size_t bytes)
{
	flow_err_t err = FLOW_OK;
	flow_diag_t diag_ = FLOW_DIAG_INIT;
	flow_diag_t *diag = &diag_;
	if (ts.err != FLOW_OK || bytes == 0)
		return;
	FLOW_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
				      STREAM),
		      out);
out:
	keep(err, diag);
}

void flow_cuda_storage_copy_out(void *dst, const void *src, size_t bytes)
{
	flow_err_t err = FLOW_OK;
	flow_diag_t diag_ = FLOW_DIAG_INIT;
	flow_diag_t *diag = &diag_;
	if (ts.err != FLOW_OK || bytes == 0)
		return;
	FLOW_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
				      STREAM),
		      out);
	FLOW_CUDA_TRY(cudaStreamSynchronize(STREAM), out);
out:
	keep(err, diag);
}
