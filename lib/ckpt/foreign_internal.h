/* What the GPT-2 exporters and importers share (hf_gpt2.c, llmc_model.c):
 * the parameter table of a GPT-2 config, reading one checkpoint tensor as
 * f32 and writing a one-rank weights checkpoint. */
#ifndef FLOW_CKPT_FOREIGN_INTERNAL_H
#define FLOW_CKPT_FOREIGN_INTERNAL_H

#include <flow/ckpt.h>
#include <flow/model.h>

/* One parameter: flow's name and shape (Linear [out, in]; wte [Vp, C]),
 * the Hugging Face name without "transformer." and whether HF stores it
 * transposed (Conv1D [in, out]). */
typedef struct gpt2_param {
	char flow[FLOW_CKPT_NAME_MAX];
	char hf[FLOW_CKPT_NAME_MAX];
	flow_shape_t shape;
	bool transpose;
} gpt2_param_t;

/* Parameters per layer, in llm.c's (and HF's) order. */
#define GPT2_LAYER_PARAMS 12

/* The parameters of cfg: wte, wpe, then per layer the GPT2_LAYER_PARAMS
 * of h.<l>, then ln_f.weight and ln_f.bias; 4 + 12 layers entries,
 * malloc'ed into *params_out (free()).  FLOW_ERR_NOMEM only. */
flow_err_t gpt2_params(const flow_gpt_config_t *cfg,
		       gpt2_param_t **params_out, size_t *n_out,
		       flow_diag_t *diag);

/* Read exactly len bytes of path (open as fd) at off: FLOW_ERR_IO for a
 * read error, FLOW_ERR_FORMAT "truncated at byte N" at the end of the
 * file. */
flow_err_t foreign_pread(int fd, const char *path, void *buf, size_t len,
			 uint64_t off, flow_diag_t *diag);

/* c, read from the file path, through the model spec's parser (its limits
 * and checks) into cfg; FLOW_ERR_FORMAT naming path. */
flow_err_t gpt2_config_check(const char *path, const flow_gpt_config_t *c,
			     flow_gpt_config_t *cfg, flow_diag_t *diag);

/* The config of ckpt's state "model" (FLOW_ERR_FORMAT when absent or
 * bad), then its parameters (gpt2_params). */
flow_err_t gpt2_ckpt_params(const flow_ckpt_t *ckpt, flow_gpt_config_t *cfg,
			    gpt2_param_t **params_out, size_t *n_out,
			    flow_diag_t *diag);

/* What an export reads the parameters of a checkpoint through, one at a
 * time: vals (and, when asked for, spare, for a transpose or conversion)
 * sized once for the largest of them, and a read buffer the shards stream
 * through (flow_ckpt_read_bounded), so no tensor costs an allocation or a
 * copy of a whole shard. */
typedef struct gpt2_reader {
	const flow_ckpt_t *ckpt;
	float *vals, *spare;
	void *scratch;
	size_t scap;
} gpt2_reader_t;

/* Buffers for the parameters [0, n) of ckpt; release with
 * gpt2_reader_release() (also after an error).  FLOW_ERR_NOMEM only. */
flow_err_t gpt2_reader_init(gpt2_reader_t *r, const flow_ckpt_t *ckpt,
			    const gpt2_param_t *params, size_t n, bool spare,
			    flow_diag_t *diag);
void gpt2_reader_release(gpt2_reader_t *r);

/* Read rows [0, rows) of the parameter p (a float tensor of exactly
 * p->shape in the checkpoint) into r->vals as f32. */
flow_err_t gpt2_reader_read(gpt2_reader_t *r, const gpt2_param_t *p,
			    int64_t rows, flow_diag_t *diag);

/* Elements of a shape (checked by the callers' shapes being small
 * enough: the GPT config limits bound them). */
size_t gpt2_numel(const flow_shape_t *s);

/* dst [cols, rows] = the transpose of src [rows, cols]. */
void gpt2_transpose(const float *src, size_t rows, size_t cols, float *dst);

/* Convert n f32 values to dtype (F32, BF16, F16) into dst. */
void gpt2_from_f32(const float *src, size_t n, flow_dtype_t dtype, void *dst);
/* Convert n values of dtype (F32, BF16, F16) to f32. */
void gpt2_to_f32(const void *src, size_t n, flow_dtype_t dtype, float *dst);

/* Commit the step-0 weights checkpoint written by w (rank 0 of 1) in
 * step_dir with state "model" = spec of cfg, "contents" = "weights". */
flow_err_t gpt2_commit_weights(flow_ckpt_writer_t *w, const char *step_dir,
			       const flow_gpt_config_t *cfg,
			       flow_diag_t *diag);

/* Append whole f32 tensor p (data in flow's layout) to w. */
flow_err_t gpt2_write_param(flow_ckpt_writer_t *w, const gpt2_param_t *p,
			    const float *data, flow_diag_t *diag);

#endif
