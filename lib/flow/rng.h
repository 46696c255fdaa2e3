/* Counter-based random numbers: Philox 4x32-10 (Salmon et al., SC'11).
 *
 * Every value is a pure function of (seed, stream, counter): element i of the
 * tensor with id `stream` is generated from counter i alone, so a rank that
 * holds a slice of a tensor initialises exactly the values a single rank
 * would hold at those indices. */
#ifndef FLOW_RNG_H
#define FLOW_RNG_H

#include <flow/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One Philox 4x32-10 block: 4 words of counter, 2 words of key. */
FLOW_EXPORT void flow_philox4x32_10(const uint32_t ctr[4],
				    const uint32_t key[2], uint32_t out[4]);

/* Key = seed (64 bits); counter = (index low, index high, stream low, stream
 * high).  Returns the 4 random words of that block. */
FLOW_EXPORT void flow_rng_block(uint64_t seed, uint64_t stream,
				uint64_t index, uint32_t out[4]);

/* Uniform in [0, 1) with 24 random bits; element i uses word 0 of block i. */
FLOW_EXPORT float flow_rng_uniform(uint64_t seed, uint64_t stream,
				   uint64_t index);
/* Standard normal for element i: Box-Muller in double on two 53-bit
 * uniforms (u1 from words 0-1 of block i, in (0, 1]; u2 from words 2-3),
 * z = sqrt(-2 ln u1) cos(2 pi u2), rounded once to float. */
FLOW_EXPORT float flow_rng_normal(uint64_t seed, uint64_t stream,
				  uint64_t index);

/* Fill out[j] = mean + std * normal(seed, stream, first + j), j < n.  The
 * values depend only on the element index, never on n or on threads. */
FLOW_EXPORT void flow_rng_fill_normal(float *out, size_t n, uint64_t seed,
				      uint64_t stream, uint64_t first,
				      float mean, float std);
/* Fill out[j] = lo + (hi - lo) * uniform(seed, stream, first + j). */
FLOW_EXPORT void flow_rng_fill_uniform(float *out, size_t n, uint64_t seed,
				       uint64_t stream, uint64_t first,
				       float lo, float hi);

/* A stream id from a tensor name (XXH3-64 of the name), so initialisation
 * does not depend on the order tensors are created in. */
FLOW_EXPORT uint64_t flow_rng_stream_id(const char *name);

#ifdef __cplusplus
}
#endif

#endif
