/* The loader's epoch permutation, private to libflow and its unit tests.
 *
 * Static inline so that tests/unit/test_loader.c can check it on many
 * domain sizes without a dataset and without libflow exporting it.
 *
 * Construction (the exact definition; changing any of it changes every
 * training run's sample order):
 *
 *   1. Epoch key.  (k0, k1, k2, k3) = Philox4x32-10 with
 *        counter = (checksum lo, checksum hi, epoch lo, epoch hi),
 *        key     = (seed lo, seed hi),
 *      where checksum is the manifest checksum and lo/hi are the low and
 *      high 32 bits of a 64-bit value.
 *   2. Domain.  b = max(2, ceil(log2 N)) bits, the smallest power of two
 *      2^b >= N (and >= 4, so both halves below have at least one bit).
 *      The value x in [0, 2^b) is split into a left half L = x >> rb of
 *      lb = floor(b / 2) bits and a right half R = x & (2^rb - 1) of
 *      rb = b - lb bits (both at most 32).
 *   3. Rounds.  For i = 0, 1, ..., 7 (FLOW_LOADER_FEISTEL_ROUNDS):
 *        f = word 0 of Philox4x32-10 with counter = (R, i, k2, k3) and
 *            key = (k0, k1),
 *        (L, R) <- (R, (L xor f) mod 2^width(L)),
 *      an unbalanced Feistel round: the halves swap places and widths.
 *      After the even number of rounds the widths are back to (lb, rb) and
 *      the result is L << rb | R.  Each round is invertible (given the new
 *      pair, the old R is the new L and the old L is the new R xor f), so
 *      the network is a bijection on [0, 2^b).
 *   4. Cycle walking.  perm(x) applies the network to x, then again to its
 *      output, until the value is below N.  Restricted to [0, N) this is a
 *      bijection (each cycle of the network is walked in order, skipping
 *      the values >= N); since 2^b < 2N for N > 2, it takes fewer than two
 *      network evaluations on average.
 *
 * Memory: O(1).  Any index is computed directly.  Thread-safe (pure). */
#ifndef FLOW_LOADER_INTERNAL_H
#define FLOW_LOADER_INTERNAL_H

#include <flow/rng.h>

#define FLOW_LOADER_FEISTEL_ROUNDS 8

typedef struct flow_loader_perm {
	uint64_t n;         /* the domain [0, n), n >= 1 */
	unsigned lbits;     /* width of the left half */
	unsigned rbits;     /* width of the right half (>= lbits) */
	uint32_t key[4];    /* (k0, k1, k2, k3) of the epoch */
} flow_loader_perm_t;

/* The permutation of [0, n) for (checksum, seed, epoch); n >= 1. */
static inline void flow_loader_perm_init(flow_loader_perm_t *perm, uint64_t n,
					 uint64_t checksum, uint64_t seed,
					 uint64_t epoch)
{
	const uint32_t ctr[4] = { (uint32_t)checksum,
				  (uint32_t)(checksum >> 32),
				  (uint32_t)epoch, (uint32_t)(epoch >> 32) };
	const uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
	unsigned bits = 2;
	while (bits < 64 && (UINT64_C(1) << bits) < n)
		bits++;
	perm->n = n;
	perm->lbits = bits / 2;
	perm->rbits = bits - bits / 2;
	flow_philox4x32_10(ctr, key, perm->key);
}

/* One pass of the Feistel network over [0, 2^(lbits + rbits)). */
static inline uint64_t flow_loader_perm_network(const flow_loader_perm_t *perm,
						uint64_t x)
{
	const uint32_t key[2] = { perm->key[0], perm->key[1] };
	unsigned wl = perm->lbits, wr = perm->rbits;
	uint32_t l = (uint32_t)(x >> wr);
	uint32_t r = (uint32_t)(x & ((UINT64_C(1) << wr) - 1));
	for (uint32_t i = 0; i < FLOW_LOADER_FEISTEL_ROUNDS; i++) {
		const uint32_t ctr[4] = { r, i, perm->key[2], perm->key[3] };
		uint32_t f[4];
		flow_philox4x32_10(ctr, key, f);
		uint32_t nr = (uint32_t)((l ^ f[0]) &
					 ((UINT64_C(1) << wl) - 1));
		l = r;
		r = nr;
		unsigned w = wl;
		wl = wr;
		wr = w;
	}
	return (uint64_t)l << wr | r;
}

/* The image of index (< n) under the permutation, in [0, n). */
static inline uint64_t flow_loader_perm_apply(const flow_loader_perm_t *perm,
					      uint64_t index)
{
	uint64_t x = index;
	do
		x = flow_loader_perm_network(perm, x);
	while (x >= perm->n);
	return x;
}

#endif
