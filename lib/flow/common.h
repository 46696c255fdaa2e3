/* Macros and small inline helpers shared by every public libflow header. */
#ifndef FLOW_COMMON_H
#define FLOW_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(FLOW_BUILDING_LIBRARY) && defined(__GNUC__)
#define FLOW_EXPORT __attribute__((visibility("default")))
#else
#define FLOW_EXPORT
#endif

#if defined(__GNUC__)
#define FLOW_MUST_CHECK __attribute__((warn_unused_result))
#define FLOW_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define FLOW_MUST_CHECK
#define FLOW_PRINTF(fmt, args)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Overflow-checked size arithmetic: use before every allocation sized from
 * shapes or file headers. Return true and set *out on success; return false
 * (leaving *out untouched) on overflow. */
static inline bool flow_mul_size(size_t a, size_t b, size_t *out)
{
	size_t r;
	if (__builtin_mul_overflow(a, b, &r))
		return false;
	*out = r;
	return true;
}

static inline bool flow_add_size(size_t a, size_t b, size_t *out)
{
	size_t r;
	if (__builtin_add_overflow(a, b, &r))
		return false;
	*out = r;
	return true;
}

#ifdef __cplusplus
}
#endif

#endif
