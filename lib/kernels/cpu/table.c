/* The CPU kernel set's table (flow/kernels.h): what the executor
 * calls for FLOW_KERNELS_CPU, the kernels of lib/kernels/cpu/. */
#include <config.h>

#include <flow/boxing.h>
#include <flow/kernels.h>

const flow_kernels_t flow_cpu_kernels = {
	.name = "cpu",
	.matmul_forward = flow_cpu_matmul_forward,
	.matmul_backward = flow_cpu_matmul_backward,
	.embedding_forward = flow_cpu_embedding_forward,
	.embedding_backward = flow_cpu_embedding_backward,
	.layernorm_forward = flow_cpu_layernorm_forward,
	.layernorm_backward = flow_cpu_layernorm_backward,
	.gelu_forward = flow_cpu_gelu_forward,
	.gelu_backward = flow_cpu_gelu_backward,
	.matmul_gelu_forward = flow_cpu_matmul_gelu_forward,
	.attention_forward = flow_cpu_attention_forward,
	.attention_scratch_bound = flow_cpu_attention_scratch_bound,
	.attention_backward = flow_cpu_attention_backward,
	.residual_forward = flow_cpu_residual_forward,
	.residual_backward = flow_cpu_residual_backward,
	.residual_layernorm_forward = flow_cpu_residual_layernorm_forward,
	.layernorm_residual_backward = flow_cpu_layernorm_residual_backward,
	.cross_entropy_forward_backward =
		flow_cpu_cross_entropy_forward_backward,
	.cross_entropy_split_max = flow_cpu_cross_entropy_split_max,
	.cross_entropy_split_sums = flow_cpu_cross_entropy_split_sums,
	.cross_entropy_split_finish = flow_cpu_cross_entropy_split_finish,
	.matmul_bf16_scratch_bound = flow_cpu_matmul_bf16_scratch_bound,
	.matmul_bf16_forward = flow_cpu_matmul_bf16_forward,
	.matmul_bf16_backward = flow_cpu_matmul_bf16_backward,
	.matmul_gelu_bf16_forward = flow_cpu_matmul_gelu_bf16_forward,
	.layernorm_bf16_forward = flow_cpu_layernorm_bf16_forward,
	.layernorm_bf16_backward = flow_cpu_layernorm_bf16_backward,
	.gelu_bf16_forward = flow_cpu_gelu_bf16_forward,
	.gelu_bf16_backward = flow_cpu_gelu_bf16_backward,
	.residual_bf16_forward = flow_cpu_residual_bf16_forward,
	.residual_bf16_backward = flow_cpu_residual_bf16_backward,
	.residual_layernorm_bf16_forward =
		flow_cpu_residual_layernorm_bf16_forward,
	.layernorm_residual_bf16_backward =
		flow_cpu_layernorm_residual_bf16_backward,
	.attention_bf16_forward = flow_cpu_attention_bf16_forward,
	.attention_bf16_backward = flow_cpu_attention_bf16_backward,
	.cross_entropy_bf16_forward_backward =
		flow_cpu_cross_entropy_bf16_forward_backward,
	.cross_entropy_bf16_split_max = flow_cpu_cross_entropy_bf16_split_max,
	.cross_entropy_bf16_split_sums = flow_cpu_cross_entropy_bf16_split_sums,
	.cross_entropy_bf16_split_finish =
		flow_cpu_cross_entropy_bf16_split_finish,
	.box_move = flow_boxing_move_region,
	.adamw_update = flow_cpu_adamw_update,
	.sum_squares = flow_cpu_sum_squares,
	.scale = flow_cpu_scale,
	.clip_grad_norm = flow_cpu_clip_grad_norm,
};
