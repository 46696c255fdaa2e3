/* CPU token + position embedding: out[b,t,:] = wte[token] + wpe[t], and its
 * backward, which scatters into dwte in a deterministic order; over all of
 * wte's rows or a shard of them (flow/kernels.h). */
#include <config.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

void flow_cpu_embedding_forward(float *out, const int32_t *tokens,
				const float *wte, const float *wpe,
				int64_t row0, size_t rows, size_t B, size_t T,
				size_t C)
{
	size_t npos = B * T;

#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < npos; r++) {
		int64_t row = flow_embedding_row(tokens[r], row0, rows);
		const float *restrict pe = wpe + (r % T) * C;
		float *restrict o = out + r * C;
		if (row < 0) {
			for (size_t c = 0; c < C; c++)
				o[c] = 0.0f + pe[c];
			continue;
		}
		const float *restrict te = wte + (size_t)row * C;
		for (size_t c = 0; c < C; c++)
			o[c] = te[c] + pe[c];
	}
}

void flow_cpu_embedding_backward(float *dwte, float *dwpe, const float *dout,
				 const int32_t *tokens, int64_t row0,
				 size_t rows, size_t B, size_t T, size_t C)
{
	size_t npos = B * T;
	size_t nblocks = flow_cpu_col_blocks(C);

	/* Tokens repeat, so rows of dwte receive several addends.  Rather than
	 * atomics or per-thread copies of dwte, each thread owns whole channel
	 * blocks and visits the tokens in their order: every dwte element is
	 * summed in token order by one thread, whatever the thread count. */
	if (dwte) {
#pragma omp parallel for schedule(static)
		for (size_t blk = 0; blk < nblocks; blk++) {
			size_t c0 = blk * FLOW_CPU_COL_BLOCK;
			size_t w = C - c0 < FLOW_CPU_COL_BLOCK ?
					   C - c0 : FLOW_CPU_COL_BLOCK;
			for (size_t r = 0; r < npos; r++) {
				int64_t row = flow_embedding_row(tokens[r], row0, rows);
				if (row < 0)
					continue;
				float *restrict g = dwte + (size_t)row * C + c0;
				const float *restrict d = dout + r * C + c0;
				for (size_t c = 0; c < w; c++)
					g[c] += d[c];
			}
		}
	}
	/* Position t gets the sum over the batch: one thread per position,
	 * b in order. */
	if (dwpe) {
#pragma omp parallel for schedule(static)
		for (size_t t = 0; t < T; t++) {
			float *restrict g = dwpe + t * C;
			for (size_t b = 0; b < B; b++) {
				const float *restrict d = dout + (b * T + t) * C;
				for (size_t c = 0; c < C; c++)
					g[c] += d[c];
			}
		}
	}
}
