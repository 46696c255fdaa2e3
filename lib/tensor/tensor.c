/* Dtypes, half-precision conversion, shapes and strided host tensors. */
#include <config.h>

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <flow/mem.h>
#include <flow/tensor.h>

/* ---- dtypes ---------------------------------------------------------------- */

static const struct {
	const char *name;
	const char *long_name;
	size_t size;
} dtype_info[FLOW_DTYPE_COUNT] = {
	[FLOW_DTYPE_F32] = { "f32", "float32", 4 },
	[FLOW_DTYPE_BF16] = { "bf16", "bfloat16", 2 },
	[FLOW_DTYPE_F16] = { "f16", "float16", 2 },
	[FLOW_DTYPE_I32] = { "i32", "int32", 4 },
	[FLOW_DTYPE_I64] = { "i64", "int64", 8 },
	[FLOW_DTYPE_U16] = { "u16", "uint16", 2 },
	[FLOW_DTYPE_U8] = { "u8", "uint8", 1 },
	[FLOW_DTYPE_U32] = { "u32", "uint32", 4 },
};

static bool dtype_valid(flow_dtype_t dtype)
{
	return (int)dtype >= 0 && (int)dtype < FLOW_DTYPE_COUNT;
}

size_t flow_dtype_size(flow_dtype_t dtype)
{
	return dtype_valid(dtype) ? dtype_info[dtype].size : 0;
}

const char *flow_dtype_name(flow_dtype_t dtype)
{
	return dtype_valid(dtype) ? dtype_info[dtype].name : NULL;
}

flow_err_t flow_dtype_parse(const char *text, flow_dtype_t *dtype_out,
			    flow_diag_t *diag)
{
	for (int i = 0; i < FLOW_DTYPE_COUNT; i++) {
		if (strcmp(text, dtype_info[i].name) == 0 ||
		    strcmp(text, dtype_info[i].long_name) == 0) {
			*dtype_out = (flow_dtype_t)i;
			return FLOW_OK;
		}
	}
	return flow_diag_set(diag, FLOW_ERR_FORMAT,
			     "unknown dtype '%s' (expected f32, bf16, f16, i32, i64, u16, u8 or u32)",
			     text);
}

/* ---- half precision ------------------------------------------------------------ */

static uint32_t f32_bits(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof(u));
	return u;
}

static float f32_from_bits(uint32_t u)
{
	float x;
	memcpy(&x, &u, sizeof(x));
	return x;
}

uint16_t flow_f32_to_bf16(float x)
{
	return flow_bf16_narrow(x);
}

float flow_bf16_to_f32(uint16_t x)
{
	return flow_bf16_widen(x);
}

/* Round m >> shift to nearest, ties to even (shift >= 1). */
static uint32_t shift_round_even(uint32_t m, unsigned shift)
{
	uint32_t q = m >> shift;
	uint32_t rem = m & ((1u << shift) - 1u);
	uint32_t half = 1u << (shift - 1);
	if (rem > half || (rem == half && (q & 1u)))
		q++;
	return q;
}

uint16_t flow_f32_to_f16(float x)
{
	uint32_t u = f32_bits(x);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t a = u & 0x7fffffffu;
	if (a > 0x7f800000u) /* NaN, quiet, keeping the top payload bits */
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x477ff000u) /* >= 65520 (and inf) rounds to infinity */
		return (uint16_t)(sign | 0x7c00u);
	if (a < 0x38800000u) { /* below 2^-14: an f16 subnormal or zero */
		uint32_t e = a >> 23;
		if (e < 102) /* below 2^-25: rounds to zero */
			return sign;
		uint32_t m = (a & 0x7fffffu) | 0x800000u;
		/* value = m * 2^(e-150); in units of 2^-24 that is m >> (126-e) */
		return (uint16_t)(sign | shift_round_even(m, 126 - e));
	}
	/* Normal: rebias the exponent (127 -> 15) and round off 13 bits; a
	 * carry out of the mantissa correctly bumps the exponent. */
	return (uint16_t)(sign | shift_round_even(a - 0x38000000u, 13));
}

float flow_f16_to_f32(uint16_t x)
{
	uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
	uint32_t exp = (x >> 10) & 0x1fu, mant = x & 0x3ffu;
	if (exp == 0) {
		float v = (float)mant * 0x1p-24f; /* exact */
		return sign ? -v : v;
	}
	if (exp == 31)
		return f32_from_bits(sign | 0x7f800000u | (mant << 13));
	return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* ---- one element of a raw buffer ----------------------------------------------- */

double flow_dtype_load(const void *buf, size_t i, flow_dtype_t dtype)
{
	switch (dtype) {
	case FLOW_DTYPE_F32: return ((const float *)buf)[i];
	case FLOW_DTYPE_BF16: return flow_bf16_to_f32(((const uint16_t *)buf)[i]);
	case FLOW_DTYPE_F16: return flow_f16_to_f32(((const uint16_t *)buf)[i]);
	case FLOW_DTYPE_I32: return ((const int32_t *)buf)[i];
	case FLOW_DTYPE_I64: return (double)((const int64_t *)buf)[i];
	case FLOW_DTYPE_U16: return ((const uint16_t *)buf)[i];
	case FLOW_DTYPE_U8: return ((const uint8_t *)buf)[i];
	case FLOW_DTYPE_U32: return ((const uint32_t *)buf)[i];
	}
	return 0;
}

void flow_dtype_store(void *buf, size_t i, flow_dtype_t dtype, double value)
{
	switch (dtype) {
	case FLOW_DTYPE_F32: ((float *)buf)[i] = (float)value; break;
	case FLOW_DTYPE_BF16: ((uint16_t *)buf)[i] = flow_f32_to_bf16((float)value); break;
	case FLOW_DTYPE_F16: ((uint16_t *)buf)[i] = flow_f32_to_f16((float)value); break;
	case FLOW_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)value; break;
	case FLOW_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)value; break;
	case FLOW_DTYPE_U16: ((uint16_t *)buf)[i] = (uint16_t)value; break;
	case FLOW_DTYPE_U8: ((uint8_t *)buf)[i] = (uint8_t)value; break;
	case FLOW_DTYPE_U32: ((uint32_t *)buf)[i] = (uint32_t)value; break;
	}
}

/* ---- shapes --------------------------------------------------------------------- */

flow_err_t flow_shape_init(flow_shape_t *shape, int ndim, const int64_t *dims,
			   flow_diag_t *diag)
{
	if (ndim < 0 || ndim > FLOW_MAX_DIMS)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid rank %d (at most %d dimensions)",
				     ndim, FLOW_MAX_DIMS);
	for (int i = 0; i < ndim; i++)
		if (dims[i] < 0)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "invalid dimension %lld",
					     (long long)dims[i]);
	shape->ndim = ndim;
	for (int i = 0; i < FLOW_MAX_DIMS; i++)
		shape->dims[i] = i < ndim ? dims[i] : 0;
	return FLOW_OK;
}

flow_err_t flow_shape_numel(const flow_shape_t *shape, size_t *numel_out,
			    flow_diag_t *diag)
{
	size_t n = 1;
	for (int i = 0; i < shape->ndim; i++)
		if (!flow_mul_size(n, (size_t)shape->dims[i], &n))
			return flow_diag_set(diag, FLOW_ERR_RANGE,
					     "shape has too many elements");
	*numel_out = n;
	return FLOW_OK;
}

bool flow_shape_equal(const flow_shape_t *a, const flow_shape_t *b)
{
	if (a->ndim != b->ndim)
		return false;
	for (int i = 0; i < a->ndim; i++)
		if (a->dims[i] != b->dims[i])
			return false;
	return true;
}

size_t flow_shape_format(const flow_shape_t *shape, char *buf, size_t cap)
{
	size_t len = 0;
	char tmp[32];
	for (int i = -1; i <= shape->ndim; i++) {
		int n;
		if (i < 0)
			n = snprintf(tmp, sizeof(tmp), "(");
		else if (i == shape->ndim)
			n = snprintf(tmp, sizeof(tmp), ")");
		else
			n = snprintf(tmp, sizeof(tmp), "%s%lld", i ? "," : "",
				     (long long)shape->dims[i]);
		if (cap > len)
			snprintf(buf + len, cap - len, "%s", tmp);
		len += (size_t)n;
	}
	return len;
}

flow_err_t flow_shape_parse(const char *text, flow_shape_t *shape_out,
			    flow_diag_t *diag)
{
	size_t len = strlen(text);
	const char *p = text;
	if (len >= 2 && text[0] == '(' && text[len - 1] == ')') {
		p = text + 1;
		len -= 2;
	}
	flow_shape_t shape = { 0 };
	while (len > 0) {
		if (shape.ndim == FLOW_MAX_DIMS)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "invalid shape '%s': more than %d dimensions",
					     text, FLOW_MAX_DIMS);
		int64_t v = 0;
		size_t digits = 0;
		while (digits < len && p[digits] >= '0' && p[digits] <= '9') {
			if (v > (INT64_MAX - 9) / 10)
				goto bad;
			v = v * 10 + (p[digits] - '0');
			digits++;
		}
		if (digits == 0)
			goto bad;
		shape.dims[shape.ndim++] = v;
		p += digits;
		len -= digits;
		if (len == 0)
			break;
		if (*p != ',' && *p != 'x')
			goto bad;
		p++;
		len--;
		if (len == 0)
			goto bad;
	}
	*shape_out = shape;
	return FLOW_OK;
bad:
	return flow_diag_set(diag, FLOW_ERR_FORMAT,
			     "invalid shape '%s': expected dimensions like 2,3,4",
			     text);
}

/* One side of flow_shape_io_parse's text, [p, end) of text: its shapes
 * into shapes[] and, for inputs, present[] (NULL for outputs, which must
 * all be there); the count into *n_out. */
static flow_err_t shape_io_side(const char *text, const char *p,
				const char *end, int max, flow_shape_t *shapes,
				bool *present, int *n_out, flow_diag_t *diag)
{
	int n = 0;
	for (;;) {
		size_t len = strcspn(p, ";");
		if (p + len > end)
			len = (size_t)(end - p);
		char item[128];
		if (len >= sizeof(item))
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "shape too long in '%s'", text);
		memcpy(item, p, len);
		item[len] = '\0';
		if (n == max)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "more than %d %s in '%s'", max,
					     present ? "inputs" : "outputs", text);
		if (len == 0 || strcmp(item, "-") == 0) {
			if (!present)
				return flow_diag_set(diag, FLOW_ERR_FORMAT,
						     "missing output shape in '%s'",
						     text);
			present[n] = false;
			shapes[n].ndim = 0;
		} else {
			size_t numel;
			flow_err_t err = flow_shape_parse(item, &shapes[n], diag);
			if (err != FLOW_OK)
				return err;
			if (flow_shape_numel(&shapes[n], &numel, NULL) != FLOW_OK)
				return flow_diag_set(diag, FLOW_ERR_RANGE,
						     "shape '%s' has too many elements",
						     item);
			if (present)
				present[n] = true;
		}
		n++;
		p += len;
		if (p >= end)
			break;
		p++; /* the ';' */
	}
	*n_out = n;
	return FLOW_OK;
}

flow_err_t flow_shape_io_parse(const char *text, int max, flow_shape_t *in,
			       bool *in_present, int *nin_out,
			       flow_shape_t *out, int *nout_out,
			       flow_diag_t *diag)
{
	const char *arrow = strstr(text, "->");
	if (!arrow)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "expected IN;...->OUT;... in '%s'", text);
	int nin, nout;
	flow_err_t err = shape_io_side(text, text, arrow, max, in, in_present,
				       &nin, diag);
	if (err == FLOW_OK)
		err = shape_io_side(text, arrow + 2, arrow + strlen(arrow), max,
				    out, NULL, &nout, diag);
	if (err != FLOW_OK)
		return err;
	*nin_out = nin;
	*nout_out = nout;
	return FLOW_OK;
}

/* ---- tensors --------------------------------------------------------------------- */

struct flow_buffer {
	atomic_size_t refs;
	size_t bytes;
	void *data;
};

static void buffer_unref(flow_buffer_t *buf)
{
	if (buf && atomic_fetch_sub(&buf->refs, 1) == 1) {
		flow_free(buf->data);
		free(buf);
	}
}

static void set_contiguous_strides(flow_tensor_t *t)
{
	int64_t stride = 1;
	for (int i = t->shape.ndim - 1; i >= 0; i--) {
		t->strides[i] = stride;
		stride *= t->shape.dims[i] ? t->shape.dims[i] : 1;
	}
}

flow_err_t flow_tensor_new(flow_dtype_t dtype, const flow_shape_t *shape,
			   flow_tensor_t **tensor_out, flow_diag_t *diag)
{
	size_t numel, bytes;
	if (!dtype_valid(dtype))
		return flow_diag_set(diag, FLOW_ERR_USAGE, "invalid dtype %d",
				     (int)dtype);
	flow_err_t err = flow_shape_numel(shape, &numel, diag);
	if (err != FLOW_OK)
		return err;
	if (!flow_mul_size(numel, flow_dtype_size(dtype), &bytes))
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "tensor too large");
	flow_tensor_t *t = calloc(1, sizeof(*t));
	flow_buffer_t *buf = calloc(1, sizeof(*buf));
	void *data = flow_calloc(bytes, 1);
	if (!t || !buf || !data) {
		free(t);
		free(buf);
		flow_free(data);
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory allocating %zu bytes",
				     bytes);
	}
	atomic_init(&buf->refs, 1);
	buf->bytes = bytes;
	buf->data = data;
	t->dtype = dtype;
	t->shape = *shape;
	t->buffer = buf;
	set_contiguous_strides(t);
	*tensor_out = t;
	return FLOW_OK;
}

void flow_tensor_free(flow_tensor_t *tensor)
{
	if (!tensor)
		return;
	buffer_unref(tensor->buffer);
	free(tensor);
}

void *flow_tensor_data(const flow_tensor_t *tensor)
{
	return (char *)tensor->buffer->data +
	       tensor->offset * flow_dtype_size(tensor->dtype);
}

size_t flow_tensor_numel(const flow_tensor_t *tensor)
{
	size_t n = 1;
	for (int i = 0; i < tensor->shape.ndim; i++)
		n *= (size_t)tensor->shape.dims[i]; /* checked at creation */
	return n;
}

size_t flow_tensor_nbytes(const flow_tensor_t *tensor)
{
	return flow_tensor_numel(tensor) * flow_dtype_size(tensor->dtype);
}

bool flow_tensor_is_contiguous(const flow_tensor_t *tensor)
{
	int64_t stride = 1;
	for (int i = tensor->shape.ndim - 1; i >= 0; i--) {
		if (tensor->shape.dims[i] != 1 && tensor->strides[i] != stride)
			return false;
		stride *= tensor->shape.dims[i];
	}
	return true;
}

static flow_err_t view_new(const flow_tensor_t *t, flow_tensor_t **view_out,
			   flow_diag_t *diag)
{
	flow_tensor_t *v = malloc(sizeof(*v));
	if (!v)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	*v = *t;
	atomic_fetch_add(&v->buffer->refs, 1);
	*view_out = v;
	return FLOW_OK;
}

flow_err_t flow_tensor_slice(const flow_tensor_t *t, int dim, int64_t start,
			     int64_t len, flow_tensor_t **view_out,
			     flow_diag_t *diag)
{
	if (dim < 0 || dim >= t->shape.ndim)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid dimension %d for a rank-%d tensor",
				     dim, t->shape.ndim);
	if (start < 0 || len < 0 || start > t->shape.dims[dim] ||
	    len > t->shape.dims[dim] - start)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "slice [%lld, %lld) outside dimension %d of extent %lld",
				     (long long)start, (long long)(start + len),
				     dim, (long long)t->shape.dims[dim]);
	flow_tensor_t *v = NULL;
	flow_err_t err = view_new(t, &v, diag);
	if (err != FLOW_OK)
		return err;
	v->offset += (size_t)(start * t->strides[dim]);
	v->shape.dims[dim] = len;
	*view_out = v;
	return FLOW_OK;
}

flow_err_t flow_tensor_transpose(const flow_tensor_t *t, int a, int b,
				 flow_tensor_t **view_out, flow_diag_t *diag)
{
	if (a < 0 || b < 0 || a >= t->shape.ndim || b >= t->shape.ndim)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid dimensions %d, %d for a rank-%d tensor",
				     a, b, t->shape.ndim);
	flow_tensor_t *v = NULL;
	flow_err_t err = view_new(t, &v, diag);
	if (err != FLOW_OK)
		return err;
	v->shape.dims[a] = t->shape.dims[b];
	v->shape.dims[b] = t->shape.dims[a];
	v->strides[a] = t->strides[b];
	v->strides[b] = t->strides[a];
	*view_out = v;
	return FLOW_OK;
}

flow_err_t flow_tensor_reshape(const flow_tensor_t *t,
			       const flow_shape_t *shape,
			       flow_tensor_t **view_out, flow_diag_t *diag)
{
	size_t numel;
	flow_err_t err = flow_shape_numel(shape, &numel, diag);
	if (err != FLOW_OK)
		return err;
	if (numel != flow_tensor_numel(t))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot reshape %zu elements into %zu",
				     flow_tensor_numel(t), numel);
	if (!flow_tensor_is_contiguous(t))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot reshape a non-contiguous view");
	flow_tensor_t *v = NULL;
	err = view_new(t, &v, diag);
	if (err != FLOW_OK)
		return err;
	v->shape = *shape;
	set_contiguous_strides(v);
	*view_out = v;
	return FLOW_OK;
}

/* Element offset (from the buffer start) of flat row-major index i. */
static size_t element_offset(const flow_tensor_t *t, size_t index)
{
	size_t off = t->offset;
	for (int d = t->shape.ndim - 1; d >= 0; d--) {
		size_t extent = (size_t)t->shape.dims[d];
		off += (index % extent) * (size_t)t->strides[d];
		index /= extent;
	}
	return off;
}

/* Integer range of an integer dtype; false for floating dtypes. */
static bool int_range(flow_dtype_t dtype, double *lo, double *hi)
{
	switch (dtype) {
	case FLOW_DTYPE_I32: *lo = INT32_MIN; *hi = INT32_MAX; return true;
	case FLOW_DTYPE_I64: *lo = -0x1p63; *hi = 0x1p63; return true;
	case FLOW_DTYPE_U16: *lo = 0; *hi = UINT16_MAX; return true;
	case FLOW_DTYPE_U8: *lo = 0; *hi = UINT8_MAX; return true;
	case FLOW_DTYPE_U32: *lo = 0; *hi = UINT32_MAX; return true;
	default: return false;
	}
}

double flow_tensor_get(const flow_tensor_t *t, size_t index)
{
	return flow_dtype_load(t->buffer->data, element_offset(t, index),
			       t->dtype);
}

void flow_tensor_set(flow_tensor_t *t, size_t index, double value)
{
	flow_dtype_store(t->buffer->data, element_offset(t, index), t->dtype,
			 value);
}

flow_err_t flow_tensor_copy(flow_tensor_t *dst, const flow_tensor_t *src,
			    flow_diag_t *diag)
{
	if (!flow_shape_equal(&dst->shape, &src->shape))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot copy between different shapes");
	size_t n = flow_tensor_numel(src);
	double lo, hi;
	bool to_int = int_range(dst->dtype, &lo, &hi);
	/* i64 values beyond 2^53 do not survive a trip through double. */
	if (dst->dtype == src->dtype && dst->dtype == FLOW_DTYPE_I64) {
		for (size_t i = 0; i < n; i++)
			((int64_t *)dst->buffer->data)[element_offset(dst, i)] =
				((const int64_t *)src->buffer->data)[element_offset(src, i)];
		return FLOW_OK;
	}
	for (size_t i = 0; i < n; i++) {
		double v = flow_tensor_get(src, i);
		if (to_int && (isnan(v) || v < lo || v >= hi + 1 ||
			       v != trunc(v)))
			return flow_diag_set(diag, FLOW_ERR_RANGE,
					     "element %zu (%g) does not fit in %s",
					     i, v, flow_dtype_name(dst->dtype));
		flow_tensor_set(dst, i, v);
	}
	return FLOW_OK;
}
