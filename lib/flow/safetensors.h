/* Foreign model files (flow-ckpt(5), EXPORT AND IMPORT): safetensors
 * files read and written, flow checkpoints exported to and imported from
 * Hugging Face GPT-2 directories (safetensors, with an index above one
 * shard, and config.json), and llm.c model files.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes
 * of JSON {"<name>": {"dtype": "F32", "shape": [..], "data_offsets":
 * [BEGIN, END]}, ..., "__metadata__": {str: str}} and the data buffer, the
 * tensors back to back, little-endian, row-major.  The reader checks the
 * header against the file: N at most FLOW_ST_HEADER_MAX, valid JSON with
 * no duplicate name, every tensor's END - BEGIN equal to its dtype size
 * times its shape, the tensors in offset order covering the buffer from 0
 * with no gap and no overlap, and the file exactly 8 + N + the last END
 * bytes long.  Every error is one line naming the file and the tensor. */
#ifndef FLOW_SAFETENSORS_H
#define FLOW_SAFETENSORS_H

#include <flow/ckpt.h>
#include <flow/error.h>
#include <flow/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The longest JSON header read: 100 MB, the limit of the reference
 * (Rust) reader, so that a file flow writes loads everywhere and a lying
 * length cannot make the reader allocate without bound. */
#define FLOW_ST_HEADER_MAX ((uint64_t)100000000)

/* One tensor of a safetensors file.  dtype is one of flow's (F32, BF16,
 * F16, I32, I64, U16, U8, U32); other safetensors dtypes are refused
 * (FLOW_ERR_NOTSUP naming the tensor). */
typedef struct flow_st_tensor {
	const char *name;   /* borrowed from the reader or the caller */
	flow_dtype_t dtype;
	flow_shape_t shape;
	uint64_t begin;     /* data_offsets, relative to the data buffer */
	uint64_t end;
} flow_st_tensor_t;

/* ---- reading ------------------------------------------------------------ */

typedef struct flow_st flow_st_t;

/* Open and validate path (only the header is read).  Free with
 * flow_st_free(). */
FLOW_EXPORT flow_err_t flow_st_open(const char *path, flow_st_t **st_out,
				    flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT void flow_st_free(flow_st_t *st);
FLOW_EXPORT size_t flow_st_tensor_count(const flow_st_t *st);
/* Tensors in offset order; borrowed until flow_st_free. */
FLOW_EXPORT const flow_st_tensor_t *flow_st_tensor_at(const flow_st_t *st,
						      size_t index);
/* Index of the tensor named name, or -1. */
FLOW_EXPORT int flow_st_tensor_find(const flow_st_t *st, const char *name);
/* The __metadata__ value of key, borrowed until flow_st_free; NULL when
 * absent. */
FLOW_EXPORT const char *flow_st_metadata(const flow_st_t *st,
					 const char *key);
/* Copy tensor index's end - begin bytes, as stored, to dst. */
FLOW_EXPORT flow_err_t flow_st_read(const flow_st_t *st, size_t index,
				    void *dst, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* ---- writing ------------------------------------------------------------ */

typedef struct flow_st_writer flow_st_writer_t;

/* Start writing path atomically (flow/file.h): the header for tensors
 * [0, n) in that order (begin/end are computed, the fields ignored; the
 * names are copied) and the metadata meta[0, nmeta), padded with spaces
 * so that the data starts 8-byte aligned.  FLOW_ERR_USAGE for an empty or
 * duplicate name, a name starting "__", or an unsupported dtype.  Free
 * with flow_st_writer_finish() or flow_st_writer_abort(). */
FLOW_EXPORT flow_err_t flow_st_writer_new(const char *path,
					  const flow_st_tensor_t *tensors,
					  size_t n, const flow_ckpt_kv_t *meta,
					  size_t nmeta,
					  flow_st_writer_t **writer_out,
					  flow_diag_t *diag) FLOW_MUST_CHECK;
/* Write the next tensor's bytes (its dtype size x shape, little-endian). */
FLOW_EXPORT flow_err_t flow_st_writer_put(flow_st_writer_t *writer,
					  const void *data, flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Commit the file (FLOW_ERR_USAGE, and nothing written, when a tensor is
 * missing) and free the writer, also on error. */
FLOW_EXPORT flow_err_t flow_st_writer_finish(flow_st_writer_t *writer,
					     flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Remove the temporary file and free; NULL is ignored. */
FLOW_EXPORT void flow_st_writer_abort(flow_st_writer_t *writer);

/* Bytes a safetensors file of tensors [0, n) (shapes and dtypes) would
 * hold in its data buffer; FLOW_ERR_RANGE on overflow. */
FLOW_EXPORT flow_err_t flow_st_data_size(const flow_st_tensor_t *tensors,
					 size_t n, uint64_t *size_out,
					 flow_diag_t *diag) FLOW_MUST_CHECK;

/* ---- Hugging Face GPT-2 ------------------------------------------------- */

typedef struct flow_hf_export_options {
	flow_dtype_t dtype;      /* FLOW_DTYPE_F32 (0), _BF16 or _F16 */
	uint64_t max_shard_size; /* bytes of tensor data per file; 0: one
				  * file */
} flow_hf_export_options_t;

/* Export the GPT-2 weights of ckpt (any layout; state "model" holds the
 * spec) to the new directory out_dir, built under a temporary name and
 * renamed into place (FLOW_ERR_IO when out_dir exists): config.json and
 * model.safetensors, or model-0000I-of-0000K.safetensors files and
 * model.safetensors.index.json when the data exceeds max_shard_size.
 * Names "transformer.wte.weight", ..., Conv1D weights [in, out], the
 * padded vocabulary rows dropped, lm_head tied (not written).  One
 * logical tensor is held in memory at a time.  opt may be NULL. */
FLOW_EXPORT flow_err_t flow_hf_gpt2_export(const flow_ckpt_t *ckpt,
					   const char *out_dir,
					   const flow_hf_export_options_t *opt,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

/* Import src (a .safetensors file with config.json beside it, or a
 * directory holding config.json and model.safetensors or
 * model.safetensors.index.json) as a one-rank checkpoint of step 0 in
 * step_dir: f32 parameters named as flow's, whole, the padded vocabulary
 * rows zero, state "model" (the spec from config.json, pad 128) and
 * "contents" "weights".  Names with or without "transformer." are taken;
 * attn.bias, attn.masked_bias and lm_head.weight are skipped. */
FLOW_EXPORT flow_err_t flow_hf_gpt2_import(const char *src,
					   const char *step_dir,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

/* ---- llm.c model files -------------------------------------------------- */

#define FLOW_LLMC_MODEL_MAGIC 20240326
#define FLOW_LLMC_MODEL_VERSION_F32 3
#define FLOW_LLMC_MODEL_VERSION_BF16 5

/* Write the weights of ckpt as an llm.c model file (256 int32 header:
 * magic, version, maxT, V, L, H, C, Vp; then wte, wpe, ln1w, ln1b, qkvw,
 * qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw,
 * lnfb, each stacked over the layers, Linear layouts, padded vocabulary)
 * atomically to path; dtype FLOW_DTYPE_F32 (version 3) or _BF16 (5). */
FLOW_EXPORT flow_err_t flow_llmc_model_export(const flow_ckpt_t *ckpt,
					      const char *path,
					      flow_dtype_t dtype,
					      flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Import an llm.c model file as a one-rank checkpoint of step 0 in
 * step_dir (as flow_hf_gpt2_import; pad = the file's Vp when it is not
 * V rounded up to 128).  The header is checked against the file length. */
FLOW_EXPORT flow_err_t flow_llmc_model_import(const char *path,
					      const char *step_dir,
					      flow_diag_t *diag)
	FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
