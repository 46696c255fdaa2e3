/* matmul on the GPU: out[n,o] = inp[n,i] . weight[o,i]^T + bias[o] through
 * cuBLAS sgemm, its backward through cuBLAS with beta = 1 (accumulating), and
 * a deterministic column reduction for dbias.  Mirrors cpu/matmul.c.
 *
 * cuBLAS is column-major: a row-major (r x c) matrix with row stride ld is the
 * column-major (c x r) matrix with leading dimension ld, its transpose.  So
 * every row-major product P = X . Y is issued as P^T = Y^T . X^T. */
#include <config.h>

#include "cuda_internal.h"

/* out[r, c] += bias[c] over n rows of out_dim columns. */
static __global__ void add_bias_kernel(float *__restrict__ out,
				       const float *__restrict__ bias,
				       size_t n, size_t out_dim)
{
	const size_t total = n * out_dim;
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += stride)
		out[i] += bias[i % out_dim];
}

/* Rows of each block column pass in dbias_kernel: block (32, ROWS). */
#define DBIAS_ROWS 32

/* dbias[c] += sum over r of dout[r, c].  Block (32, DBIAS_ROWS) owns 32
 * consecutive columns (one per lane, so each warp reads 128 contiguous bytes
 * of a row); thread y sums rows y, y + DBIAS_ROWS, ... in increasing order,
 * then the DBIAS_ROWS partial sums are added in y order.  The partition
 * depends only on n, so the result is deterministic. */
static __global__ void column_sum_kernel(float *__restrict__ dbias,
					 const float *__restrict__ dout,
					 size_t n, size_t out_dim)
{
	__shared__ float part[DBIAS_ROWS][33];
	const size_t c = (size_t)blockIdx.x * 32 + threadIdx.x;
	float acc = 0.0f;
	if (c < out_dim)
		for (size_t r = threadIdx.y; r < n; r += DBIAS_ROWS)
			acc += dout[r * out_dim + c];
	part[threadIdx.y][threadIdx.x] = acc;
	__syncthreads();
	if (threadIdx.y == 0 && c < out_dim) {
		float sum = 0.0f;
		for (int y = 0; y < DBIAS_ROWS; y++)
			sum += part[y][threadIdx.x];
		dbias[c] += sum;
	}
}

/* Every size must fit the int that cublasSgemm takes; func names the caller
 * in diag. */
static flow_err_t matmul_check(size_t n, size_t in_dim, size_t out_dim,
			       const char *func, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;

	FLOW_TRY(flow_cuda__check_size(diag, func, "n", n, INT_MAX), out);
	FLOW_TRY(flow_cuda__check_size(diag, func, "in_dim", in_dim, INT_MAX),
		 out);
	FLOW_TRY(flow_cuda__check_size(diag, func, "out_dim", out_dim, INT_MAX),
		 out);
out:
	return err;
}

flow_err_t flow_cuda_matmul_forward(float *out, const float *inp,
				    const float *weight, const float *bias,
				    size_t n, size_t in_dim, size_t out_dim,
				    flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	const float one = 1.0f, zero = 0.0f;

	if (n == 0 || out_dim == 0)
		return FLOW_OK;
	FLOW_TRY(matmul_check(n, in_dim, out_dim, __func__, diag), out);
	if (in_dim == 0) {
		/* An empty sum: out = 0 (+ bias below). */
		FLOW_CUDA_TRY(cudaMemsetAsync(out, 0, n * out_dim * sizeof(float),
					      stream),
			      out);
	} else {
		FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
		/* out^T (o x n) = W (o x i, stored as i x o) ^T . inp^T (i x n) */
		FLOW_CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N,
					    (int)out_dim, (int)n, (int)in_dim,
					    &one, weight, (int)in_dim, inp,
					    (int)in_dim, &zero, out,
					    (int)out_dim),
				out);
	}
	if (bias) {
		add_bias_kernel<<<flow_cuda__grid(n * out_dim, 256 * 4), 256, 0,
				  stream>>>(out, bias, n, out_dim);
		FLOW_CUDA_LAUNCH_TRY(out);
	}
out:
	return err;
}

flow_err_t flow_cuda_matmul_backward(float *dinp, float *dweight, float *dbias,
				     const float *dout, const float *inp,
				     const float *weight, size_t n,
				     size_t in_dim, size_t out_dim,
				     flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	const float one = 1.0f;
	dim3 block(32, DBIAS_ROWS);

	/* Every gradient is a sum over n rows or over out_dim columns: with
	 * either empty, nothing is added.  in_dim == 0 leaves dinp and dweight
	 * empty but dbias still gets its sums. */
	if (n == 0 || out_dim == 0)
		return FLOW_OK;
	FLOW_TRY(matmul_check(n, in_dim, out_dim, __func__, diag), out);
	if (in_dim > 0 && (dinp || dweight))
		FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	if (in_dim > 0 && dinp) {
		/* dinp^T (i x n) += W^T (stored i x o) . dout^T (o x n) */
		FLOW_CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N,
					    (int)in_dim, (int)n, (int)out_dim,
					    &one, weight, (int)in_dim, dout,
					    (int)out_dim, &one, dinp,
					    (int)in_dim),
				out);
	}
	if (in_dim > 0 && dweight) {
		/* dW^T (i x o) += inp^T (i x n) . (dout^T (o x n))^T */
		FLOW_CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T,
					    (int)in_dim, (int)out_dim, (int)n,
					    &one, inp, (int)in_dim, dout,
					    (int)out_dim, &one, dweight,
					    (int)in_dim),
				out);
	}
	if (dbias) {
		column_sum_kernel<<<(unsigned)flow_cuda__ceil_div(out_dim, 32),
				    block, 0, stream>>>(dbias, dout, n, out_dim);
		FLOW_CUDA_LAUNCH_TRY(out);
	}
out:
	return err;
}

flow_err_t flow_cuda_gemm(bool trans_a, bool trans_b, size_t m, size_t n,
			  size_t k, const float *a, const float *b, float beta,
			  float *c, flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	const float one = 1.0f;

	if (m == 0 || n == 0)
		return FLOW_OK;
	FLOW_TRY(matmul_check(m, k, n, __func__, diag), out);
	FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	/* Row-major C = op(A) . op(B) is column-major C^T = op(B)^T . op(A)^T;
	 * a row-major X is the column-major X^T with its row length as ld. */
	FLOW_CUBLAS_TRY(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
				    trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n,
				    (int)m, (int)k, &one, b,
				    (int)(trans_b ? k : n), a,
				    (int)(trans_a ? m : k), &beta, c, (int)n),
			out);
out:
	return err;
}
