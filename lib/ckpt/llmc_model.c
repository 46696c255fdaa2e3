/* llm.c model files (flow/safetensors.h): gpt2_124M.bin and its kin, the
 * weights llm.c's train_gpt2 reads and writes (256 int32 header, then
 * the parameters stacked by kind over the layers). */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flow/file.h>
#include <flow/safetensors.h>

#include "foreign_internal.h"

#define LLMC_HEADER_INTS 256
#define LLMC_HEADER_BYTES (LLMC_HEADER_INTS * 4)

/* The index in the table of gpt2_params of the parameter the file holds
 * b-th: the file stacks each kind over the layers (wte, wpe, every
 * layer's ln_1.weight, every layer's ln_1.bias, ..., ln_f), the table
 * lists them layer by layer. */
static size_t llmc_block(size_t b, uint32_t layers)
{
	size_t stacked = (size_t)layers * GPT2_LAYER_PARAMS;
	if (b < 2 || b >= 2 + stacked)
		return b;
	size_t kind = (b - 2) / layers, layer = (b - 2) % layers;
	return 2 + layer * GPT2_LAYER_PARAMS + kind;
}

flow_err_t flow_llmc_model_export(const flow_ckpt_t *ckpt, const char *path,
				  flow_dtype_t dtype, flow_diag_t *diag)
{
	if (dtype != FLOW_DTYPE_F32 && dtype != FLOW_DTYPE_BF16)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: llm.c model files hold f32 or bf16",
				     path);
	flow_gpt_config_t cfg;
	gpt2_param_t *params = NULL;
	size_t n = 0;
	flow_err_t err = gpt2_ckpt_params(ckpt, &cfg, &params, &n, diag);
	if (err != FLOW_OK)
		return err;
	flow_atomic_file_t *f = NULL;
	gpt2_reader_t r;
	err = gpt2_reader_init(&r, ckpt, params, n, false, diag);
	if (err == FLOW_OK)
		err = flow_atomic_file_open(path, &f, diag);
	if (err != FLOW_OK)
		goto out_free;
	int32_t hdr[LLMC_HEADER_INTS] = { 0 };
	hdr[0] = FLOW_LLMC_MODEL_MAGIC;
	hdr[1] = dtype == FLOW_DTYPE_F32 ? FLOW_LLMC_MODEL_VERSION_F32 :
					   FLOW_LLMC_MODEL_VERSION_BF16;
	hdr[2] = (int32_t)cfg.seq;
	hdr[3] = (int32_t)cfg.vocab;
	hdr[4] = (int32_t)cfg.layers;
	hdr[5] = (int32_t)cfg.heads;
	hdr[6] = (int32_t)cfg.dim;
	hdr[7] = (int32_t)flow_gpt_padded_vocab(&cfg);
	err = flow_atomic_file_write(f, hdr, sizeof hdr, diag);
	for (size_t b = 0; b < n && err == FLOW_OK; b++) {
		const gpt2_param_t *p = &params[llmc_block(b, cfg.layers)];
		size_t k = gpt2_numel(&p->shape);
		err = gpt2_reader_read(&r, p, p->shape.dims[0], diag);
		if (err == FLOW_OK) {
			gpt2_from_f32(r.vals, k, dtype, r.vals);
			err = flow_atomic_file_write(f, r.vals,
						     k * flow_dtype_size(dtype),
						     diag);
		}
	}
	if (err != FLOW_OK) {
		flow_atomic_file_abort(f);
		goto out_free;
	}
	err = flow_atomic_file_commit(f, diag);
out_free:
	gpt2_reader_release(&r);
	free(params);
	return err;
}

/* The config of an llm.c header, checked: positive sizes within flow's
 * limits, C divisible by H, V <= Vp, and a pad that yields Vp. */
static flow_err_t llmc_config(const char *path, const int32_t *h,
			      flow_gpt_config_t *cfg, flow_diag_t *diag)
{
	for (int i = 2; i <= 7; i++)
		if (h[i] <= 0)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: header int %d is %" PRId32
					     ", not a positive size", path, i,
					     h[i]);
	if (h[3] > h[7])
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: padded vocabulary %" PRId32
				     " is below the vocabulary %" PRId32, path,
				     h[7], h[3]);
	flow_gpt_config_t c = { .layers = (uint32_t)h[4],
				.heads = (uint32_t)h[5],
				.dim = (uint32_t)h[6],
				.vocab = (uint32_t)h[3],
				.seq = (uint32_t)h[2],
				.pad = 128 };
	if (flow_gpt_padded_vocab(&c) != (uint32_t)h[7])
		c.pad = (uint32_t)h[7]; /* V rounded up to Vp is Vp */
	return gpt2_config_check(path, &c, cfg, diag);
}

flow_err_t flow_llmc_model_import(const char *path, const char *step_dir,
				  flow_diag_t *diag)
{
	flow_err_t err;
	gpt2_param_t *params = NULL;
	size_t n = 0;
	flow_ckpt_writer_t *w = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) != 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot open '%s'", path);
		goto out_close;
	}
	uint64_t len = (uint64_t)sb.st_size;
	int32_t h[LLMC_HEADER_INTS];
	if (!S_ISREG(sb.st_mode) || len < LLMC_HEADER_BYTES) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: shorter than the %d-byte llm.c header",
				    path, LLMC_HEADER_BYTES);
		goto out_close;
	}
	err = foreign_pread(fd, path, h, sizeof h, 0, diag);
	if (err != FLOW_OK)
		goto out_close;
	if (h[0] != FLOW_LLMC_MODEL_MAGIC) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: bad magic %" PRId32 " (an llm.c model "
				    "file has %d)", path, h[0],
				    FLOW_LLMC_MODEL_MAGIC);
		goto out_close;
	}
	flow_dtype_t dt;
	if (h[1] == FLOW_LLMC_MODEL_VERSION_F32) {
		dt = FLOW_DTYPE_F32;
	} else if (h[1] == FLOW_LLMC_MODEL_VERSION_BF16) {
		dt = FLOW_DTYPE_BF16;
	} else {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: unknown version %" PRId32 " (3: f32, "
				    "5: bf16)", path, h[1]);
		goto out_close;
	}
	flow_gpt_config_t cfg;
	err = llmc_config(path, h, &cfg, diag);
	if (err == FLOW_OK)
		err = gpt2_params(&cfg, &params, &n, diag);
	if (err != FLOW_OK)
		goto out_close;
	uint64_t want = LLMC_HEADER_BYTES;
	for (size_t i = 0; i < n; i++)
		want += (uint64_t)gpt2_numel(&params[i].shape) *
			flow_dtype_size(dt);
	if (len != want) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: %" PRIu64 " bytes, the header's model "
				    "needs %" PRIu64, path, len, want);
		goto out_free;
	}
	err = flow_ckpt_writer_new(step_dir, 0, &w, diag);
	if (err != FLOW_OK)
		goto out_free;
	uint64_t off = LLMC_HEADER_BYTES;
	for (size_t b = 0; b < n && err == FLOW_OK; b++) {
		const gpt2_param_t *p = &params[llmc_block(b, cfg.layers)];
		size_t k = gpt2_numel(&p->shape);
		float *v = malloc(k * sizeof(float) + 1);
		if (!v) {
			err = flow_diag_set(diag, FLOW_ERR_NOMEM,
					    "out of memory importing '%s'",
					    p->flow);
			break;
		}
		size_t bytes = k * flow_dtype_size(dt);
		err = foreign_pread(fd, path, v, bytes, off, diag);
		off += bytes;
		if (err == FLOW_OK) {
			gpt2_to_f32(v, k, dt, v);
			err = gpt2_write_param(w, p, v, diag);
		}
		free(v);
	}
	if (err != FLOW_OK) {
		flow_ckpt_writer_abort(w);
		goto out_free;
	}
	err = gpt2_commit_weights(w, step_dir, &cfg, diag);
out_free:
	free(params);
out_close:
	if (fd >= 0)
		close(fd);
	return err;
}
