/* zstd helpers: one-shot compression of independent frames, so a reader can
 * seek to any frame and decode it alone. */
#ifndef FLOW_COMPRESS_H
#define FLOW_COMPRESS_H

#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest compressed size of src_len bytes. */
FLOW_EXPORT size_t flow_zstd_bound(size_t src_len);
/* Compress src into one frame (with its content size) at level (1-22, or
 * negative fast levels).  *dst_len_out is the frame length. */
FLOW_EXPORT flow_err_t flow_zstd_compress(void *dst, size_t dst_cap,
					  const void *src, size_t src_len,
					  int level, size_t *dst_len_out,
					  flow_diag_t *diag) FLOW_MUST_CHECK;
/* A compression context kept across frames: compressing many frames
 * through one context saves zstd's per-call allocation and table setup.
 * Not thread-safe: one thread at a time per context (give each thread its
 * own).  Free with flow_zstd_cctx_free(). */
typedef struct flow_zstd_cctx flow_zstd_cctx_t;

/* FLOW_OK and *cctx_out set, or FLOW_ERR_NOMEM. */
FLOW_EXPORT flow_err_t flow_zstd_cctx_new(flow_zstd_cctx_t **cctx_out,
					  flow_diag_t *diag) FLOW_MUST_CHECK;
/* Accepts NULL. */
FLOW_EXPORT void flow_zstd_cctx_free(flow_zstd_cctx_t *cctx);
/* As flow_zstd_compress, through cctx: the frame is byte for byte the one
 * flow_zstd_compress writes for the same src and level, whatever cctx
 * compressed before.  FLOW_ERR_USAGE for a bad level, FLOW_ERR_IO when zstd
 * fails (dst_cap below flow_zstd_bound(src_len) may). */
FLOW_EXPORT flow_err_t flow_zstd_cctx_compress(flow_zstd_cctx_t *cctx,
					       void *dst, size_t dst_cap,
					       const void *src, size_t src_len,
					       int level, size_t *dst_len_out,
					       flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Decompress one whole frame whose content is exactly dst_len bytes;
 * anything else (corrupt frame, other size) is FLOW_ERR_FORMAT. */
FLOW_EXPORT flow_err_t flow_zstd_decompress(void *dst, size_t dst_len,
					    const void *src, size_t src_len,
					    flow_diag_t *diag) FLOW_MUST_CHECK;
/* The content size a frame declares; FLOW_ERR_FORMAT when unknown/corrupt. */
FLOW_EXPORT flow_err_t flow_zstd_frame_content_size(const void *src,
						    size_t src_len,
						    uint64_t *size_out,
						    flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Levels this zstd accepts. */
FLOW_EXPORT int flow_zstd_min_level(void);
FLOW_EXPORT int flow_zstd_max_level(void);

#ifdef __cplusplus
}
#endif

#endif
