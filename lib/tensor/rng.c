/* Philox 4x32-10: a counter-based generator, so element i of a tensor is
 * computable without generating elements 0..i-1.  Constants from Salmon,
 * Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3". */
#include <config.h>

#include <math.h>

#include <flow/checksum.h>
#include <flow/rng.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void flow_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
			uint32_t out[4])
{
	uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
	uint32_t k0 = key[0], k1 = key[1];
	for (int round = 0; round < 10; round++) {
		uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
		uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
		uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
		uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
		c0 = hi1 ^ c1 ^ k0;
		c1 = lo1;
		c2 = hi0 ^ c3 ^ k1;
		c3 = lo0;
		k0 += PHILOX_W0;
		k1 += PHILOX_W1;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

void flow_rng_block(uint64_t seed, uint64_t stream, uint64_t index,
		    uint32_t out[4])
{
	const uint32_t ctr[4] = { (uint32_t)index, (uint32_t)(index >> 32),
				  (uint32_t)stream, (uint32_t)(stream >> 32) };
	const uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
	flow_philox4x32_10(ctr, key, out);
}

float flow_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint32_t r[4];
	flow_rng_block(seed, stream, index, r);
	/* 24 bits fill a float mantissa exactly, so the result is < 1. */
	return (float)(r[0] >> 8) * 0x1p-24f;
}

/* 53 random bits from two words, as a double in [0, 1). */
static double unit53(uint32_t hi, uint32_t lo)
{
	uint64_t bits = ((uint64_t)hi << 32 | lo) >> 11;
	return (double)bits * 0x1p-53;
}

float flow_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint32_t r[4];
	flow_rng_block(seed, stream, index, r);
	double u1 = 1.0 - unit53(r[0], r[1]); /* (0, 1]: log is finite */
	double u2 = unit53(r[2], r[3]);
	return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void flow_rng_fill_normal(float *out, size_t n, uint64_t seed,
			  uint64_t stream, uint64_t first, float mean,
			  float std)
{
#pragma omp parallel for schedule(static) if (n > 65536)
	for (size_t j = 0; j < n; j++)
		out[j] = mean + std * flow_rng_normal(seed, stream, first + j);
}

void flow_rng_fill_uniform(float *out, size_t n, uint64_t seed,
			   uint64_t stream, uint64_t first, float lo, float hi)
{
#pragma omp parallel for schedule(static) if (n > 65536)
	for (size_t j = 0; j < n; j++)
		out[j] = lo + (hi - lo) * flow_rng_uniform(seed, stream,
							   first + j);
}

uint64_t flow_rng_stream_id(const char *name)
{
	return flow_checksum(name, strlen(name));
}
