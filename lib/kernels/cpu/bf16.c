/* Whole rows of bf16 activations to and from fp32 for the CPU's bf16
 * GEMMs and attention (cpu_internal.h), which widen their operands and run
 * the fp32 sgemm on them: a product of two bf16 values is exact in fp32,
 * so that sums what bf16 tensor cores do, in the BLAS's order. */
#include <config.h>

#include "cpu_internal.h"

void flow_cpu_widen_bf16(float *out, const flow_bf16_t *in, size_t n)
{
#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		out[i] = flow_bf16_widen(in[i]);
}

void flow_cpu_narrow_bf16(flow_bf16_t *out, const float *in, size_t n)
{
#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		out[i] = flow_bf16_narrow(in[i]);
}

void flow_cpu_round_bf16(float *out, const float *in, size_t n)
{
#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		out[i] = flow_round_bf16(in[i]);
}
