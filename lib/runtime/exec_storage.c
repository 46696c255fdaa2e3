/* The executor's storages in host memory (flow/exec.h): the host's, of
 * the CPU and reference kernel sets, and the staged one that plays a
 * device, over flow/mem.h's aligned allocation. */
#include <config.h>

#include <string.h>

#include <flow/exec.h>
#include <flow/mem.h>

static void *host_alloc(size_t bytes)
{
	return flow_calloc(1, bytes);
}

static void host_zero(void *ptr, size_t bytes)
{
	memset(ptr, 0, bytes);
}

static void host_copy(void *dst, const void *src, size_t bytes)
{
	if (bytes)
		memcpy(dst, src, bytes);
}

static void *host_staging(size_t bytes)
{
	return flow_alloc(bytes ? bytes : 1);
}

/* Host memory through and through; the two storages differ only in what
 * they tell the executor.  No events: host kernels have finished when
 * they return. */
#define HOST_MEMORY                                                          \
	.alloc = host_alloc, .free = flow_free, .zero = host_zero,           \
	.copy_in = host_copy, .copy_out = host_copy, .copy = host_copy,      \
	.host_alloc = host_staging, .host_free = flow_free

const flow_exec_storage_t flow_exec_storage_host = {
	.name = "host",
	.host_addressable = true,
	.host_memory = true,
	HOST_MEMORY,
};

const flow_exec_storage_t flow_exec_storage_staged = {
	.name = "staged",
	.host_addressable = false,
	.host_memory = true,
	HOST_MEMORY,
};
