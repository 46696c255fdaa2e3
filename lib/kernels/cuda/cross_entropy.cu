/* Fused softmax cross-entropy on the GPU: loss per row and, in place, the
 * gradient of dloss * loss with respect to the logits.  Mirrors
 * cpu/cross_entropy.c.
 *
 * One block per row: a block-wide max, then a block-wide sum of exp(x - max)
 * (per-thread strided partial sums in double, combined by flow_block_sum
 * in a fixed order), then every element is rewritten as
 * dloss * (p - onehot).  The row is read three times; at 50304 padded
 * columns it is 200 KB, which the second and third passes find in L2.
 *
 * Over a column shard of the logits (flow/kernels.h, the three split
 * steps) each step is one block per row as well; the exponentials are
 * taken in double there, as the CPU set takes them, since the sums of
 * several ranks' columns are compared with a whole row's.
 *
 * The bf16 twins are the same kernels over bf16 logits (a template over
 * their element type): each logit widened where it is read, each
 * gradient rounded once where it is written over it. */
#include <config.h>

#include "cuda_internal.h"

#define CE_THREADS 512

template <typename T>
static __global__ void cross_entropy_kernel(float *__restrict__ losses,
					    T *__restrict__ logits,
					    const int32_t *__restrict__ targets,
					    size_t V, size_t Vp, float dloss)
{
	__shared__ float shared[32];
	__shared__ double dshared[32];
	const size_t r = blockIdx.x;
	T *x = logits + r * Vp;
	const int32_t tgt = targets[r];

	if (tgt < 0 || (size_t)tgt >= V) {
		/* Ignored row (negative target; out-of-range ones too, rather
		 * than read outside the row): loss 0, gradient 0. */
		for (size_t j = threadIdx.x; j < Vp; j += blockDim.x)
			flow_store(&x[j], 0.0f);
		if (threadIdx.x == 0 && losses)
			losses[r] = 0.0f;
		return;
	}
	/* read before any thread overwrites it */
	const float xt = flow_load(&x[tgt]);
	float mx = -INFINITY;
	for (size_t j = threadIdx.x; j < V; j += blockDim.x)
		mx = fmaxf(mx, flow_load(&x[j]));
	mx = flow_block_max(mx, shared);
	/* exp(x - max) summed in double, as the CPU reference: a float sum
	 * of ~50k terms drifts by ~1e-5 relative. */
	double sum = 0.0;
	for (size_t j = threadIdx.x; j < V; j += blockDim.x)
		sum += (double)expf(flow_load(&x[j]) - mx);
	sum = flow_block_sum(sum, dshared); /* ends with every xt read */
	const float inv = (float)(1.0 / sum);
	for (size_t j = threadIdx.x; j < Vp; j += blockDim.x) {
		float g = 0.0f;
		if (j < V) {
			const float p = expf(flow_load(&x[j]) - mx) * inv;
			g = j == (size_t)tgt ? dloss * (p - 1.0f) : dloss * p;
		}
		flow_store(&x[j], g);
	}
	if (threadIdx.x == 0 && losses)
		losses[r] = (float)(log(sum) - ((double)xt - (double)mx));
}

/* ---- over a column shard ---------------------------------------------------- */

template <typename T>
static __global__ void ce_split_max_kernel(float *__restrict__ max,
					   const T *__restrict__ logits,
					   size_t cols, size_t valid)
{
	__shared__ float shared[32];
	const T *x = logits + (size_t)blockIdx.x * cols;
	float m = -INFINITY;
	for (size_t j = threadIdx.x; j < valid; j += blockDim.x)
		m = fmaxf(m, flow_load(&x[j]));
	m = flow_block_max(m, shared);
	if (threadIdx.x == 0)
		max[blockIdx.x] = m;
}

template <typename T>
static __global__ void ce_split_sums_kernel(float *__restrict__ sums,
					    float *__restrict__ max,
					    const float *__restrict__ gathered,
					    size_t p,
					    const T *__restrict__ logits,
					    size_t n, size_t cols, size_t valid)
{
	__shared__ double dshared[32];
	const size_t r = blockIdx.x;
	const T *x = logits + r * cols;
	float m = gathered[r];
	for (size_t q = 1; q < p; q++)
		m = fmaxf(m, gathered[q * n + r]);
	double sum = 0.0;
	for (size_t j = threadIdx.x; j < valid; j += blockDim.x)
		sum += exp((double)flow_load(&x[j]) - (double)m);
	sum = flow_block_sum(sum, dshared);
	if (threadIdx.x == 0) {
		max[r] = m;
		sums[r] = (float)sum;
	}
}

template <typename T>
static __global__ void ce_split_finish_kernel(
	float *__restrict__ losses, T *__restrict__ logits,
	const int32_t *__restrict__ targets, const float *__restrict__ max,
	const float *__restrict__ sums, size_t cols, size_t valid, int64_t c0,
	bool first, float dloss)
{
	const size_t r = blockIdx.x;
	T *x = logits + r * cols;
	const int32_t tgt = targets[r];
	const int64_t t = (int64_t)tgt - c0;
	const bool counted = tgt >= 0;
	const bool held = counted && t >= 0 && t < (int64_t)valid;
	const double m = max[r], sum = sums[r];
	if (threadIdx.x == 0) {
		/* The target's logit, read before any thread overwrites it:
		 * thread 0 writes only column 0 below, after this. */
		double loss = first && counted ? log(sum) + m : 0.0;
		if (held)
			loss -= flow_load(&x[t]);
		losses[r] = (float)loss;
	}
	__syncthreads();
	for (size_t j = threadIdx.x; j < cols; j += blockDim.x) {
		float pj = j < valid && counted ?
				   (float)(exp((double)flow_load(&x[j]) - m) /
					   sum) :
				   0.0f;
		if (held && (int64_t)j == t)
			pj -= 1.0f;
		flow_store(&x[j], dloss * pj);
	}
}

template <typename T>
static flow_err_t cross_entropy(float *losses, T *logits,
				const int32_t *targets, size_t n, size_t V,
				size_t Vp, float dloss, const char *func,
				flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;

	if (n == 0)
		return FLOW_OK;
	if (V > Vp) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "vocabulary V = %zu of '%s' exceeds the "
				    "padded row Vp = %zu",
				    V, func, Vp);
		goto out;
	}
	FLOW_TRY(flow_cuda__check_size(diag, func, "n", n, INT_MAX), out);
	cross_entropy_kernel<<<(unsigned)n, CE_THREADS, 0, stream>>>(
		losses, logits, targets, V, Vp, dloss);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

template <typename T>
static flow_err_t split_max(float *max, const T *logits,
			    const flow_logits_shard_t *s, const char *func,
			    flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;

	if (s->n == 0)
		return FLOW_OK;
	FLOW_TRY(flow_cuda__check_size(diag, func, "n", s->n, INT_MAX), out);
	ce_split_max_kernel<<<(unsigned)s->n, CE_THREADS, 0, stream>>>(
		max, logits, s->cols, s->valid);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

template <typename T>
static flow_err_t split_sums(float *sums, float *max, const float *gathered,
			     size_t p, const T *logits,
			     const flow_logits_shard_t *s, const char *func,
			     flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;

	if (s->n == 0)
		return FLOW_OK;
	FLOW_TRY(flow_cuda__check_size(diag, func, "n", s->n, INT_MAX), out);
	ce_split_sums_kernel<<<(unsigned)s->n, CE_THREADS, 0, stream>>>(
		sums, max, gathered, p, logits, s->n, s->cols, s->valid);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

template <typename T>
static flow_err_t split_finish(float *losses, T *logits,
			       const int32_t *targets, const float *max,
			       const float *sums, const flow_logits_shard_t *s,
			       float dloss, const char *func,
			       flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;

	if (s->n == 0)
		return FLOW_OK;
	FLOW_TRY(flow_cuda__check_size(diag, func, "n", s->n, INT_MAX), out);
	ce_split_finish_kernel<<<(unsigned)s->n, CE_THREADS, 0, stream>>>(
		losses, logits, targets, max, sums, s->cols, s->valid, s->c0,
		s->first, dloss);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

flow_err_t flow_cuda_cross_entropy_forward_backward(
	float *losses, float *logits, const int32_t *targets, size_t n,
	size_t V, size_t Vp, float dloss, flow_diag_t *diag,
	cudaStream_t stream)
{
	return cross_entropy(losses, logits, targets, n, V, Vp, dloss,
			     __func__, diag, stream);
}

flow_err_t flow_cuda_cross_entropy_bf16_forward_backward(
	float *losses, flow_bf16_t *logits, const int32_t *targets, size_t n,
	size_t V, size_t Vp, float dloss, flow_diag_t *diag,
	cudaStream_t stream)
{
	return cross_entropy(losses, flow_cuda__bf16(logits), targets, n, V, Vp,
			     dloss, __func__, diag, stream);
}

flow_err_t flow_cuda_cross_entropy_split_max(float *max, const float *logits,
					     const flow_logits_shard_t *s,
					     flow_diag_t *diag,
					     cudaStream_t stream)
{
	return split_max(max, logits, s, __func__, diag, stream);
}

flow_err_t flow_cuda_cross_entropy_bf16_split_max(
	float *max, const flow_bf16_t *logits, const flow_logits_shard_t *s,
	flow_diag_t *diag, cudaStream_t stream)
{
	return split_max(max, flow_cuda__bf16(logits), s, __func__, diag,
			 stream);
}

flow_err_t flow_cuda_cross_entropy_split_sums(float *sums, float *max,
					      const float *gathered, size_t p,
					      const float *logits,
					      const flow_logits_shard_t *s,
					      flow_diag_t *diag,
					      cudaStream_t stream)
{
	return split_sums(sums, max, gathered, p, logits, s, __func__, diag,
			  stream);
}

flow_err_t flow_cuda_cross_entropy_bf16_split_sums(
	float *sums, float *max, const float *gathered, size_t p,
	const flow_bf16_t *logits, const flow_logits_shard_t *s,
	flow_diag_t *diag, cudaStream_t stream)
{
	return split_sums(sums, max, gathered, p, flow_cuda__bf16(logits), s,
			  __func__, diag, stream);
}

flow_err_t flow_cuda_cross_entropy_split_finish(
	float *losses, float *logits, const int32_t *targets, const float *max,
	const float *sums, const flow_logits_shard_t *s, float dloss,
	flow_diag_t *diag, cudaStream_t stream)
{
	return split_finish(losses, logits, targets, max, sums, s, dloss,
			    __func__, diag, stream);
}

flow_err_t flow_cuda_cross_entropy_bf16_split_finish(
	float *losses, flow_bf16_t *logits, const int32_t *targets,
	const float *max, const float *sums, const flow_logits_shard_t *s,
	float dloss, flow_diag_t *diag, cudaStream_t stream)
{
	return split_finish(losses, flow_cuda__bf16(logits), targets, max, sums,
			    s, dloss, __func__, diag, stream);
}
