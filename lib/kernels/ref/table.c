/* The reference kernel set's table (flow/kernels_ref.h): what the executor
 * calls for FLOW_KERNELS_REF, the naive kernels of lib/kernels/ref/ref.c,
 * the CPU set's fp32 split cross-entropy, which sums in double already,
 * and box moves, which are exact. */
#include <config.h>

#include <flow/boxing.h>
#include <flow/kernels_ref.h>

const flow_kernels_t flow_ref_kernels = {
	.name = "ref",
	.matmul_forward = flow_ref_matmul_forward,
	.matmul_backward = flow_ref_matmul_backward,
	.embedding_forward = flow_ref_embedding_forward,
	.embedding_backward = flow_ref_embedding_backward,
	.layernorm_forward = flow_ref_layernorm_forward,
	.layernorm_backward = flow_ref_layernorm_backward,
	.gelu_forward = flow_ref_gelu_forward,
	.gelu_backward = flow_ref_gelu_backward,
	.matmul_gelu_forward = flow_ref_matmul_gelu_forward,
	.attention_forward = flow_ref_attention_forward,
	.attention_scratch_bound = flow_ref_attention_scratch_bound,
	.attention_backward = flow_ref_attention_backward,
	.residual_forward = flow_ref_residual_forward,
	.residual_backward = flow_ref_residual_backward,
	.residual_layernorm_forward = flow_ref_residual_layernorm_forward,
	.layernorm_residual_backward = flow_ref_layernorm_residual_backward,
	.cross_entropy_forward_backward =
		flow_ref_cross_entropy_forward_backward,
	.cross_entropy_split_max = flow_cpu_cross_entropy_split_max,
	.cross_entropy_split_sums = flow_cpu_cross_entropy_split_sums,
	.cross_entropy_split_finish = flow_cpu_cross_entropy_split_finish,
	.matmul_bf16_scratch_bound = flow_ref_matmul_bf16_scratch_bound,
	.matmul_bf16_forward = flow_ref_matmul_bf16_forward,
	.matmul_bf16_backward = flow_ref_matmul_bf16_backward,
	.matmul_gelu_bf16_forward = flow_ref_matmul_gelu_bf16_forward,
	.layernorm_bf16_forward = flow_ref_layernorm_bf16_forward,
	.layernorm_bf16_backward = flow_ref_layernorm_bf16_backward,
	.gelu_bf16_forward = flow_ref_gelu_bf16_forward,
	.gelu_bf16_backward = flow_ref_gelu_bf16_backward,
	.residual_bf16_forward = flow_ref_residual_bf16_forward,
	.residual_bf16_backward = flow_ref_residual_bf16_backward,
	.residual_layernorm_bf16_forward =
		flow_ref_residual_layernorm_bf16_forward,
	.layernorm_residual_bf16_backward =
		flow_ref_layernorm_residual_bf16_backward,
	.attention_bf16_forward = flow_ref_attention_bf16_forward,
	.attention_bf16_backward = flow_ref_attention_bf16_backward,
	.cross_entropy_bf16_forward_backward =
		flow_ref_cross_entropy_bf16_forward_backward,
	.cross_entropy_bf16_split_max = flow_ref_cross_entropy_bf16_split_max,
	.cross_entropy_bf16_split_sums = flow_ref_cross_entropy_bf16_split_sums,
	.cross_entropy_bf16_split_finish =
		flow_ref_cross_entropy_bf16_split_finish,
	.box_move = flow_boxing_move_region,
	.adamw_update = flow_ref_adamw_update,
	.sum_squares = flow_ref_sum_squares,
	.scale = flow_ref_scale,
	.clip_grad_norm = flow_ref_clip_grad_norm,
};
