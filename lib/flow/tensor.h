/* Dtypes, shapes and host tensors.
 *
 * A tensor is a typed view of a 64-byte aligned buffer: a dtype, a shape of up
 * to FLOW_MAX_DIMS dimensions, element strides and an element offset.  Tensors
 * made by flow_tensor_new own their buffer; views share it (the buffer is
 * reference counted, so a view may outlive the tensor it came from). */
#ifndef FLOW_TENSOR_H
#define FLOW_TENSOR_H

#include <string.h>

#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Stable numbers: used in file formats. */
typedef enum {
	FLOW_DTYPE_F32 = 0,
	FLOW_DTYPE_BF16 = 1,
	FLOW_DTYPE_F16 = 2,
	FLOW_DTYPE_I32 = 3,
	FLOW_DTYPE_I64 = 4,
	FLOW_DTYPE_U16 = 5,
	FLOW_DTYPE_U8 = 6,
	FLOW_DTYPE_U32 = 7, /* token ids of vocabularies beyond 65536 */
} flow_dtype_t;

#define FLOW_DTYPE_COUNT 8

/* Bytes per element; 0 for an unknown dtype. */
FLOW_EXPORT size_t flow_dtype_size(flow_dtype_t dtype);
/* "f32", "bf16", "f16", "i32", "i64", "u16", "u8", "u32"; NULL when
 * unknown. */
FLOW_EXPORT const char *flow_dtype_name(flow_dtype_t dtype);
/* Inverse of flow_dtype_name (also accepts "float32", "bfloat16",
 * "float16", "int32", "int64", "uint16", "uint8", "uint32"). */
FLOW_EXPORT flow_err_t flow_dtype_parse(const char *text,
					flow_dtype_t *dtype_out,
					flow_diag_t *diag) FLOW_MUST_CHECK;

/* fp32 <-> bf16 / f16 with round-to-nearest-even; NaN stays NaN (quiet),
 * overflow rounds to infinity, f16 subnormals are exact. */
FLOW_EXPORT uint16_t flow_f32_to_bf16(float x);
FLOW_EXPORT float flow_bf16_to_f32(uint16_t x);
/* x rounded to the nearest bf16 (ties to even) and back: the float whose
 * bits are flow_f32_to_bf16(x) << 16.  Inline and branch-free, so that a
 * loop rounding a whole tensor (bf16 mixed precision on the CPU)
 * vectorises; flow_f32_to_bf16 is this. */
static inline float flow_round_bf16(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof(u));
	const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
	/* NaN: keep it, made quiet; else add 0x7fff plus the bit that becomes
	 * the lsb, which rounds to nearest even. */
	u = is_nan ? u | 0x00400000u : u + 0x7fffu + ((u >> 16) & 1u);
	u &= 0xffff0000u;
	memcpy(&x, &u, sizeof(x));
	return x;
}
/* A bfloat16 as stored: the high half of an fp32's bits (the bits
 * flow_f32_to_bf16 gives).  The bf16 activations of mixed precision
 * (flow/kernels.h) are arrays of these. */
typedef uint16_t flow_bf16_t;
/* Inline and branch-free twins of flow_bf16_to_f32 and flow_f32_to_bf16,
 * for kernels' loops: the exact value of h, and x rounded to nearest
 * even. */
static inline float flow_bf16_widen(flow_bf16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float x;
	memcpy(&x, &u, sizeof(x));
	return x;
}
static inline flow_bf16_t flow_bf16_narrow(float x)
{
	uint32_t u;
	x = flow_round_bf16(x);
	memcpy(&u, &x, sizeof(u));
	return (flow_bf16_t)(u >> 16);
}
FLOW_EXPORT uint16_t flow_f32_to_f16(float x);
FLOW_EXPORT float flow_f16_to_f32(uint16_t x);

/* Element i of buf, an array of dtype, as a double (exact for every
 * dtype but i64 values beyond 2^53); 0 for an unknown dtype.  The one
 * per-dtype reader: flow_tensor_get and the boxing check use it. */
FLOW_EXPORT double flow_dtype_load(const void *buf, size_t i,
				   flow_dtype_t dtype);
/* Store value as element i of buf, an array of dtype: floats round to
 * nearest even (bf16 and f16 through f32); integers are value truncated
 * toward zero, which must be in the dtype's range.  Nothing for an
 * unknown dtype. */
FLOW_EXPORT void flow_dtype_store(void *buf, size_t i, flow_dtype_t dtype,
				  double value);

#define FLOW_MAX_DIMS 8

typedef struct flow_shape {
	int ndim;
	int64_t dims[FLOW_MAX_DIMS];
} flow_shape_t;

/* Build a shape; FLOW_ERR_USAGE for ndim outside [0, FLOW_MAX_DIMS] or a
 * negative dimension. */
FLOW_EXPORT flow_err_t flow_shape_init(flow_shape_t *shape, int ndim,
				       const int64_t *dims, flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Number of elements (1 for a scalar); FLOW_ERR_RANGE on overflow. */
FLOW_EXPORT flow_err_t flow_shape_numel(const flow_shape_t *shape,
					size_t *numel_out, flow_diag_t *diag)
	FLOW_MUST_CHECK;
FLOW_EXPORT bool flow_shape_equal(const flow_shape_t *a, const flow_shape_t *b);
/* Text form "(2,3,4)"; "()" for a scalar.  Writes at most cap bytes
 * including the NUL; returns the length the whole text needs. */
FLOW_EXPORT size_t flow_shape_format(const flow_shape_t *shape, char *buf,
				     size_t cap);
/* Parse "2,3,4", "2x3x4" or "(2,3,4)"; "()" is a scalar. */
FLOW_EXPORT flow_err_t flow_shape_parse(const char *text,
					flow_shape_t *shape_out,
					flow_diag_t *diag) FLOW_MUST_CHECK;
/* Parse the input and output shapes of an op, "IN1;IN2;...->OUT1;...",
 * each as flow_shape_parse reads it; an input written '-' or left empty
 * is an absent optional one.  in, in_present and out are caller buffers
 * with room for max shapes each.  Returns FLOW_OK, with the inputs in
 * in[0..*nin_out) and in_present[0..*nin_out) (an absent input: false,
 * and a shape of ndim 0) and the outputs in out[0..*nout_out).  Else
 * *nin_out and *nout_out are untouched, the buffers may be partly
 * written, and diag has (FLOW_ERR_FORMAT) "expected IN;...->OUT;... in
 * 'TEXT'", "shape too long in 'TEXT'" (one of 128 characters or more),
 * "more than MAX inputs in 'TEXT'" (or outputs), "missing output shape in
 * 'TEXT'" or flow_shape_parse's message, or (FLOW_ERR_RANGE) "shape 'S'
 * has too many elements". */
FLOW_EXPORT flow_err_t flow_shape_io_parse(const char *text, int max,
					   flow_shape_t *in, bool *in_present,
					   int *nin_out, flow_shape_t *out,
					   int *nout_out,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

typedef struct flow_buffer flow_buffer_t;

typedef struct flow_tensor {
	flow_dtype_t dtype;
	flow_shape_t shape;
	int64_t strides[FLOW_MAX_DIMS]; /* in elements */
	size_t offset;                  /* in elements, from the buffer start */
	flow_buffer_t *buffer;          /* reference-counted storage */
} flow_tensor_t;

/* A new contiguous tensor, zero-filled.  Free with flow_tensor_free(). */
FLOW_EXPORT flow_err_t flow_tensor_new(flow_dtype_t dtype,
				       const flow_shape_t *shape,
				       flow_tensor_t **tensor_out,
				       flow_diag_t *diag) FLOW_MUST_CHECK;
/* Drop this tensor's reference to its buffer and free it; NULL is ignored. */
FLOW_EXPORT void flow_tensor_free(flow_tensor_t *tensor);
/* Pointer to element 0 of the view; borrowed while any tensor on the
 * buffer lives. */
FLOW_EXPORT void *flow_tensor_data(const flow_tensor_t *tensor);
FLOW_EXPORT size_t flow_tensor_numel(const flow_tensor_t *tensor);
/* Size of the elements (numel * dtype size), whether contiguous or not. */
FLOW_EXPORT size_t flow_tensor_nbytes(const flow_tensor_t *tensor);
FLOW_EXPORT bool flow_tensor_is_contiguous(const flow_tensor_t *tensor);

/* Views sharing t's buffer.  Free each with flow_tensor_free(). */
/* Elements [start, start+len) of dimension dim. */
FLOW_EXPORT flow_err_t flow_tensor_slice(const flow_tensor_t *t, int dim,
					 int64_t start, int64_t len,
					 flow_tensor_t **view_out,
					 flow_diag_t *diag) FLOW_MUST_CHECK;
/* Dimensions a and b swapped. */
FLOW_EXPORT flow_err_t flow_tensor_transpose(const flow_tensor_t *t, int a,
					     int b, flow_tensor_t **view_out,
					     flow_diag_t *diag) FLOW_MUST_CHECK;
/* Same elements, new shape; t must be contiguous and numel must agree. */
FLOW_EXPORT flow_err_t flow_tensor_reshape(const flow_tensor_t *t,
					   const flow_shape_t *shape,
					   flow_tensor_t **view_out,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

/* Copy elements of src into dst (same shape, any strides), converting dtype
 * (floats round to nearest even; integer targets must be in range, else
 * FLOW_ERR_RANGE and dst is partly written). */
FLOW_EXPORT flow_err_t flow_tensor_copy(flow_tensor_t *dst,
					const flow_tensor_t *src,
					flow_diag_t *diag) FLOW_MUST_CHECK;
/* Element at a flat row-major logical index, as double (flow_dtype_load;
 * for tests and checks, not hot paths). */
FLOW_EXPORT double flow_tensor_get(const flow_tensor_t *t, size_t index);
/* Set element at a flat row-major logical index (rounded to the dtype, as
 * flow_dtype_store does). */
FLOW_EXPORT void flow_tensor_set(flow_tensor_t *t, size_t index, double value);

#ifdef __cplusplus
}
#endif

#endif
