/* Host memory: 64-byte aligned allocation for tensors and kernel scratch. */
#ifndef FLOW_MEM_H
#define FLOW_MEM_H

#include <flow/common.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLOW_ALIGNMENT 64

/* Allocate bytes (rounded up to a multiple of FLOW_ALIGNMENT) aligned to
 * FLOW_ALIGNMENT; NULL when out of memory.  bytes == 0 gives a valid,
 * unique pointer.  Free with flow_free(). */
FLOW_EXPORT void *flow_alloc(size_t bytes);
/* As flow_alloc(count * size) with the product overflow-checked and the
 * memory zeroed; NULL on overflow or out of memory. */
FLOW_EXPORT void *flow_calloc(size_t count, size_t size);
/* Free memory from flow_alloc/flow_calloc; NULL is ignored. */
FLOW_EXPORT void flow_free(void *ptr);

#ifdef __cplusplus
}
#endif

#endif
