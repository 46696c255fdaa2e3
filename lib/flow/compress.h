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
