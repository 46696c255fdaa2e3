/* Private helpers shared by the CPU kernels (lib/kernels/cpu/): the fixed
 * work partitions that make every reduction independent of the number of
 * OpenMP threads, and a portable restrict spelling for the hot loops. */
#ifndef FLOW_CPU_INTERNAL_H
#define FLOW_CPU_INTERNAL_H

#include <stddef.h>

/* Column (channel) block owned by one thread in the column reductions
 * (matmul dbias, layernorm dweight/dbias, embedding dwte/dwpe): one thread
 * sums a whole column in row order, so the bits never depend on how many
 * threads share the blocks.  64 floats = 4 cache lines per row, enough to
 * vectorise and to keep the per-block accumulators in registers/L1. */
#define FLOW_CPU_COL_BLOCK 64

/* Elements per partial sum in flow_cpu_sum_squares: the partials are summed
 * in chunk order, so the result is the same for any thread count. */
#define FLOW_CPU_SQ_CHUNK ((size_t)65536)

/* Partials held on the stack at once by flow_cpu_sum_squares (it loops over
 * groups of this many chunks, so n is unbounded without a heap buffer). */
#define FLOW_CPU_SQ_GROUP 256

/* Floats per (b,h) slice of attention-backward scratch, rounded up so every
 * slice starts on a 64-byte boundary like the scratch itself. */
static inline size_t flow_cpu_attention_row_stride(size_t T)
{
	return (T + 15) & ~(size_t)15;
}

#endif
