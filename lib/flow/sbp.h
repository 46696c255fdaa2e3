/* Meshes, placements, SBP and nd-SBP, and the local shapes they give
 * (flow(7), SBP).
 *
 * A mesh is an n-D array of ranks (1 to FLOW_MESH_MAX_AXES axes) with
 * optional axis names.  Its placement maps mesh coordinates to global
 * ranks affinely: rank(c) = base + sum_i c[i] * stride[i]; the default is
 * row-major from rank 0, "2x4" covering ranks 0..7.  Affine maps cover
 * every placement the runtime makes: a whole mesh, a pipeline stage (a
 * contiguous block: "2x4@8"), and the sub-mesh of one mesh axis (the ranks
 * that differ only in that axis' coordinate, the group a collective of
 * that axis runs on).
 *
 * Text forms:
 *   mesh      DIMS[:NAMES][@BASE[/STRIDES]]   "8", "2x4", "2x4:dp,tp",
 *             "2x4@8", "2@1/4" (ranks 1 and 5)
 *   SBP       "S(k)" split along tensor dimension k, "B" broadcast, "P"
 *             partial sum
 *   nd-SBP    "(S(0),B)": one SBP per mesh axis, outer axis first; a 1-D
 *             nd-SBP may be written without parentheses ("S(0)")
 *
 * Local shapes: mesh axes apply outer to inner, each splitting the CURRENT
 * extent of its tensor dimension into balanced parts (the first n mod k
 * parts get one more element), so (S(0),S(0)) on 2x2 over 6 rows gives
 * 2,1,2,1 rows.  An nd-SBP is invalid for a shape when some split meets an
 * extent smaller than its mesh axis (an empty piece); extent 0 tensors are
 * never split validly. */
#ifndef FLOW_SBP_H
#define FLOW_SBP_H

#include <flow/error.h>
#include <flow/box.h>
#include <flow/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLOW_MESH_MAX_AXES 4
#define FLOW_MESH_NAME_MAX 16
#define FLOW_MESH_TEXT_MAX 128
#define FLOW_SBP_TEXT_MAX 64

typedef struct flow_mesh {
	int ndim;                                  /* 1 .. FLOW_MESH_MAX_AXES */
	int64_t dims[FLOW_MESH_MAX_AXES];          /* >= 1 each */
	char names[FLOW_MESH_MAX_AXES][FLOW_MESH_NAME_MAX]; /* "" unnamed */
	int64_t base;                              /* rank of coords 0 */
	int64_t stride[FLOW_MESH_MAX_AXES];        /* rank step per axis */
} flow_mesh_t;

/* A row-major mesh of ndim axes from rank base, no names. */
FLOW_EXPORT flow_err_t flow_mesh_init(flow_mesh_t *mesh, int ndim,
				      const int64_t *dims, int64_t base,
				      flow_diag_t *diag) FLOW_MUST_CHECK;
/* Parse the text form; FLOW_ERR_USAGE with a one-line message quoting the
 * text ("mesh '2x': expected a size after 'x'"), also for more than
 * FLOW_MESH_MAX_AXES axes, a size < 1, names whose count differs from the
 * axes, duplicate or non-identifier names, or a negative rank. */
FLOW_EXPORT flow_err_t flow_mesh_parse(const char *text, flow_mesh_t *mesh_out,
				       flow_diag_t *diag) FLOW_MUST_CHECK;
/* FLOW_OK when mesh is one flow_mesh_init or flow_mesh_parse could have
 * made (1 to FLOW_MESH_MAX_AXES axes of size >= 1, a base >= 0, strides
 * >= 1 that never repeat a rank); else FLOW_ERR_USAGE naming the first
 * problem.  For meshes built field by field. */
FLOW_EXPORT flow_err_t flow_mesh_check(const flow_mesh_t *mesh,
				       flow_diag_t *diag) FLOW_MUST_CHECK;
/* The text form: names when any is set, @base when non-zero, /strides when
 * not row-major.  Parses back to an equal mesh.  Returns the length
 * needed; writes at most cap bytes including the NUL. */
FLOW_EXPORT size_t flow_mesh_format(const flow_mesh_t *mesh, char *buf,
				    size_t cap);
FLOW_EXPORT bool flow_mesh_equal(const flow_mesh_t *a, const flow_mesh_t *b);
/* Number of ranks. */
FLOW_EXPORT int64_t flow_mesh_size(const flow_mesh_t *mesh);
/* Index of the axis named name, or -1. */
FLOW_EXPORT int flow_mesh_axis(const flow_mesh_t *mesh, const char *name);
/* Global rank of the mesh position with the given row-major index (0 ..
 * size-1), and the inverse: the index of rank, or -1 when the mesh does
 * not cover it. */
FLOW_EXPORT int64_t flow_mesh_rank(const flow_mesh_t *mesh, int64_t index);
FLOW_EXPORT int64_t flow_mesh_index_of(const flow_mesh_t *mesh, int64_t rank);
/* The highest global rank the mesh covers: the corner of its affine
 * placement that takes the last coordinate of every axis (strides are
 * >= 1, flow_mesh_check), so a world of top + 1 ranks holds the mesh. */
FLOW_EXPORT int64_t flow_mesh_top_rank(const flow_mesh_t *mesh);
/* Row-major index <-> coordinates. */
FLOW_EXPORT void flow_mesh_coords(const flow_mesh_t *mesh, int64_t index,
				  int64_t coords_out[FLOW_MESH_MAX_AXES]);
FLOW_EXPORT int64_t flow_mesh_index(const flow_mesh_t *mesh,
				    const int64_t *coords);
/* The sub-mesh of the ranks that share every coordinate of position
 * `index` except those of the axes in axes_mask (bit i: axis i): a mesh of
 * those axes, in order, with the same names and strides.  With one axis
 * it is the group a collective of that axis runs on; with all but one it
 * is a slice of the mesh (a pipeline stage of a "pp" axis). */
FLOW_EXPORT void flow_mesh_group(const flow_mesh_t *mesh, unsigned axes_mask,
				 int64_t index, flow_mesh_t *group_out);

/* ---- SBP ------------------------------------------------------------------ */

typedef enum {
	FLOW_SBP_SPLIT = 0,
	FLOW_SBP_BROADCAST = 1,
	FLOW_SBP_PARTIAL = 2, /* partial sum */
} flow_sbp_kind_t;

typedef struct flow_sbp {
	flow_sbp_kind_t kind;
	int axis; /* tensor dimension, for FLOW_SBP_SPLIT; else 0 */
} flow_sbp_t;

typedef struct flow_nd_sbp {
	int ndim; /* equals the mesh's */
	flow_sbp_t sbp[FLOW_MESH_MAX_AXES];
} flow_nd_sbp_t;

FLOW_EXPORT bool flow_sbp_equal(flow_sbp_t a, flow_sbp_t b);
FLOW_EXPORT bool flow_nd_sbp_equal(const flow_nd_sbp_t *a,
				   const flow_nd_sbp_t *b);
/* Parse "S(1)", "B", "P", or an nd-SBP "(S(0),B)" (spaces allowed after
 * commas); FLOW_ERR_USAGE quoting the text and the position
 * ("nd-SBP '(S(0),Q)': expected S(k), B or P at 'Q'"). */
FLOW_EXPORT flow_err_t flow_nd_sbp_parse(const char *text,
					 flow_nd_sbp_t *sbp_out,
					 flow_diag_t *diag) FLOW_MUST_CHECK;
/* "(S(0),B)"; always parenthesised.  Returns the length needed. */
FLOW_EXPORT size_t flow_nd_sbp_format(const flow_nd_sbp_t *sbp, char *buf,
				      size_t cap);
/* An nd-SBP of ndim copies of one SBP (all-broadcast: the always-valid
 * candidate). */
FLOW_EXPORT void flow_nd_sbp_fill(flow_nd_sbp_t *sbp, int ndim,
				  flow_sbp_t one);

/* ---- local shapes ------------------------------------------------------- */

/* Balanced split of n over k parts: part i gets n/k + (i < n%k), and
 * starts at i*(n/k) + min(i, n%k). */
FLOW_EXPORT void flow_split_part(int64_t n, int64_t k, int64_t i,
				 int64_t *start_out, int64_t *size_out);

/* Is sbp valid for a tensor of this shape on this mesh: as many SBPs as
 * mesh axes, split dimensions < shape.ndim, and every split meets an
 * extent >= its mesh axis.  FLOW_ERR_USAGE naming the first problem
 * ("(S(0),S(0)) on 2x4: dimension 0 of (6,8) has 3 rows left for 4 ranks
 * of axis 1"). */
FLOW_EXPORT flow_err_t flow_nd_sbp_check(const flow_shape_t *shape,
					 const flow_nd_sbp_t *sbp,
					 const flow_mesh_t *mesh,
					 flow_diag_t *diag) FLOW_MUST_CHECK;

/* The box of the logical tensor held by the mesh position with row-major
 * index `index` (sbp must be valid): B and P axes keep the current extent,
 * S(k) axes take their balanced part of it, outer axes first. */
FLOW_EXPORT void flow_nd_sbp_local_box(const flow_shape_t *shape,
				       const flow_nd_sbp_t *sbp,
				       const flow_mesh_t *mesh, int64_t index,
				       flow_box_t *box_out);

/* Largest number of elements any position holds (memory planning). */
FLOW_EXPORT size_t flow_nd_sbp_max_local_numel(const flow_shape_t *shape,
					       const flow_nd_sbp_t *sbp,
					       const flow_mesh_t *mesh);

/* How many times the logical tensor's elements are stored over the mesh:
 * the product of the B and P axes' sizes. */
FLOW_EXPORT int64_t flow_nd_sbp_copies(const flow_nd_sbp_t *sbp,
				       const flow_mesh_t *mesh);

#ifdef __cplusplus
}
#endif

#endif
