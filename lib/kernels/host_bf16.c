/* bf16 mixed-precision matmul on host memory (host_bf16_internal.h): the
 * whole weight rounded once per call, the rows of inp and dout one panel
 * at a time, each panel handed to the set's fp32 kernel, which accumulates
 * (dweight over the panels, in panel order: deterministic). */
#include <config.h>

#include <flow/tensor.h>

#include "host_bf16_internal.h"

void flow_host_round_bf16(float *out, const float *in, size_t n)
{
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++)
		out[i] = flow_round_bf16(in[i]);
}

size_t flow_host_matmul_bf16_scratch_bound(size_t n, size_t in_dim,
					   size_t out_dim)
{
	size_t rows = flow_matmul_bf16_panel_rows(n, in_dim, out_dim,
						  FLOW_HOST_BF16_PANEL);
	return (out_dim * in_dim + rows * (in_dim + out_dim)) * sizeof(float);
}

void flow_host_matmul_bf16_forward(flow_matmul_forward_fn *fp32, float *out,
				   void *scratch, const float *inp,
				   const float *weight, const float *bias,
				   size_t n, size_t in_dim, size_t out_dim)
{
	size_t rows = flow_matmul_bf16_panel_rows(n, in_dim, out_dim,
						  FLOW_HOST_BF16_PANEL);
	float *w = scratch, *x = w + out_dim * in_dim;

	if (n == 0 || out_dim == 0)
		return;
	flow_host_round_bf16(w, weight, out_dim * in_dim);
	for (size_t r0 = 0; r0 < n; r0 += rows) {
		size_t m = n - r0 < rows ? n - r0 : rows;
		flow_host_round_bf16(x, inp + r0 * in_dim, m * in_dim);
		fp32(out + r0 * out_dim, x, w, bias, m, in_dim, out_dim);
	}
}

void flow_host_matmul_bf16_backward(flow_matmul_backward_fn *fp32,
				    float *dinp, float *dweight, float *dbias,
				    void *scratch, const float *dout,
				    const float *inp, const float *weight,
				    size_t n, size_t in_dim, size_t out_dim)
{
	size_t rows = flow_matmul_bf16_panel_rows(n, in_dim, out_dim,
						  FLOW_HOST_BF16_PANEL);
	float *w = scratch, *g = w + out_dim * in_dim, *x = g + rows * out_dim;

	/* dbias from the fp32 dout, as the set sums it. */
	if (dbias)
		fp32(NULL, NULL, dbias, dout, inp, weight, n, in_dim, out_dim);
	if (n == 0 || out_dim == 0 || (!dinp && !dweight))
		return;
	if (dinp)
		flow_host_round_bf16(w, weight, out_dim * in_dim);
	for (size_t r0 = 0; r0 < n; r0 += rows) {
		size_t m = n - r0 < rows ? n - r0 : rows;
		flow_host_round_bf16(g, dout + r0 * out_dim, m * out_dim);
		if (dweight)
			flow_host_round_bf16(x, inp + r0 * in_dim, m * in_dim);
		fp32(dinp ? dinp + r0 * in_dim : NULL, dweight, NULL, g, x, w,
		     m, in_dim, out_dim);
	}
}
