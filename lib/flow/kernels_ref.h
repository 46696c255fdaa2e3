/* Reference kernels: a second, deliberately naive implementation of every
 * kernel of the table in flow/kernels.h, used to check the optimised ones
 * (flow-bench, the unit tests, the executor's FLOW_KERNELS_REF).
 *
 * Each flow_ref_<kernel> has the type, hence the signature and the
 * contract, of flow/kernels.h's flow_<kernel>_fn (fp32 row-major tensors,
 * forward overwrites, backward ACCUMULATES, optional gradients may be
 * NULL), but is written for obviousness, not speed:
 * - plain loops in the order of the textbook formula, no blocking, no SIMD,
 *   no BLAS, no OpenMP: single-threaded, hence deterministic;
 * - every sum and every intermediate is computed in double, and each result
 *   is rounded to float once, when it is stored (or added to a gradient).
 * So a reference result is the exact result to within one float rounding
 * plus double-precision error, the yardstick for |a - b| <= atol + rtol*|ref|.
 *
 * The bf16 twins (flow/kernels.h, "bf16 activations") are their fp32
 * kernels' loops over the widened bf16 operands, the same double
 * arithmetic in the same order, and store a bf16 result rounded once from
 * that double (flow_ref_bf16_narrow), or add into a bf16 gradient as
 * g = bf16(g + dg) with g + dg in double; their fp32 results round once
 * to float as the fp32 kernels' do.  So on the same values a twin's fp32
 * results have the fp32 kernel's bits, and a bf16 result is the fp32
 * kernel's double rounded to bf16 instead of float.  Where the contract
 * rounds an operand of a product (a bf16 GEMM's weight, attention's
 * probabilities and score gradients), it is rounded where it is read.
 *
 * Cost is that of the naive algorithm (a matmul is n*in*out multiply-adds
 * at scalar speed): callers that check large shapes check a sample (see
 * flow-bench(1), section OUTPUT). All functions are thread-safe: they touch
 * only their arguments. */
#ifndef FLOW_KERNELS_REF_H
#define FLOW_KERNELS_REF_H

#include <flow/common.h>
#include <flow/kernels.h>
#include <flow/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The table of the flow_ref_* functions below, named "ref". */
FLOW_EXPORT extern const flow_kernels_t flow_ref_kernels;

/* x rounded once to the nearest bf16, ties to even (NaN stays NaN,
 * overflow gives infinity): every bf16 value the set stores.  Not
 * flow_bf16_narrow((float)x), which rounds twice and can miss by one when
 * x rounds to float onto a midpoint of two bf16 values. */
FLOW_EXPORT flow_bf16_t flow_ref_bf16_narrow(double x);

FLOW_EXPORT flow_matmul_forward_fn flow_ref_matmul_forward;
FLOW_EXPORT flow_matmul_backward_fn flow_ref_matmul_backward;
/* 0: the weight and the bias are rounded to bf16 where they are read,
 * nothing is kept. */
FLOW_EXPORT flow_matmul_bf16_scratch_bound_fn flow_ref_matmul_bf16_scratch_bound;
FLOW_EXPORT flow_matmul_bf16_forward_fn flow_ref_matmul_bf16_forward;
FLOW_EXPORT flow_matmul_bf16_backward_fn flow_ref_matmul_bf16_backward;

FLOW_EXPORT flow_embedding_forward_fn flow_ref_embedding_forward;
FLOW_EXPORT flow_embedding_backward_fn flow_ref_embedding_backward;

/* A two-pass mean and biased variance. */
FLOW_EXPORT flow_layernorm_forward_fn flow_ref_layernorm_forward;
/* With xhat = (inp - mean) * rstd and g = dout * weight,
 * dinp += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat));
 * dweight[c] += sum_n dout * xhat; dbias[c] += sum_n dout. */
FLOW_EXPORT flow_layernorm_backward_fn flow_ref_layernorm_backward;
FLOW_EXPORT flow_layernorm_bf16_forward_fn flow_ref_layernorm_bf16_forward;
FLOW_EXPORT flow_layernorm_bf16_backward_fn flow_ref_layernorm_bf16_backward;

/* gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). */
FLOW_EXPORT flow_gelu_forward_fn flow_ref_gelu_forward;
FLOW_EXPORT flow_gelu_backward_fn flow_ref_gelu_backward;
FLOW_EXPORT flow_gelu_bf16_forward_fn flow_ref_gelu_bf16_forward;
FLOW_EXPORT flow_gelu_bf16_backward_fn flow_ref_gelu_bf16_backward;
/* The matmul, then the GELU of the stored (in bf16, rounded) pre. */
FLOW_EXPORT flow_matmul_gelu_forward_fn flow_ref_matmul_gelu_forward;
FLOW_EXPORT flow_matmul_gelu_bf16_forward_fn flow_ref_matmul_gelu_bf16_forward;

/* One (b, h, t) row at a time: lse in double, rounded; out from the
 * probabilities of the rounded lse. */
FLOW_EXPORT flow_attention_forward_fn flow_ref_attention_forward;
/* Two T x T matrices of doubles (the probabilities of one head and their
 * gradients), for either dtype. */
FLOW_EXPORT flow_attention_scratch_bound_fn flow_ref_attention_scratch_bound;
/* att[t,s] = exp(scale q[t].k[s] - lse[t]);
 * dv[s] = sum_t att[t,s] dout[t]; datt[t,s] = dout[t].v[s];
 * dpre[t,s] = att[t,s] (datt[t,s] - sum_s' att[t,s'] datt[t,s']);
 * dq[t] = sum_s dpre[t,s] k[s] / sqrt(hs); dk[s] = sum_t dpre[t,s] q[t] /
 * sqrt(hs). */
FLOW_EXPORT flow_attention_backward_fn flow_ref_attention_backward;
/* The same, with att rounded to bf16 where it multiplies v or dout (not
 * in the softmax or its backward), and dpre / sqrt(hs) rounded to bf16. */
FLOW_EXPORT flow_attention_bf16_forward_fn flow_ref_attention_bf16_forward;
FLOW_EXPORT flow_attention_bf16_backward_fn flow_ref_attention_bf16_backward;

FLOW_EXPORT flow_residual_forward_fn flow_ref_residual_forward;
FLOW_EXPORT flow_residual_backward_fn flow_ref_residual_backward;
FLOW_EXPORT flow_residual_bf16_forward_fn flow_ref_residual_bf16_forward;
FLOW_EXPORT flow_residual_bf16_backward_fn flow_ref_residual_bf16_backward;
FLOW_EXPORT flow_residual_layernorm_forward_fn
	flow_ref_residual_layernorm_forward;
FLOW_EXPORT flow_layernorm_residual_backward_fn
	flow_ref_layernorm_residual_backward;
FLOW_EXPORT flow_residual_layernorm_bf16_forward_fn
	flow_ref_residual_layernorm_bf16_forward;
FLOW_EXPORT flow_layernorm_residual_bf16_backward_fn
	flow_ref_layernorm_residual_bf16_backward;

FLOW_EXPORT flow_cross_entropy_forward_backward_fn
	flow_ref_cross_entropy_forward_backward;
/* The whole row and the three split steps share their pieces: the max,
 * the sum of exp(logit - max), and the gradient dloss * (p - onehot), each
 * in double and rounded once.  (The set's fp32 split steps are the CPU
 * set's.) */
FLOW_EXPORT flow_cross_entropy_bf16_forward_backward_fn
	flow_ref_cross_entropy_bf16_forward_backward;
FLOW_EXPORT flow_cross_entropy_bf16_split_max_fn
	flow_ref_cross_entropy_bf16_split_max;
FLOW_EXPORT flow_cross_entropy_bf16_split_sums_fn
	flow_ref_cross_entropy_bf16_split_sums;
FLOW_EXPORT flow_cross_entropy_bf16_split_finish_fn
	flow_ref_cross_entropy_bf16_split_finish;

FLOW_EXPORT flow_adamw_update_fn flow_ref_adamw_update;

/* In index order. */
FLOW_EXPORT flow_sum_squares_fn flow_ref_sum_squares;
FLOW_EXPORT flow_scale_fn flow_ref_scale;
FLOW_EXPORT flow_clip_grad_norm_fn flow_ref_clip_grad_norm;

#ifdef __cplusplus
}
#endif

#endif
