/* CPU matmul (nn.Linear): out = inp . weight^T + bias, forward and backward,
 * with every GEMM handed to cblas_sgemm so the batch is always the M
 * dimension (no weight matrix is streamed once per token); and its bf16
 * twins, the same sgemms on the bf16 activations widened one panel of rows
 * at a time and the weight rounded to bf16 once per call. */
#include <config.h>

#include <string.h>

#include <cblas.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

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

/* Columns [blk * FLOW_CPU_COL_BLOCK, +64) of dbias += the sums over rows
 * of dout, of either dtype.  Each thread owns whole column blocks and
 * walks the rows in order, so every column is summed in the same order
 * whatever the thread count; double accumulators keep long batches
 * (n = B*T in the thousands) accurate to float rounding. */
FLOW_CPU_INLINE void matmul_dbias_block(float *dbias, const void *dout,
					size_t n, size_t out_dim, size_t blk,
					bool bf16)
{
	size_t c0 = blk * FLOW_CPU_COL_BLOCK;
	size_t w = out_dim - c0 < FLOW_CPU_COL_BLOCK ? out_dim - c0 :
						       FLOW_CPU_COL_BLOCK;
	double acc[FLOW_CPU_COL_BLOCK] = { 0 };

	for (size_t r = 0; r < n; r++)
		for (size_t c = 0; c < w; c++)
			acc[c] += flow_cpu_act_load(dout, r * out_dim + c0 + c,
						    bf16);
	for (size_t c = 0; c < w; c++)
		dbias[c0 + c] += (float)acc[c];
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
	if (dbias) {
#pragma omp parallel for schedule(static)
		for (size_t blk = 0; blk < flow_cpu_col_blocks(out_dim); blk++)
			matmul_dbias_block(dbias, dout, n, out_dim, blk, false);
	}
}

/* The matmul, then the GELU of its output: the same bits as the two
 * kernels, which is all the CPU can fuse. */
void flow_cpu_matmul_gelu_forward(float *pre, float *out, const float *inp,
				  const float *weight, const float *bias,
				  size_t n, size_t in_dim, size_t out_dim)
{
	flow_cpu_matmul_forward(pre, inp, weight, bias, n, in_dim, out_dim);
	flow_cpu_gelu_forward(out, pre, n * out_dim);
}

/* ---- bf16 twins ------------------------------------------------------------ */

/* Where a bf16 call keeps its fp32 operands in scratch: the rounded
 * weight and bias, then one panel of rows of the widened inp, dinp and
 * dout (the forward pass puts its out where dout goes). */
typedef struct {
	float *w, *b, *x, *dx, *g;
	size_t rows;
} bf16_panels_t;

static bf16_panels_t bf16_carve(void *scratch, size_t n, size_t in_dim,
				size_t out_dim)
{
	bf16_panels_t p;

	p.rows = flow_matmul_bf16_panel_rows(n, in_dim, out_dim,
					     FLOW_CPU_BF16_PANEL);
	p.w = scratch;
	p.b = p.w + out_dim * in_dim;
	p.x = p.b + out_dim;
	p.dx = p.x + p.rows * in_dim;
	p.g = p.dx + p.rows * in_dim;
	return p;
}

size_t flow_cpu_matmul_bf16_scratch_bound(size_t n, size_t in_dim,
					  size_t out_dim)
{
	size_t rows = flow_matmul_bf16_panel_rows(n, in_dim, out_dim,
						  FLOW_CPU_BF16_PANEL);
	return ((in_dim + 1) * out_dim + rows * (2 * in_dim + out_dim)) *
	       sizeof(float);
}

void flow_cpu_matmul_bf16_forward(flow_bf16_t *out, void *scratch,
				  const flow_bf16_t *inp, const float *weight,
				  const float *bias, size_t n, size_t in_dim,
				  size_t out_dim)
{
	bf16_panels_t p = bf16_carve(scratch, n, in_dim, out_dim);

	if (n == 0 || out_dim == 0)
		return;
	flow_cpu_round_bf16(p.w, weight, out_dim * in_dim);
	if (bias)
		flow_cpu_round_bf16(p.b, bias, out_dim);
	for (size_t r0 = 0; r0 < n; r0 += p.rows) {
		size_t m = n - r0 < p.rows ? n - r0 : p.rows;
		flow_cpu_widen_bf16(p.x, inp + r0 * in_dim, m * in_dim);
		flow_cpu_matmul_forward(p.g, p.x, p.w, bias ? p.b : NULL, m,
					in_dim, out_dim);
		flow_cpu_narrow_bf16(out + r0 * out_dim, p.g, m * out_dim);
	}
}

void flow_cpu_matmul_bf16_backward(flow_bf16_t *dinp, float *dweight,
				   float *dbias, void *scratch,
				   const flow_bf16_t *dout,
				   const flow_bf16_t *inp, const float *weight,
				   size_t n, size_t in_dim, size_t out_dim)
{
	bf16_panels_t p = bf16_carve(scratch, n, in_dim, out_dim);

	if (n == 0 || out_dim == 0)
		return;
	/* dbias straight from the bf16 dout: the same sums in one pass,
	 * whatever the panels. */
	if (dbias) {
#pragma omp parallel for schedule(static)
		for (size_t blk = 0; blk < flow_cpu_col_blocks(out_dim); blk++)
			matmul_dbias_block(dbias, dout, n, out_dim, blk, true);
	}
	if (in_dim == 0 || (!dinp && !dweight))
		return;
	if (dinp)
		flow_cpu_round_bf16(p.w, weight, out_dim * in_dim);
	for (size_t r0 = 0; r0 < n; r0 += p.rows) {
		size_t m = n - r0 < p.rows ? n - r0 : p.rows;
		flow_cpu_widen_bf16(p.g, dout + r0 * out_dim, m * out_dim);
		if (dweight)
			flow_cpu_widen_bf16(p.x, inp + r0 * in_dim, m * in_dim);
		if (dinp)
			flow_cpu_widen_bf16(p.dx, dinp + r0 * in_dim,
					    m * in_dim);
		/* dweight over the panels in order: deterministic. */
		flow_cpu_matmul_backward(dinp ? p.dx : NULL, dweight, NULL,
					 p.g, p.x, p.w, m, in_dim, out_dim);
		if (dinp)
			flow_cpu_narrow_bf16(dinp + r0 * in_dim, p.dx,
					     m * in_dim);
	}
}

void flow_cpu_matmul_gelu_bf16_forward(flow_bf16_t *pre, flow_bf16_t *out,
				       void *scratch, const flow_bf16_t *inp,
				       const float *weight, const float *bias,
				       size_t n, size_t in_dim, size_t out_dim)
{
	flow_cpu_matmul_bf16_forward(pre, scratch, inp, weight, bias, n,
				     in_dim, out_dim);
	flow_cpu_gelu_bf16_forward(out, pre, n * out_dim);
}
