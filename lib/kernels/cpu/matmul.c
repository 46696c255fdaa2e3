/* CPU matmul (nn.Linear): out = inp . weight^T + bias, forward and backward,
 * with every GEMM handed to cblas_sgemm so the batch is always the M
 * dimension (no weight matrix is streamed once per token); and its bf16
 * form, the same sgemms on operands rounded to bf16 (kernels/host_bf16.c). */
#include <config.h>

#include <string.h>

#include <cblas.h>

#include <flow/kernels.h>

#include "cpu_internal.h"
#include "kernels/host_bf16_internal.h"

void flow_cpu_matmul_forward(float *out, const float *inp,
			     const float *weight, const float *bias, size_t n,
			     size_t in_dim, size_t out_dim)
{
	float beta = 0.0f;

	if (n == 0 || out_dim == 0)
		return;
	/* Seed out with the bias and let sgemm accumulate (beta = 1): OpenBLAS
	 * makes a pass over C for beta = 0 anyway (it zeroes C first), so the
	 * bias costs no extra pass over the output, where adding it after the
	 * GEMM would re-read and re-write all n*out_dim floats. */
	if (bias) {
		const float *restrict b = bias;
#pragma omp parallel for schedule(static)
		for (size_t r = 0; r < n; r++) {
			float *restrict o = out + r * out_dim;
			for (size_t c = 0; c < out_dim; c++)
				o[c] = b[c];
		}
		beta = 1.0f;
	}
	/* sgemm rejects lda = 0; an empty inner dimension is just the bias. */
	if (in_dim == 0) {
		if (!bias)
			memset(out, 0, n * out_dim * sizeof(*out));
		return;
	}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n,
		    (int)out_dim, (int)in_dim, 1.0f, inp, (int)in_dim, weight,
		    (int)in_dim, beta, out, (int)out_dim);
}

/* dbias[o] += sum over rows of dout[:, o].  Each thread owns whole column
 * blocks and walks the rows in order, so every column is summed in the same
 * order whatever the thread count; double accumulators keep long batches
 * (n = B*T in the thousands) accurate to float rounding. */
static void matmul_dbias(float *dbias, const float *dout, size_t n,
			 size_t out_dim)
{
	size_t nblocks = (out_dim + FLOW_CPU_COL_BLOCK - 1) / FLOW_CPU_COL_BLOCK;

#pragma omp parallel for schedule(static)
	for (size_t blk = 0; blk < nblocks; blk++) {
		size_t c0 = blk * FLOW_CPU_COL_BLOCK;
		size_t w = out_dim - c0 < FLOW_CPU_COL_BLOCK ?
				   out_dim - c0 : FLOW_CPU_COL_BLOCK;
		double acc[FLOW_CPU_COL_BLOCK] = { 0 };

		for (size_t r = 0; r < n; r++) {
			const float *restrict d = dout + r * out_dim + c0;
			for (size_t c = 0; c < w; c++)
				acc[c] += d[c];
		}
		for (size_t c = 0; c < w; c++)
			dbias[c0 + c] += (float)acc[c];
	}
}

void flow_cpu_matmul_backward(float *dinp, float *dweight, float *dbias,
			      const float *dout, const float *inp,
			      const float *weight, size_t n, size_t in_dim,
			      size_t out_dim)
{
	if (n == 0 || out_dim == 0)
		return;
	/* With no inputs only the bias has a gradient (and BLAS refuses a
	 * leading dimension of 0). */
	if (in_dim == 0)
		goto bias;
	/* dinp[n,i] += dout[n,o] . weight[o,i] */
	if (dinp)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n,
			    (int)in_dim, (int)out_dim, 1.0f, dout,
			    (int)out_dim, weight, (int)in_dim, 1.0f, dinp,
			    (int)in_dim);
	/* dweight[o,i] += dout^T[o,n] . inp[n,i] */
	if (dweight)
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans,
			    (int)out_dim, (int)in_dim, (int)n, 1.0f, dout,
			    (int)out_dim, inp, (int)in_dim, 1.0f, dweight,
			    (int)in_dim);
bias:
	if (dbias)
		matmul_dbias(dbias, dout, n, out_dim);
}

FLOW_HOST_BF16_MATMULS(flow_cpu)
