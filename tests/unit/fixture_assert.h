/* The fixtures of tests/ref/fixtures (fixture.h) as the kernel tests read
 * them: a fixture or array that is not there, or not of the shape asked,
 * fails the running cmocka test with the reader's line.  For a test that
 * includes <cmocka.h> first. */
#ifndef FLOW_TEST_FIXTURE_ASSERT_H
#define FLOW_TEST_FIXTURE_ASSERT_H

#include <stdint.h>

#include "fixture.h"

static inline void fixture_load(flow_fixture_t *fx, const char *name)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	if (flow_fixture_load(fx, name, &diag) != FLOW_OK)
		fail_msg("%s", flow_diag_message(&diag));
}

static inline const void *fixture_need(const flow_fixture_t *fx,
				       const char *name,
				       flow_fixture_dtype_t dtype, size_t ndim,
				       const size_t *dims)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	const void *p = flow_fixture_get(fx, name, dtype, ndim, dims, &diag);

	if (!p)
		fail_msg("fixture: %s", flow_diag_message(&diag));
	return p;
}

#define NDIMS(...) (sizeof((size_t[]){ __VA_ARGS__ }) / sizeof(size_t))
/* F32(fx, "name", d0, d1, ...): the array with exactly that shape. */
#define F32(fx, name, ...)                                                 \
	((const float *)fixture_need(fx, name, FLOW_FIXTURE_F32,           \
				     NDIMS(__VA_ARGS__),                   \
				     (size_t[]){ __VA_ARGS__ }))
#define I32(fx, name, ...)                                                 \
	((const int32_t *)fixture_need(fx, name, FLOW_FIXTURE_I32,         \
				       NDIMS(__VA_ARGS__),                 \
				       (size_t[]){ __VA_ARGS__ }))

/* A scalar: ndim 0. */
static inline float fixture_scalar(const flow_fixture_t *fx, const char *name)
{
	return *(const float *)fixture_need(fx, name, FLOW_FIXTURE_F32, 0,
					    NULL);
}

/* The "dims" array every fixture carries: its sizes. */
static inline const int32_t *fixture_dims(const flow_fixture_t *fx, size_t n)
{
	return I32(fx, "dims", n);
}

#endif
