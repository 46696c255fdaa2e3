/* Devices and the CUDA module: the loader's outcomes and their one-line
 * messages, and that nothing maps a CUDA library until CUDA is asked for.
 *
 * A process loads the module once, so each loading case runs in a child
 * (fork) that reports its outcome through a pipe. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <config.h>
#include <flow/device.h>
#include <flow/kernels.h>

/* The CUDA libraries a CPU process must never map. */
static const char *const cuda_libraries[] = {
	"libcudart", "libcublas", "libcudnn", "libnccl", "libcuda.so",
	"libflow-cuda",
};

/* The first CUDA library mapped into this process, or NULL. */
static const char *mapped_cuda_library(void)
{
	static char line[4096];
	FILE *f = fopen("/proc/self/maps", "r");
	assert_non_null(f);
	const char *found = NULL;
	while (!found && fgets(line, sizeof line, f))
		for (size_t i = 0; i < sizeof cuda_libraries / sizeof *cuda_libraries; i++)
			if (strstr(line, cuda_libraries[i]))
				found = cuda_libraries[i];
	fclose(f);
	return found;
}

#ifdef HAVE_CUDA
/* Does this machine have an NVIDIA GPU with its driver? */
static bool machine_has_gpu(void)
{
	return access("/dev/nvidia0", F_OK) == 0;
}
#endif

typedef struct outcome {
	flow_err_t err;
	bool loaded;     /* flow_cuda_module_loaded() afterwards */
	bool mapped;     /* a CUDA library mapped afterwards */
	char msg[FLOW_DIAG_MAX];
} outcome_t;

/* flow_cuda_open in a child whose FLOW_CUDA_MODULE is module (NULL:
 * unset). */
static outcome_t open_in_child(const char *module)
{
	outcome_t o;
	int fd[2];
	assert_int_equal(pipe(fd), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		flow_diag_t diag = FLOW_DIAG_INIT;
		memset(&o, 0, sizeof o);
		if (module)
			setenv("FLOW_CUDA_MODULE", module, 1);
		else
			unsetenv("FLOW_CUDA_MODULE");
		o.err = flow_cuda_open(&diag);
		o.loaded = flow_cuda_module_loaded();
		o.mapped = mapped_cuda_library() != NULL;
		snprintf(o.msg, sizeof o.msg, "%s", flow_diag_message(&diag));
		ssize_t n = write(fd[1], &o, sizeof o);
		_exit(n == (ssize_t)sizeof o ? 0 : 1);
	}
	close(fd[1]);
	assert_int_equal(read(fd[0], &o, sizeof o), (ssize_t)sizeof o);
	close(fd[0]);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	return o;
}

static void test_device_kind_names_parse_back(void **state)
{
	(void)state;
	flow_device_kind_t kind = FLOW_DEVICE_CPU;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_device_kind_parse("cuda", &kind, &diag), FLOW_OK);
	assert_int_equal(kind, FLOW_DEVICE_CUDA);
	assert_string_equal(flow_device_kind_name(kind), "cuda");
	assert_int_equal(flow_device_kind_parse("cpu", &kind, &diag), FLOW_OK);
	assert_string_equal(flow_device_kind_name(kind), "cpu");
	assert_int_equal(flow_device_kind_parse("gpu", &kind, &diag),
			 FLOW_ERR_USAGE);
	assert_int_equal(kind, FLOW_DEVICE_CPU);
	assert_string_equal(diag.msg,
			    "unknown device 'gpu' (expected cpu or cuda)");
}

/* CPU work maps nothing of CUDA: libflow does not link it. */
static void test_device_cpu_work_maps_no_cuda_library(void **state)
{
	(void)state;
	float out[4], inp[6] = { 1, 2, 3, 4, 5, 6 }, w[4] = { 1, 0, 0, 1 };
	flow_cpu_kernels.matmul_forward(out, inp, w, NULL, 2, 2, 2);
	assert_true(out[0] == 1 && out[3] == 4);
	assert_null(mapped_cuda_library());
	assert_false(flow_cuda_module_loaded());
}

static void test_device_missing_module_is_one_line(void **state)
{
	(void)state;
	outcome_t o = open_in_child("/nonexistent/libflow-cuda.so");
	assert_int_equal(o.err, FLOW_ERR_NOTSUP);
	assert_false(o.loaded);
	assert_false(o.mapped);
	assert_null(strchr(o.msg, '\n'));
#ifdef HAVE_CUDA
	assert_string_equal(o.msg,
			    "cannot load the CUDA module: /nonexistent/libflow-cuda.so: "
			    "cannot open shared object file: No such file or directory");
#else
	assert_string_equal(o.msg, "this build of flow has no CUDA support "
				   "(configure found no CUDA toolkit)");
#endif
}

/* A library that is not the module (libflow itself) is refused by name. */
static void test_device_foreign_library_is_refused(void **state)
{
	(void)state;
#ifdef HAVE_CUDA
	char path[4200];
	const char *module = flow_cuda_module_path();
	const char *slash = strrchr(module, '/');
	assert_non_null(slash);
	snprintf(path, sizeof path, "%.*s/libflow.so.0", (int)(slash - module),
		 module);
	outcome_t o = open_in_child(path);
	assert_int_equal(o.err, FLOW_ERR_NOTSUP);
	char want[4400];
	snprintf(want, sizeof want,
		 "%s is not a CUDA module of this flow (no flow_cuda_module_entry)",
		 path);
	assert_string_equal(o.msg, want);
	assert_false(o.loaded);
#else
	skip();
#endif
}

/* The module beside libflow loads; the driver decides the rest. */
static void test_device_module_loads_beside_libflow(void **state)
{
	(void)state;
#ifdef HAVE_CUDA
	outcome_t o = open_in_child(NULL);
	assert_true(o.loaded);
	assert_true(o.mapped);
	if (machine_has_gpu()) {
		assert_int_equal(o.err, FLOW_OK);
	} else {
		assert_int_equal(o.err, FLOW_ERR_NOTSUP);
		assert_non_null(strstr(o.msg, "no usable CUDA driver or device: "));
		assert_null(strchr(o.msg, '\n'));
	}
#else
	outcome_t o = open_in_child(NULL);
	assert_int_equal(o.err, FLOW_ERR_NOTSUP);
	assert_false(o.mapped);
#endif
}

/* Every entry point reports the same first failure. */
static void test_device_every_call_repeats_the_failure(void **state)
{
	(void)state;
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		flow_diag_t a = FLOW_DIAG_INIT, b = FLOW_DIAG_INIT;
		void *p = (void *)&a;
		int n = 7;
		setenv("FLOW_CUDA_MODULE", "/nonexistent/libflow-cuda.so", 1);
		bool ok = flow_cuda_alloc(&p, 16, &a) == FLOW_ERR_NOTSUP &&
			  p == (void *)&a &&
			  flow_cuda_count(&n, &b) == FLOW_ERR_NOTSUP && n == 7 &&
			  strcmp(a.msg, b.msg) == 0;
		flow_cuda_release(NULL);
		_exit(ok ? 0 : 1);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* MFU's denominators: NVIDIA's dense datasheet figures, the variant named
 * before the family. */
static void test_device_peak_comes_from_the_datasheet(void **state)
{
	const char *source = "unset";
	(void)state;
	assert_true(flow_cuda_peak_gflops("NVIDIA H200", true, &source) == 989400.0);
	assert_string_equal(source, "H200 SXM datasheet");
	assert_true(flow_cuda_peak_gflops("NVIDIA H200", false, NULL) == 66900.0);
	assert_true(flow_cuda_peak_gflops("NVIDIA H100 80GB HBM3", true, &source) == 989400.0);
	assert_string_equal(source, "H100 SXM5 datasheet");
	assert_true(flow_cuda_peak_gflops("NVIDIA H100 PCIe", true, &source) == 756000.0);
	assert_string_equal(source, "H100 PCIe datasheet");
	assert_true(flow_cuda_peak_gflops("NVIDIA A100-SXM4-80GB", false, NULL) == 19500.0);
	assert_true(flow_cuda_peak_gflops("Tesla T4", true, &source) == 0.0);
	assert_null(source);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_device_kind_names_parse_back),
		cmocka_unit_test(test_device_cpu_work_maps_no_cuda_library),
		cmocka_unit_test(test_device_missing_module_is_one_line),
		cmocka_unit_test(test_device_foreign_library_is_refused),
		cmocka_unit_test(test_device_module_loads_beside_libflow),
		cmocka_unit_test(test_device_every_call_repeats_the_failure),
		cmocka_unit_test(test_device_peak_comes_from_the_datasheet),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
