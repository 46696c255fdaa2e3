/* Helpers the autograd, memory-plan and executor tests share to build
 * small graphs by hand: tensors and ops in one call each, and a GPT-2
 * graph of any size.  None of them uses cmocka.  The graphs are valid by
 * construction, so libflow refusing one is a bug: the helper hands the
 * message to graphutil_fail, which a test points at its own assertion
 * failure. */
#ifndef FLOW_TEST_GRAPHUTIL_H
#define FLOW_TEST_GRAPHUTIL_H

#include <stdbool.h>
#include <stdint.h>

#include <flow/exec.h>
#include <flow/graph.h>

/* Called with the diagnostic when libflow refuses what a helper asks for.
 * Tests set it to a function that fails the current test (cmocka's
 * fail_msg); while it is NULL, the message goes to stderr and the program
 * aborts. */
extern void (*graphutil_fail)(const char *msg);

/* r, when it is not negative; else graphutil_fail(diag's message). */
int graphutil_must(int r, const flow_diag_t *diag);

/* Add a tensor (parameters get libflow's default init, zeros) and return
 * its index. */
int graphutil_tensor(flow_graph_t *g, const char *name, flow_role_t role,
		     flow_dtype_t dtype, int ndim, const int64_t *dims);

/* Add an f32 parameter with the given init and return its index. */
int graphutil_param(flow_graph_t *g, const char *name, flow_init_t init,
		    int ndim, const int64_t *dims);

/* Add an op reading in[0..nin) (-1: an absent optional input) and return
 * its first output. */
int graphutil_op(flow_graph_t *g, flow_op_kind_t kind, const char *name,
		 const int *in, int nin, uint32_t heads, uint32_t vocab);

/* A forward pass that must succeed (graphs of one rank cannot fail):
 * its mean loss. */
double graphutil_forward(flow_exec_t *x);
/* A backward pass that must succeed. */
void graphutil_backward(flow_exec_t *x);

#define DIMS(...) ((const int64_t[]){ __VA_ARGS__ })
#define NDIM(...) ((int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)))

/* PARAM(g, "w", 4, 8): an f32 parameter of shape (4,8); INIT_PARAM takes
 * its init too.  IDS: an i32 input.  OP(g, kind, "name", in...): an op
 * without heads or vocab. */
#define PARAM(g, name, ...)                                                \
	graphutil_tensor(g, name, FLOW_ROLE_PARAM, FLOW_DTYPE_F32,         \
			 NDIM(__VA_ARGS__), DIMS(__VA_ARGS__))
#define INIT_PARAM(g, name, init, ...)                                     \
	graphutil_param(g, name, init, NDIM(__VA_ARGS__), DIMS(__VA_ARGS__))
#define IDS(g, name, ...)                                                  \
	graphutil_tensor(g, name, FLOW_ROLE_INPUT, FLOW_DTYPE_I32,         \
			 NDIM(__VA_ARGS__), DIMS(__VA_ARGS__))
#define OP(g, kind, name, ...)                                             \
	graphutil_op(g, kind, name, (const int[]){ __VA_ARGS__ },          \
		     (int)(sizeof((int[]){ __VA_ARGS__ }) / sizeof(int)), 0, 0)

/* The sizes of a GPT-2 graph: Vp >= V rows in the token table; and the
 * dtype of its activations (flow_graph_set_act_dtype; 0 is f32). */
typedef struct graphutil_gpt {
	int layers, B, T, C, heads, V, Vp;
	flow_dtype_t act;
} graphutil_gpt_t;

/* GPT-2's training graph, into g (initialised here; release with
 * flow_graph_release()): inputs "tokens" and "targets" (B,T); "wte"
 * (Vp,C), rows from V on zero, which the head shares, and "wpe" (T,C);
 * "embed"; per layer a pre-LN block, "ln_1", "c_attn", "attn",
 * "attn.c_proj", "residual_1", "ln_2", "c_fc", "gelu", "mlp.c_proj" and
 * "residual_2", whose names start with "h.<layer>." when there is more
 * than one layer; then "ln_f", the head "lm_head" and the loss "loss".
 * Weights and biases start N(0, 0.1^2), layer norms at weight 1 and bias
 * 0.  Differentiated when backward. */
void graphutil_gpt_build(flow_graph_t *g, const graphutil_gpt_t *d,
			 bool backward);

#endif
