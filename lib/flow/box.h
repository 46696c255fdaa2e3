/* Boxes: rectangular pieces of a logical tensor.
 *
 * A box is what one rank holds of a distributed tensor (flow/sbp.h), what
 * one checkpoint shard stores (flow/ckpt.h) and what one boxing message
 * carries (flow/boxing.h).  A box's elements are laid out row-major over
 * the box itself, so a buffer holding box b has flow_box_numel(b)
 * elements, and element k of it is the logical element flow_box_element
 * names.  Every box function here is pure and thread-safe; none checks
 * that a box lies inside a shape unless it says so (flow_box_inside). */
#ifndef FLOW_BOX_H
#define FLOW_BOX_H

#include <flow/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Dimension d spans [start[d], start[d] + extent[d]).  A box of ndim 0 is
 * the one element of a scalar. */
typedef struct flow_box {
	int ndim;
	int64_t start[FLOW_MAX_DIMS];
	int64_t extent[FLOW_MAX_DIMS];
} flow_box_t;

/* The whole of shape as a box (every start 0, extents the dimensions). */
FLOW_EXPORT void flow_box_whole(const flow_shape_t *shape, flow_box_t *box_out);

/* Elements of a box (1 for ndim 0, 0 when an extent is 0).  The product
 * is not checked for overflow: boxes come from shapes whose element
 * counts were checked, or from flow_box_inside. */
FLOW_EXPORT int64_t flow_box_numel(const flow_box_t *box);

/* Same ndim, starts and extents. */
FLOW_EXPORT bool flow_box_equal(const flow_box_t *a, const flow_box_t *b);

/* Whether box lies inside shape: the same number of dimensions, and in
 * each, 0 <= start and start + extent <= the dimension (extents >= 0). */
FLOW_EXPORT bool flow_box_inside(const flow_box_t *box,
				 const flow_shape_t *shape);

/* The intersection of two boxes of one tensor (same ndim): true and
 * *out set when it holds at least one element; false, *out untouched,
 * when it is empty.  For ndim 0 the intersection is the scalar. */
FLOW_EXPORT bool flow_box_intersect(const flow_box_t *a, const flow_box_t *b,
				    flow_box_t *out);

/* The k-th element (row-major, 0 <= k < flow_box_numel(box)) of box in
 * a tensor of shape: returns its row-major logical index, and writes its
 * coordinates to pos_out when pos_out is not NULL. */
FLOW_EXPORT int64_t flow_box_element(const flow_shape_t *shape,
				     const flow_box_t *box, int64_t k,
				     int64_t pos_out[FLOW_MAX_DIMS]);

/* What flow_box_apply does with each run: n elements from src to dst
 * (the runs never overlap within one call), with the caller's ctx. */
typedef void flow_box_run_fn(void *dst, const void *src, size_t n, void *ctx);

/* Walk region, a box inside both sbox and dbox, in row-major order of
 * runs: for each run of contiguous elements call run(dst + where it is in
 * dbox's row-major layout, src + where it is in sbox's, its length, ctx).
 * Trailing dimensions that region, sbox and dbox all span whole are
 * merged into one run, so a whole-tensor region is one call.  elsize is
 * the bytes of one element. */
FLOW_EXPORT void flow_box_apply(void *dst, const flow_box_t *dbox,
				const void *src, const flow_box_t *sbox,
				const flow_box_t *region, size_t elsize,
				flow_box_run_fn *run, void *ctx);

/* flow_box_apply with memcpy: copy region's elements from src (laid out
 * row-major as sbox) into dst (laid out as dbox). */
FLOW_EXPORT void flow_box_copy(void *dst, const flow_box_t *dbox,
			       const void *src, const flow_box_t *sbox,
			       const flow_box_t *region, size_t elsize);

#ifdef __cplusplus
}
#endif

#endif
