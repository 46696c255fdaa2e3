/* zstd one-frame helpers. */
#include <config.h>

#include <stdlib.h>

#include <zstd.h>

#include <flow/compress.h>

size_t flow_zstd_bound(size_t src_len)
{
	return ZSTD_compressBound(src_len);
}

int flow_zstd_min_level(void)
{
	return ZSTD_minCLevel();
}

int flow_zstd_max_level(void)
{
	return ZSTD_maxCLevel();
}

struct flow_zstd_cctx {
	ZSTD_CCtx *zc;
};

static flow_err_t check_level(int level, flow_diag_t *diag)
{
	if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel() || level == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid zstd level '%d' (expected %d..-1 or 1..%d)",
				     level, ZSTD_minCLevel(), ZSTD_maxCLevel());
	return FLOW_OK;
}

static flow_err_t compress_result(size_t n, size_t *dst_len_out,
				  flow_diag_t *diag)
{
	if (ZSTD_isError(n))
		return flow_diag_set(diag, FLOW_ERR_IO, "zstd compression failed: %s",
				     ZSTD_getErrorName(n));
	*dst_len_out = n;
	return FLOW_OK;
}

flow_err_t flow_zstd_compress(void *dst, size_t dst_cap, const void *src,
			      size_t src_len, int level, size_t *dst_len_out,
			      flow_diag_t *diag)
{
	flow_err_t err = check_level(level, diag);
	if (err != FLOW_OK)
		return err;
	return compress_result(ZSTD_compress(dst, dst_cap, src, src_len, level),
			       dst_len_out, diag);
}

flow_err_t flow_zstd_cctx_new(flow_zstd_cctx_t **cctx_out, flow_diag_t *diag)
{
	flow_zstd_cctx_t *c = malloc(sizeof(*c));
	if (!c || !(c->zc = ZSTD_createCCtx())) {
		free(c);
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory for a zstd context");
	}
	*cctx_out = c;
	return FLOW_OK;
}

void flow_zstd_cctx_free(flow_zstd_cctx_t *cctx)
{
	if (!cctx)
		return;
	ZSTD_freeCCtx(cctx->zc);
	free(cctx);
}

flow_err_t flow_zstd_cctx_compress(flow_zstd_cctx_t *cctx, void *dst,
				   size_t dst_cap, const void *src,
				   size_t src_len, int level,
				   size_t *dst_len_out, flow_diag_t *diag)
{
	flow_err_t err = check_level(level, diag);
	if (err != FLOW_OK)
		return err;
	/* ZSTD_compress is ZSTD_compressCCtx on a fresh context, and
	 * ZSTD_compressCCtx sets every parameter from level and src_len
	 * (ignoring anything a previous call left), so the frames match. */
	return compress_result(ZSTD_compressCCtx(cctx->zc, dst, dst_cap, src,
						 src_len, level),
			       dst_len_out, diag);
}

flow_err_t flow_zstd_frame_content_size(const void *src, size_t src_len,
					uint64_t *size_out, flow_diag_t *diag)
{
	unsigned long long size = ZSTD_getFrameContentSize(src, src_len);
	if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "not a zstd frame with a known content size");
	*size_out = size;
	return FLOW_OK;
}

flow_err_t flow_zstd_decompress(void *dst, size_t dst_len, const void *src,
				size_t src_len, flow_diag_t *diag)
{
	uint64_t declared;
	flow_err_t err = flow_zstd_frame_content_size(src, src_len, &declared,
						      diag);
	if (err != FLOW_OK)
		return err;
	if (declared != dst_len)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "zstd frame holds %llu bytes, expected %zu",
				     (unsigned long long)declared, dst_len);
	size_t n = ZSTD_decompress(dst, dst_len, src, src_len);
	if (ZSTD_isError(n))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "corrupt zstd frame: %s",
				     ZSTD_getErrorName(n));
	if (n != dst_len)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "zstd frame decoded to %zu bytes, expected %zu",
				     n, dst_len);
	return FLOW_OK;
}
