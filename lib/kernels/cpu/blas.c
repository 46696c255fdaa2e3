/* Which BLAS is linked, which kernels it chose, and which this CPU could
 * run.  Only OpenBLAS reports its kernels; other CBLAS libraries are
 * described as "cblas". */
#include <config.h>

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <cblas.h>

#include <flow/blas.h>

/* How capable a named OpenBLAS kernel set is: 3 AVX-512, 2 AVX2+FMA, 1 AVX,
 * 0 older or unknown (the generic fallbacks). */
static int core_rank(const char *core)
{
	static const char *const avx512[] = { "skylakex", "cooperlake",
					      "sapphirerapids" };
	static const char *const avx2[] = { "haswell", "zen", "skylake" };
	for (size_t i = 0; i < sizeof(avx512) / sizeof(avx512[0]); i++)
		if (strcasecmp(core, avx512[i]) == 0)
			return 3;
	for (size_t i = 0; i < sizeof(avx2) / sizeof(avx2[0]); i++)
		if (strcasecmp(core, avx2[i]) == 0)
			return 2;
	if (strcasecmp(core, "sandybridge") == 0)
		return 1;
	return 0;
}

/* The best OpenBLAS kernel set this CPU can execute, by its features rather
 * than its model number, so that newer CPUs are recognised. */
static const char *cpu_best_core(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") &&
	    __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") &&
	    __builtin_cpu_supports("avx512dq"))
		return "SkylakeX";
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return "Haswell";
#endif
	return NULL;
}

void flow_blas_get_info(flow_blas_info_t *info_out)
{
	flow_blas_info_t info;
	memset(&info, 0, sizeof(info));
	const char *best = cpu_best_core();
	snprintf(info.best_core, sizeof(info.best_core), "%s", best ? best : "");
#ifdef HAVE_OPENBLAS
	snprintf(info.name, sizeof(info.name), "openblas");
	snprintf(info.config, sizeof(info.config), "%s", openblas_get_config());
	snprintf(info.core, sizeof(info.core), "%s", openblas_get_corename());
	info.threads = openblas_get_num_threads();
#else
	snprintf(info.name, sizeof(info.name), "cblas");
	snprintf(info.core, sizeof(info.core), "unknown");
#endif
	*info_out = info;
}

const char *flow_blas_preferred_coretype(void)
{
#ifdef HAVE_OPENBLAS
	const char *best = cpu_best_core();
	if (best && core_rank(best) > core_rank(openblas_get_corename()))
		return best;
#endif
	return NULL;
}
