/* Model builders: GPT-2.
 *
 * The GPT-2 architecture exactly: token embedding wte[Vp,C] tied with the
 * LM head, learned position embedding wpe[Tmax,C], n_layer pre-LayerNorm
 * blocks (ln_1, causal self-attention with fused QKV c_attn and output
 * projection c_proj, residual; ln_2, MLP c_fc 4C with GELU tanh, c_proj,
 * residual), final LayerNorm ln_f, logits = x . wte^T over the padded
 * vocabulary Vp (a multiple of `pad`), cross-entropy over the real V.
 *
 * Parameter names follow nanoGPT without its "transformer." prefix:
 *   wte, wpe, h.<i>.ln_1.{weight,bias}, h.<i>.attn.c_attn.{weight,bias},
 *   h.<i>.attn.c_proj.{weight,bias}, h.<i>.ln_2.{weight,bias},
 *   h.<i>.mlp.c_fc.{weight,bias}, h.<i>.mlp.c_proj.{weight,bias},
 *   ln_f.{weight,bias}
 * with nn.Linear layouts (weight [out, in]).
 *
 * Initialisation (GPT-2): every weight and embedding N(0, 0.02), the two
 * residual output projections (attn.c_proj.weight, mlp.c_proj.weight)
 * N(0, 0.02 / sqrt(2 n_layer)); biases 0; layernorm weights 1, biases 0;
 * padded rows of wte 0.  Weight decay applies to the 2-D tensors (weights
 * and embeddings), not to biases or layernorm parameters. */
#ifndef FLOW_MODEL_H
#define FLOW_MODEL_H

#include <flow/graph.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flow_gpt_config {
	uint32_t layers;
	uint32_t heads;
	uint32_t dim;       /* C, divisible by heads */
	uint32_t vocab;     /* V */
	uint32_t pad;       /* Vp = V rounded up to a multiple of pad */
	uint32_t seq;       /* Tmax: rows of wpe, the longest context */
} flow_gpt_config_t;

#define FLOW_GPT_SPEC_MAX 128

/* Parse a model spec: a preset ("gpt2-124m", "gpt2-350m", "gpt2-774m",
 * "gpt2-1.5b": GPT-2's sizes, vocab 50257, seq 1024) or
 * "gpt:layers=4,heads=4,dim=256,vocab=50257,seq=256[,pad=128]"; a preset
 * may be followed by ":" and overrides ("gpt2-124m:seq=256").  Default pad
 * is 128.  FLOW_ERR_USAGE with a message naming the bad key or value. */
FLOW_EXPORT flow_err_t flow_gpt_parse(const char *spec,
				      flow_gpt_config_t *cfg_out,
				      flow_diag_t *diag) FLOW_MUST_CHECK;
/* The canonical spec "gpt:layers=12,heads=12,dim=768,vocab=50257,seq=1024,
 * pad=128" (parses back to cfg).  Returns the length needed. */
FLOW_EXPORT size_t flow_gpt_format(const flow_gpt_config_t *cfg, char *buf,
				   size_t cap);
/* Vp. */
FLOW_EXPORT uint32_t flow_gpt_padded_vocab(const flow_gpt_config_t *cfg);
/* Trained parameters (the padded wte rows included). */
FLOW_EXPORT uint64_t flow_gpt_param_count(const flow_gpt_config_t *cfg);

/* Build the forward graph of one micro-batch of B sequences of T <= seq
 * tokens into the empty graph g: inputs "tokens" and "targets" (i32
 * [B,T]), the model, and the loss (flow_graph_set_loss).  The caller then
 * calls flow_graph_backward for training.  FLOW_ERR_USAGE for T > seq or
 * sizes that overflow. */
FLOW_EXPORT flow_err_t flow_gpt_build(const flow_gpt_config_t *cfg,
				      uint32_t B, uint32_t T, flow_graph_t *g,
				      flow_diag_t *diag) FLOW_MUST_CHECK;

/* Model FLOPs per trained token at context T: 6 N + 12 L T C with N the
 * parameters excluding wpe (the PaLM convention llm.c and nanoGPT use for
 * MFU).  Counts the matmuls; the padded vocabulary counts. */
FLOW_EXPORT double flow_gpt_flops_per_token(const flow_gpt_config_t *cfg,
					    uint32_t T);

#ifdef __cplusplus
}
#endif

#endif
