/* bf16 operands in the host kernel sets (CPU and reference): rounding,
 * and the bf16 matmul (flow/kernels.h: matmul with bf16 GEMM operands),
 * each operand rounded to bf16 values held in floats, then the set's own
 * fp32 matmul on them.
 * A product of two bf16 values is exact in fp32, so this computes the
 * sums a GPU's bf16 tensor cores do, in the set's order of additions. */
#ifndef FLOW_HOST_BF16_INTERNAL_H
#define FLOW_HOST_BF16_INTERNAL_H

#include <flow/kernels.h>

/* Elements of one panel's rounded rows (64 MiB of floats): large enough
 * that a panel's sgemm runs at full speed, small beside the logits. */
#define FLOW_HOST_BF16_PANEL ((size_t)1 << 24)

/* out[i] = in[i] rounded to bf16 (flow_round_bf16), n elements; out may
 * be in. */
void flow_host_round_bf16(float *out, const float *in, size_t n);

/* The n elements of x as a bf16 product reads them: x itself, or with
 * bf16 its copy rounded into room. */
static inline const float *flow_host_bf16_operand(const float *x, size_t n,
						  bool bf16, float *room)
{
	if (!bf16)
		return x;
	flow_host_round_bf16(room, x, n);
	return room;
}

size_t flow_host_matmul_bf16_scratch_bound(size_t n, size_t in_dim,
					   size_t out_dim);
void flow_host_matmul_bf16_forward(flow_matmul_forward_fn *fp32, float *out,
				   void *scratch, const float *inp,
				   const float *weight, const float *bias,
				   size_t n, size_t in_dim, size_t out_dim);
void flow_host_matmul_bf16_backward(flow_matmul_backward_fn *fp32,
				    float *dinp, float *dweight, float *dbias,
				    void *scratch, const float *dout,
				    const float *inp, const float *weight,
				    size_t n, size_t in_dim, size_t out_dim);

/* The three bf16 members of the host set whose functions are named
 * PREFIX_* (flow_cpu, flow_ref), over its own PREFIX_matmul_forward and
 * PREFIX_matmul_backward, and its matmul_gelu_forward over those and its
 * PREFIX_gelu_forward; their declarations are the set's header's. */
#define FLOW_HOST_BF16_MATMULS(prefix)                                      \
	size_t prefix##_matmul_bf16_scratch_bound(size_t n, size_t in_dim,  \
						  size_t out_dim)           \
	{                                                                   \
		return flow_host_matmul_bf16_scratch_bound(n, in_dim,       \
							   out_dim);        \
	}                                                                   \
	void prefix##_matmul_bf16_forward(                                  \
		float *out, void *scratch, const float *inp,                \
		const float *weight, const float *bias, size_t n,           \
		size_t in_dim, size_t out_dim)                              \
	{                                                                   \
		flow_host_matmul_bf16_forward(prefix##_matmul_forward, out, \
					      scratch, inp, weight, bias, n, \
					      in_dim, out_dim);             \
	}                                                                   \
	void prefix##_matmul_bf16_backward(                                 \
		float *dinp, float *dweight, float *dbias, void *scratch,   \
		const float *dout, const float *inp, const float *weight,   \
		size_t n, size_t in_dim, size_t out_dim)                    \
	{                                                                   \
		flow_host_matmul_bf16_backward(                             \
			prefix##_matmul_backward, dinp, dweight, dbias,     \
			scratch, dout, inp, weight, n, in_dim, out_dim);    \
	}                                                                   \
	/* The matmul, then the GELU of its output: the same bits as the    \
	 * two kernels, which is all a host set can fuse. */                \
	void prefix##_matmul_gelu_forward(                                  \
		float *pre, float *out, void *scratch, bool bf16,           \
		const float *inp, const float *weight, const float *bias,   \
		size_t n, size_t in_dim, size_t out_dim)                    \
	{                                                                   \
		if (bf16)                                                   \
			prefix##_matmul_bf16_forward(pre, scratch, inp,     \
						     weight, bias, n,       \
						     in_dim, out_dim);      \
		else                                                        \
			prefix##_matmul_forward(pre, inp, weight, bias, n,  \
						in_dim, out_dim);           \
		prefix##_gelu_forward(out, pre, n * out_dim);               \
	}

#endif
