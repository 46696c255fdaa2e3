/* Aligned host allocation: tensors and kernel scratch start on a cache line
 * (and an AVX-512 vector) boundary. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <flow/mem.h>

void *flow_alloc(size_t bytes)
{
	size_t rounded;
	if (!flow_add_size(bytes, FLOW_ALIGNMENT - 1, &rounded))
		return NULL;
	rounded &= ~(size_t)(FLOW_ALIGNMENT - 1);
	if (rounded == 0)
		rounded = FLOW_ALIGNMENT;
	return aligned_alloc(FLOW_ALIGNMENT, rounded);
}

void *flow_calloc(size_t count, size_t size)
{
	size_t bytes;
	if (!flow_mul_size(count, size, &bytes))
		return NULL;
	void *ptr = flow_alloc(bytes);
	if (ptr)
		memset(ptr, 0, bytes);
	return ptr;
}

void flow_free(void *ptr)
{
	free(ptr);
}
