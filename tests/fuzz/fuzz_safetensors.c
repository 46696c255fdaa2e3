/* Foreign model files (flow/safetensors.h).  The first input byte picks
 * what the rest is (bits 0-1):
 *   0  a safetensors file: flow_st_open, every tensor read, the tensors
 *      in offset order tiling the data; what opens is written again with
 *      the writer and must reopen to the same tensors and bytes
 *   1  an llm.c model file: flow_llmc_model_import; what imports must
 *      open and verify as a checkpoint, and a version-3 (f32) file must
 *      export back to the same header sizes and the same data bytes
 *   2  a Hugging Face directory: config.json, then model.safetensors
 *      (cut at FUZZ_SEPARATOR); flow_hf_gpt2_import, then open and verify
 *   3  the same with model.safetensors.index.json and two files
 *      model-00001-of-00002.safetensors, model-00002-of-00002.safetensors
 *      (config.json, index, file 1, file 2) */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <flow/safetensors.h>

#include "fuzz_util.h"

static void check_opened(flow_st_t *st, const char *path)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	size_t n = flow_st_tensor_count(st);
	uint64_t at = 0;
	flow_st_tensor_t *copy = calloc(n ? n : 1, sizeof *copy);
	void **data = calloc(n ? n : 1, sizeof *data);
	if (!copy || !data)
		fuzz_fail("out of memory");
	for (size_t i = 0; i < n; i++) {
		const flow_st_tensor_t *t = flow_st_tensor_at(st, i);
		if (t->begin != at || t->end < t->begin)
			fuzz_fail("tensor '%s' at [%llu, %llu) after %llu",
				  t->name, (unsigned long long)t->begin,
				  (unsigned long long)t->end,
				  (unsigned long long)at);
		at = t->end;
		if (flow_st_tensor_find(st, t->name) < 0)
			fuzz_fail("tensor '%s' not found by name", t->name);
		data[i] = malloc((size_t)(t->end - t->begin) + 1);
		if (!data[i])
			fuzz_fail("out of memory");
		flow_err_t err = flow_st_read(st, i, data[i], &diag);
		if (err != FLOW_OK)
			fuzz_fail("flow_st_read '%s': %s", t->name,
				  flow_diag_message(&diag));
		copy[i] = *t;
	}
	/* write it again: the same tensors, the same bytes */
	char out[1024];
	fuzz_path(out, sizeof out, "copy.safetensors");
	flow_st_writer_t *w = NULL;
	flow_err_t err = flow_st_writer_new(out, copy, n, NULL, 0, &w, &diag);
	/* names starting "__" other than __metadata__ are kept by readers
	 * but refused by the writer */
	if (err == FLOW_ERR_USAGE)
		goto out_free;
	if (err != FLOW_OK)
		fuzz_fail("flow_st_writer_new: %s", flow_diag_message(&diag));
	for (size_t i = 0; i < n && err == FLOW_OK; i++)
		err = flow_st_writer_put(w, data[i], &diag);
	if (err == FLOW_OK)
		err = flow_st_writer_finish(w, &diag);
	else
		flow_st_writer_abort(w);
	if (err != FLOW_OK)
		fuzz_fail("writing %s: %s", out, flow_diag_message(&diag));
	flow_st_t *again = NULL;
	if (flow_st_open(out, &again, &diag) != FLOW_OK)
		fuzz_fail("reopening %s: %s", out, flow_diag_message(&diag));
	if (flow_st_tensor_count(again) != n)
		fuzz_fail("%zu tensors written, %zu read",
			  n, flow_st_tensor_count(again));
	for (size_t i = 0; i < n; i++) {
		int k = flow_st_tensor_find(again, copy[i].name);
		if (k < 0)
			fuzz_fail("tensor '%s' lost", copy[i].name);
		const flow_st_tensor_t *t = flow_st_tensor_at(again, (size_t)k);
		size_t len = (size_t)(copy[i].end - copy[i].begin);
		if (t->dtype != copy[i].dtype ||
		    !flow_shape_equal(&t->shape, &copy[i].shape) ||
		    t->end - t->begin != len)
			fuzz_fail("tensor '%s' changed", copy[i].name);
		void *b = malloc(len + 1);
		if (!b)
			fuzz_fail("out of memory");
		if (flow_st_read(again, (size_t)k, b, &diag) != FLOW_OK ||
		    memcmp(b, data[i], len) != 0)
			fuzz_fail("tensor '%s': bytes changed", copy[i].name);
		free(b);
	}
	flow_st_free(again);
out_free:
	for (size_t i = 0; i < n; i++)
		free(data[i]);
	free(data);
	free(copy);
	(void)path;
}

static void check_ckpt(const char *step)
{
	flow_ckpt_t *ck = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_ckpt_open(step, &ck, &diag) != FLOW_OK ||
	    flow_ckpt_verify(ck, &diag) != FLOW_OK)
		fuzz_fail("imported checkpoint: %s", flow_diag_message(&diag));
	flow_ckpt_free(ck);
}

static void llmc(const uint8_t *data, size_t size)
{
	char path[1024], step[1024], back[1024];
	fuzz_write(path, sizeof path, "model.bin", data, size);
	fuzz_path(step, sizeof step, "step");
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_llmc_model_import(path, step, &diag);
	fuzz_check_diag("flow_llmc_model_import", err, &diag);
	if (err != FLOW_OK)
		return;
	check_ckpt(step);
	int32_t version;
	memcpy(&version, data + 4, 4);
	if (version != FLOW_LLMC_MODEL_VERSION_F32)
		return;
	flow_ckpt_t *ck = NULL;
	if (flow_ckpt_open(step, &ck, &diag) != FLOW_OK)
		fuzz_fail("%s", flow_diag_message(&diag));
	fuzz_path(back, sizeof back, "back.bin");
	if (flow_llmc_model_export(ck, back, FLOW_DTYPE_F32, &diag) != FLOW_OK)
		fuzz_fail("flow_llmc_model_export: %s",
			  flow_diag_message(&diag));
	flow_ckpt_free(ck);
	FILE *f = fopen(back, "rb");
	uint8_t *b = malloc(size + 1);
	if (!f || !b || fread(b, 1, size + 1, f) != size)
		fuzz_fail("%s: not %zu bytes", back, size);
	fclose(f);
	if (memcmp(b, data, 32) != 0 || memcmp(b + 1024, data + 1024,
					       size - 1024) != 0)
		fuzz_fail("llm.c round trip changed the file");
	free(b);
}

static void hf(const uint8_t *data, size_t size, bool indexed)
{
	static const char *const plain[] = { "config.json",
					     "model.safetensors" };
	static const char *const sharded[] = {
		"config.json", "model.safetensors.index.json",
		"model-00001-of-00002.safetensors",
		"model-00002-of-00002.safetensors",
	};
	const char *const *names = indexed ? sharded : plain;
	size_t max = indexed ? 4 : 2;
	const uint8_t *parts[4];
	size_t lens[4];
	size_t n = fuzz_split(data, size, parts, lens, max);
	char dir[1024], path[1024], step[1024];
	fuzz_path(dir, sizeof dir, "hf");
	if (mkdir(dir, 0755) != 0)
		fuzz_fail("mkdir %s", dir);
	for (size_t i = 0; i < n; i++) {
		char name[256];
		snprintf(name, sizeof name, "hf/%s", names[i]);
		fuzz_write(path, sizeof path, name, parts[i], lens[i]);
	}
	fuzz_path(step, sizeof step, "step");
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_hf_gpt2_import(dir, step, &diag);
	fuzz_check_diag("flow_hf_gpt2_import", err, &diag);
	if (err == FLOW_OK)
		check_ckpt(step);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t opt = fuzz_take_byte(&data, &size);
	fuzz_clean();
	switch (opt & 3) {
	case 0: {
		char path[1024];
		fuzz_write(path, sizeof path, "in.safetensors", data, size);
		flow_st_t *st = NULL;
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_err_t err = flow_st_open(path, &st, &diag);
		fuzz_check_diag("flow_st_open", err, &diag);
		if (err == FLOW_OK) {
			check_opened(st, path);
			flow_st_free(st);
		}
		break;
	}
	case 1:
		llmc(data, size);
		break;
	default:
		hf(data, size, (opt & 3) == 3);
		break;
	}
	fuzz_clean();
	return 0;
}
