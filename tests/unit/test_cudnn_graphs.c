/* cuDNN's fused attention graphs (lib/kernels/cuda/attention_cudnn.c) as
 * far as a machine without a GPU can take them: every tensor and operation
 * descriptor of the forward and backward graphs finalizes, which is where
 * cuDNN checks shapes, strides and types; each operation graph finalizes
 * (how the operations connect); and cuDNN's heuristics, asked for an H200
 * and an A100 described in JSON (cuDNN's device properties), count an
 * engine config for each graph; for GPT-2's sizes and random ones.  The
 * heuristics are lenient (a graph computing something else can count
 * one), so this checks structure, not numbers.  Building and running the plans needs a GPU:
 * tests/gpu/test_cuda_kernels runs them against the CPU.  Built with the
 * CUDA module; skipped where cuDNN cannot be opened. */
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
#include <flow/kernels_cuda.h>

/* splitmix64: a reproducible stream of sizes. */
static uint64_t next_u64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static size_t below(uint64_t *s, size_t n)
{
	return (size_t)(next_u64(s) % n);
}

/* The GPUs the heuristics are asked about, as cudaDeviceProp reports
 * them (the H200's as the proof machine's: 132 SMs, 143771 MiB). */
static const char *const h200 =
	"{\"maxGridSize\": [2147483647, 65535, 65535], \"maxBlockSize\": "
	"[1024, 1024, 64], \"regsPerBlock\": 65536, \"multiProcessorCount\": "
	"132, \"warpSize\": 32, \"maxSharedMemoryPerBlock\": 49152, "
	"\"maxSharedMemoryPerBlockOptin\": 232448, "
	"\"reservedSharedMemoryPerBlock\": 1024, \"maxRegistersPerSM\": "
	"65536, \"maxCtasPerSM\": 32, \"maxThreadsPerBlock\": 1024, "
	"\"maxThreadsPerSM\": 2048, \"pciDeviceId\": 0, \"isTccDriver\": 0, "
	"\"supportCoopLaunch\": 1, \"smClockRateKHz\": 1980000, "
	"\"memClockRateKHz\": 3201000, \"l2CacheSize\": 62914560, "
	"\"deviceName\": \"NVIDIA H200\", \"totalGlobalMem\": "
	"150754820096, \"cudaDeviceId\": 0, \"deviceVer\": 900, "
	"\"driverVer\": 13000}";
static const char *const a100 =
	"{\"maxGridSize\": [2147483647, 65535, 65535], \"maxBlockSize\": "
	"[1024, 1024, 64], \"regsPerBlock\": 65536, \"multiProcessorCount\": "
	"108, \"warpSize\": 32, \"maxSharedMemoryPerBlock\": 49152, "
	"\"maxSharedMemoryPerBlockOptin\": 166912, "
	"\"reservedSharedMemoryPerBlock\": 1024, \"maxRegistersPerSM\": "
	"65536, \"maxCtasPerSM\": 32, \"maxThreadsPerBlock\": 1024, "
	"\"maxThreadsPerSM\": 2048, \"pciDeviceId\": 0, \"isTccDriver\": 0, "
	"\"supportCoopLaunch\": 1, \"smClockRateKHz\": 1410000, "
	"\"memClockRateKHz\": 1593000, \"l2CacheSize\": 41943040, "
	"\"deviceName\": \"NVIDIA A100-SXM4-80GB\", \"totalGlobalMem\": "
	"85089730560, \"cudaDeviceId\": 0, \"deviceVer\": 800, "
	"\"driverVer\": 13000}";

/* The check, or a skip when this machine has no cuDNN to ask. */
static void graphs_build_for(size_t B, size_t T, size_t C, size_t NH,
			     const char *device)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err =
		flow_cuda_attention_cudnn_check(B, T, C, NH, device, &diag);

	if (err == FLOW_ERR_NOTSUP) {
		print_message("skipped: %s\n", flow_diag_message(&diag));
		skip();
	}
	if (err != FLOW_OK)
		fail_msg("B=%zu T=%zu C=%zu NH=%zu: %s", B, T, C, NH,
			 flow_diag_message(&diag));
}

static void graphs_build(size_t B, size_t T, size_t C, size_t NH)
{
	graphs_build_for(B, T, C, NH, NULL);
	graphs_build_for(B, T, C, NH, h200);
	graphs_build_for(B, T, C, NH, a100);
}

/* First, in a child that has not opened cuDNN yet: FLOW_CUDNN=0 keeps it
 * closed, and says so. */
static void test_cudnn_graphs_turned_off_by_environment(void **state)
{
	int fds[2], status = 0;
	char msg[256] = "";
	pid_t pid;
	ssize_t n;

	(void)state;
	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_err_t err;
		const char *m;

		close(fds[0]);
		setenv("FLOW_CUDNN", "0", 1);
		err = flow_cuda_attention_cudnn_check(2, 16, 64, 2, NULL,
						      &diag);
		m = err == FLOW_ERR_NOTSUP ? flow_diag_message(&diag) : "opened";
		if (write(fds[1], m, strlen(m)) < 0)
			_exit(2);
		_exit(0);
	}
	close(fds[1]);
	n = read(fds[0], msg, sizeof(msg) - 1);
	close(fds[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_true(n > 0);
	msg[n] = '\0';
#ifdef HAVE_CUDNN
	assert_non_null(strstr(msg, "turned off by FLOW_CUDNN=0"));
#else
	assert_non_null(strstr(msg, "no cuDNN"));
#endif
}

static void test_cudnn_graphs_gpt2_sizes(void **state)
{
	(void)state;
	graphs_build(64, 1024, 768, 12);  /* GPT-2 124M at B=64 */
	graphs_build(4, 1024, 1600, 25);  /* GPT-2 1.5B */
	graphs_build(1, 64, 64, 4);       /* the suite's small GPT */
}

/* Random batches, heads, head sizes (cuDNN's: a multiple of 8 up to 128)
 * and lengths, odd ones among them. */
static void test_cudnn_graphs_random_sizes(void **state)
{
	uint64_t rng = 20261204;

	(void)state;
	for (int i = 0; i < 24; i++) {
		size_t B = 1 + below(&rng, 8);
		size_t NH = 1 + below(&rng, 16);
		size_t hs = 8 * (1 + below(&rng, 16));
		size_t T = 1 + below(&rng, 2048);

		graphs_build(B, T, hs * NH, NH);
	}
}

static void test_cudnn_graphs_refuse_what_is_no_attention(void **state)
{
	flow_diag_t no_heads = FLOW_DIAG_INIT, odd = FLOW_DIAG_INIT;

	(void)state;
	assert_int_equal(flow_cuda_attention_cudnn_check(2, 16, 64, 0, NULL,
							 &no_heads),
			 FLOW_ERR_USAGE);
	assert_int_equal(flow_cuda_attention_cudnn_check(2, 16, 65, 2, NULL,
							 &odd),
			 FLOW_ERR_USAGE);
	assert_non_null(strstr(flow_diag_message(&odd), "C=65 NH=2"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cudnn_graphs_turned_off_by_environment),
		cmocka_unit_test(test_cudnn_graphs_gpt2_sizes),
		cmocka_unit_test(test_cudnn_graphs_random_sizes),
		cmocka_unit_test(test_cudnn_graphs_refuse_what_is_no_attention),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
