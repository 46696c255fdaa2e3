/* Devices and the CUDA module loader: libflow's only door to CUDA.  The
 * module (libflow-cuda.so) is dlopen()ed on first use and its one entry
 * point gives the table of lib/device/cuda_module_internal.h; nothing here
 * names a CUDA symbol, so the CPU tools map no CUDA library. */
#include <config.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/caching_alloc.h>
#include <flow/device.h>

#include "cuda_module_internal.h"

#define MODULE_NAME "libflow-cuda.so"

const char *flow_device_kind_name(flow_device_kind_t kind)
{
	return kind == FLOW_DEVICE_CUDA ? "cuda" : "cpu";
}

flow_err_t flow_device_kind_parse(const char *text,
				  flow_device_kind_t *kind_out,
				  flow_diag_t *diag)
{
	if (strcmp(text, "cpu") == 0) {
		*kind_out = FLOW_DEVICE_CPU;
		return FLOW_OK;
	}
	if (strcmp(text, "cuda") == 0) {
		*kind_out = FLOW_DEVICE_CUDA;
		return FLOW_OK;
	}
	return flow_diag_set(diag, FLOW_ERR_USAGE,
			     "unknown device '%.64s' (expected cpu or cuda)",
			     text);
}

/* The one load of the process: its outcome is kept, success or failure,
 * so every caller sees the same answer and the same message. */
static struct {
	pthread_once_t once;
	_Atomic bool tried; /* set once path holds the one the load used */
	const flow_cuda_module_t *module;
	flow_diag_t diag; /* why the module is not there */
	char path[4096];
} load = { .once = PTHREAD_ONCE_INIT };

/* libflow-cuda.so in the directory this library was loaded from, or the
 * bare name (the loader's search path) when that cannot be told. */
static void module_default_path(char *path, size_t size)
{
	Dl_info info;
	snprintf(path, size, "%s", MODULE_NAME);
	if (!dladdr((void *)module_default_path, &info) || !info.dli_fname)
		return;
	const char *slash = strrchr(info.dli_fname, '/');
	if (!slash)
		return;
	int dir = (int)(slash - info.dli_fname);
	snprintf(path, size, "%.*s/%s", dir, info.dli_fname, MODULE_NAME);
}

/* $FLOW_CUDA_MODULE, else beside libflow. */
static void module_path(char *path, size_t size)
{
	const char *env = getenv("FLOW_CUDA_MODULE");
	if (env && *env)
		snprintf(path, size, "%s", env);
	else
		module_default_path(path, size);
}

#ifdef HAVE_CUDA
static void module_load(void)
{
	const char *env = getenv("FLOW_CUDA_MODULE");
	module_path(load.path, sizeof load.path);
	load.tried = true;
	void *handle = dlopen(load.path, RTLD_NOW | RTLD_LOCAL);
	if (!handle && !(env && *env) && strchr(load.path, '/')) {
		/* Not beside libflow (a static or relocated libflow): the
		 * loader's own search path. */
		snprintf(load.path, sizeof load.path, "%s", MODULE_NAME);
		handle = dlopen(load.path, RTLD_NOW | RTLD_LOCAL);
	}
	if (!handle) {
		const char *why = dlerror();
		flow_diag_set(&load.diag, FLOW_ERR_NOTSUP,
			      "cannot load the CUDA module: %s",
			      why ? why : load.path);
		return;
	}
	flow_cuda_module_entry_fn *entry;
	/* POSIX: a data pointer from dlsym converts to a function pointer. */
	*(void **)&entry = dlsym(handle, FLOW_CUDA_MODULE_ENTRY);
	const flow_cuda_module_t *m = entry ? entry(FLOW_CUDA_MODULE_ABI) : NULL;
	if (!entry || !m || m->abi != FLOW_CUDA_MODULE_ABI) {
		flow_diag_set(&load.diag, FLOW_ERR_NOTSUP,
			      "%s is not a CUDA module of this flow (%s)",
			      load.path,
			      entry ? "another ABI version"
				    : "no " FLOW_CUDA_MODULE_ENTRY);
		dlclose(handle);
		return;
	}
	load.module = m; /* the handle stays open for the process */
}
#else
static void module_load(void)
{
	module_path(load.path, sizeof load.path);
	load.tried = true;
	flow_diag_set(&load.diag, FLOW_ERR_NOTSUP,
		      "this build of flow has no CUDA support (configure "
		      "found no CUDA toolkit)");
}
#endif

flow_err_t flow_cuda_module_get(const flow_cuda_module_t **module_out,
				flow_diag_t *diag)
{
	pthread_once(&load.once, module_load);
	if (!load.module)
		return flow_diag_set(diag, load.diag.err, "%s",
				     flow_diag_message(&load.diag));
	*module_out = load.module;
	return FLOW_OK;
}

bool flow_cuda_module_loaded(void)
{
	/* RTLD_NOLOAD: ask the loader, which knows even of a load that did
	 * not go through us. */
	void *h = dlopen(MODULE_NAME, RTLD_NOW | RTLD_NOLOAD);
	if (h)
		dlclose(h);
	return h != NULL;
}

const char *flow_cuda_module_path(void)
{
	static _Thread_local char path[sizeof load.path];
	if (load.tried)
		return load.path;
	module_path(path, sizeof path);
	return path;
}

flow_err_t flow_cuda_count(int *count_out, flow_diag_t *diag)
{
	const flow_cuda_module_t *m = NULL;
	int count = 0;
	flow_err_t err = flow_cuda_module_get(&m, diag);
	if (err == FLOW_OK)
		err = m->device_count(&count, diag);
	if (err == FLOW_OK && count < 1)
		err = flow_diag_set(diag, FLOW_ERR_NOTSUP,
				    "no usable CUDA driver or device: the CUDA "
				    "runtime sees no device%s",
				    getenv("CUDA_VISIBLE_DEVICES")
					    ? " (CUDA_VISIBLE_DEVICES is set)"
					    : "");
	if (err == FLOW_OK)
		*count_out = count;
	return err;
}

flow_err_t flow_cuda_open(flow_diag_t *diag)
{
	int count;
	return flow_cuda_count(&count, diag);
}

flow_err_t flow_cuda_info(int device, flow_cuda_device_info_t *info_out,
			  flow_diag_t *diag)
{
	const flow_cuda_module_t *m = NULL;
	flow_err_t err = flow_cuda_module_get(&m, diag);
	return err ? err : m->device_info(device, info_out, diag);
}

flow_err_t flow_cuda_select(int device, flow_diag_t *diag)
{
	const flow_cuda_module_t *m = NULL;
	flow_err_t err = flow_cuda_module_get(&m, diag);
	return err ? err : m->set_device(device, diag);
}

flow_err_t flow_cuda_alloc(void **ptr_out, size_t bytes, flow_diag_t *diag)
{
	const flow_cuda_module_t *m = NULL;
	flow_err_t err = flow_cuda_module_get(&m, diag);
	return err ? err : m->malloc(ptr_out, bytes, diag);
}

void flow_cuda_release(void *ptr)
{
	const flow_cuda_module_t *m = NULL;
	if (ptr && flow_cuda_module_get(&m, NULL) == FLOW_OK)
		m->free(ptr);
}

flow_err_t flow_cuda_upload(void *dst, const void *src, size_t bytes,
			    flow_diag_t *diag)
{
	const flow_cuda_module_t *m = NULL;
	flow_err_t err = flow_cuda_module_get(&m, diag);
	return err ? err : m->copy_to_device(dst, src, bytes, diag);
}

flow_err_t flow_cuda_download(void *dst, const void *src, size_t bytes,
			      flow_diag_t *diag)
{
	const flow_cuda_module_t *m = NULL;
	flow_err_t err = flow_cuda_module_get(&m, diag);
	return err ? err : m->copy_to_host(dst, src, bytes, diag);
}

flow_err_t flow_cuda_memory_stats(int device, struct flow_alloc_stats *stats_out,
				  flow_diag_t *diag)
{
	const flow_cuda_module_t *m = NULL;
	flow_err_t err = flow_cuda_module_get(&m, diag);
	return err ? err : m->storage_stats(device, stats_out, diag);
}

flow_err_t flow_cuda_attention_paths(uint64_t *cudnn, uint64_t *own,
				     const char **why_own, flow_diag_t *diag)
{
	const flow_cuda_module_t *m = NULL;
	flow_err_t err = flow_cuda_module_get(&m, diag);

	if (err == FLOW_OK)
		m->attention_counts(cudnn, own, why_own);
	return err;
}

/* NVIDIA's published dense (no sparsity) peaks.  Names are matched in
 * order, so the PCIe and NVL variants come before the plain name. */
static const struct gpu_peak {
	const char *match;  /* a substring of cudaDeviceProp.name */
	double bf16, fp32;  /* TFLOP/s */
	const char *source;
} gpu_peaks[] = {
	{ "H100 PCIe", 756.0, 51.2, "H100 PCIe datasheet" },
	{ "H100 NVL", 835.5, 60.0, "H100 NVL datasheet" },
	{ "H100", 989.4, 66.9, "H100 SXM5 datasheet" },
	{ "H200 NVL", 835.5, 60.0, "H200 NVL datasheet" },
	{ "H200", 989.4, 66.9, "H200 SXM datasheet" },
	{ "A100", 312.0, 19.5, "A100 datasheet" },
};

double flow_cuda_peak_gflops(const char *name, bool bf16,
			     const char **source_out)
{
	for (size_t i = 0; i < sizeof gpu_peaks / sizeof *gpu_peaks; i++) {
		if (!strstr(name, gpu_peaks[i].match))
			continue;
		if (source_out)
			*source_out = gpu_peaks[i].source;
		return 1e3 * (bf16 ? gpu_peaks[i].bf16 : gpu_peaks[i].fp32);
	}
	if (source_out)
		*source_out = NULL;
	return 0.0;
}
