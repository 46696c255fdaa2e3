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

/* The staged storage's copy stream and events are the host's: a copy is
 * done on return, before any kernel that could wait for it, and so is
 * all work an event could mark.  They are there so that the trainer's
 * device path for batches runs on the CPU, calls and all. */
static void host_copy_ahead(void *dst, const void *src, size_t bytes,
			    void *after, void *done)
{
	(void)after;
	(void)done;
	host_copy(dst, src, bytes);
}

static void *host_event_new(void)
{
	return flow_alloc(1);
}

static void host_event_done(void *event)
{
	(void)event;
}

static void *host_staging(size_t bytes)
{
	return flow_alloc(bytes ? bytes : 1);
}

/* Host memory through and through; the two storages differ only in what
 * they tell the executor.  The host's has no events: its kernels have
 * finished when they return. */
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
	.event_new = host_event_new,
	.event_record = host_event_done,
	.event_wait = host_event_done,
	.event_free = flow_free,
	.copy_in_ahead = host_copy_ahead,
	.kernels_wait = host_event_done,
};
