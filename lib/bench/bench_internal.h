/* Private helpers of lib/bench/bench.c: the buffer set each benchmark allocates and
 * frees in one place, and the timing loop.  Not installed. */
#ifndef FLOW_BENCH_INTERNAL_H
#define FLOW_BENCH_INTERNAL_H

#include <time.h>

#include <flow/bench.h>

/* Every buffer of one benchmark run, freed together by bench_bufs_release()
 * when the run is over: a bench function has no cleanup of its own however
 * many tensors it needs. */
#define BENCH_MAX_BUFS 24

typedef struct bench_bufs {
	void *ptr[BENCH_MAX_BUFS];
	size_t count;
} bench_bufs_t;

/* Monotonic time in microseconds. */
static inline double bench_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Run PREPARE; CALL for cfg->warmup + cfg->iters rounds and store the time of
 * each timed CALL (PREPARE is never timed: it restores inputs that a kernel
 * overwrites in place) in samples[0 .. cfg->iters). */
#define BENCH_TIME_CALLS(cfg, samples, PREPARE, CALL)                         \
	do {                                                                  \
		unsigned bench_total_ = (cfg)->warmup + (cfg)->iters;         \
		for (unsigned bench_it_ = 0; bench_it_ < bench_total_;        \
		     bench_it_++) {                                           \
			PREPARE;                                              \
			double bench_t0_ = bench_now_us();                    \
			CALL;                                                 \
			double bench_t1_ = bench_now_us();                    \
			if (bench_it_ >= (cfg)->warmup)                       \
				(samples)[bench_it_ - (cfg)->warmup] =        \
					bench_t1_ - bench_t0_;                \
		}                                                             \
	} while (0)

/* As BENCH_TIME_CALLS for two calls that alternate round by round, timing
 * each into its own samples: a comparison of A with B is then exposed to
 * the same load.  The order swaps every round (A B, B A, ...), so that
 * neither always finds the caches as the other left them (for resln's
 * backward at 8192x768, beyond the last-level cache, a fixed order moved
 * the ratio by about 5%: 0.95-0.99 against 1.00-1.04). */
#define BENCH_TIME_PAIR(cfg, samples_a, samples_b, CALL_A, CALL_B)            \
	do {                                                                  \
		unsigned bench_total_ = (cfg)->warmup + (cfg)->iters;         \
		for (unsigned bench_it_ = 0; bench_it_ < bench_total_;        \
		     bench_it_++) {                                           \
			double bench_ta_, bench_tb_, bench_t0_, bench_t1_;    \
			if (bench_it_ & 1) {                                  \
				bench_t0_ = bench_now_us();                   \
				CALL_B;                                       \
				bench_t1_ = bench_now_us();                   \
				CALL_A;                                       \
				bench_ta_ = bench_now_us() - bench_t1_;       \
				bench_tb_ = bench_t1_ - bench_t0_;            \
			} else {                                              \
				bench_t0_ = bench_now_us();                   \
				CALL_A;                                       \
				bench_t1_ = bench_now_us();                   \
				CALL_B;                                       \
				bench_ta_ = bench_t1_ - bench_t0_;            \
				bench_tb_ = bench_now_us() - bench_t1_;       \
			}                                                     \
			if (bench_it_ >= (cfg)->warmup) {                     \
				unsigned bench_i_ = bench_it_ - (cfg)->warmup; \
				(samples_a)[bench_i_] = bench_ta_;            \
				(samples_b)[bench_i_] = bench_tb_;            \
			}                                                     \
		}                                                             \
	} while (0)

#endif
