/* Reader for the FLOWFIX1 kernel test fixtures written by
 * tests/ref/fixture.py (format in tests/ref/README.md): named float32/int32
 * arrays, validated in full when read, looked up by name and shape. */
#ifndef FLOW_TEST_FIXTURE_H
#define FLOW_TEST_FIXTURE_H

#include <flow/common.h>
#include <flow/error.h>

#define FLOW_FIXTURE_MAX_NDIM 8
#define FLOW_FIXTURE_MAX_ARRAYS 4096

typedef enum {
	FLOW_FIXTURE_F32 = 1,
	FLOW_FIXTURE_I32 = 2,
} flow_fixture_dtype_t;

typedef struct flow_fixture_array {
	char name[256];
	flow_fixture_dtype_t dtype;
	size_t ndim;
	size_t dims[FLOW_FIXTURE_MAX_NDIM];
	size_t count; /* product of dims (1 for a scalar) */
	void *data;   /* count host-endian floats or int32s, 64-byte aligned */
} flow_fixture_array_t;

typedef struct flow_fixture {
	size_t narrays;
	flow_fixture_array_t *arrays;
} flow_fixture_t;

/* Read and validate the fixture at path into fx (caller-embedded).  Returns
 * FLOW_OK, or FLOW_ERR_IO / FLOW_ERR_FORMAT / FLOW_ERR_CHECKSUM /
 * FLOW_ERR_NOMEM with one line in diag naming the file and the byte offset
 * of the first problem; fx is filled only on success.  Release with
 * flow_fixture_release(). */
FLOW_MUST_CHECK flow_err_t flow_fixture_read(flow_fixture_t *fx,
					     const char *path,
					     flow_diag_t *diag);

/* The committed fixture name: tests/ref/fixtures/<name>.bin of the
 * source tree ($top_srcdir, "." when unset), read as flow_fixture_read
 * does. */
FLOW_MUST_CHECK flow_err_t flow_fixture_load(flow_fixture_t *fx,
					     const char *name,
					     flow_diag_t *diag);

/* Free the arrays; accepts a zeroed or already-released fixture. */
void flow_fixture_release(flow_fixture_t *fx);

/* The array called name, or NULL when there is none. */
const flow_fixture_array_t *flow_fixture_find(const flow_fixture_t *fx,
					      const char *name);

/* The data of array name when it exists with dtype and exactly the shape
 * (ndim, dims); otherwise NULL with the reason in diag.  Borrowed: valid
 * until flow_fixture_release(). */
const void *flow_fixture_get(const flow_fixture_t *fx, const char *name,
			     flow_fixture_dtype_t dtype, size_t ndim,
			     const size_t *dims, flow_diag_t *diag);

#endif
