/* Version and build-feature strings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <config.h>
/* The umbrella header, so every public header is compiled together. */
#include <flow/flow.h>

static void test_version_matches_the_package(void **state)
{
	(void)state;
	assert_string_equal(flow_version(), PACKAGE_VERSION);
}

static void test_version_features_name_every_optional_part(void **state)
{
	(void)state;
	const char *f = flow_features();
	static const char *const parts[] = { "cuda: ", "nccl: ", "cudnn: ",
					     "pmix: ", "blas: ", "openmp: " };
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
		assert_non_null(strstr(f, parts[i]));
#ifdef HAVE_CUDA
	assert_true(flow_have_cuda());
	assert_non_null(strstr(f, "cuda: yes (sm_"));
#else
	assert_false(flow_have_cuda());
	assert_non_null(strstr(f, "cuda: no"));
#endif
#ifdef HAVE_PMIX
	assert_non_null(strstr(f, "pmix: yes"));
#else
	assert_non_null(strstr(f, "pmix: no"));
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_version_matches_the_package),
		cmocka_unit_test(test_version_features_name_every_optional_part),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
