/* The BLAS description and the kernel-set advice. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <config.h>
#include <flow/blas.h>

static void test_blas_info_names_the_library_and_core(void **state)
{
	(void)state;
	flow_blas_info_t info;
	flow_blas_get_info(&info);
#ifdef HAVE_OPENBLAS
	assert_string_equal(info.name, "openblas");
	assert_non_null(strstr(info.config, "OpenBLAS"));
	assert_true(info.threads >= 1);
#else
	assert_string_equal(info.name, "cblas");
#endif
	assert_true(strlen(info.core) > 0);
}

static void test_blas_preferred_coretype_is_the_cpus_best_or_none(void **state)
{
	(void)state;
	flow_blas_info_t info;
	flow_blas_get_info(&info);
	const char *want = flow_blas_preferred_coretype();
	if (want) {
		/* Advice is only ever the best set for this CPU, and only when it
		 * differs from the set in use. */
		assert_string_equal(want, info.best_core);
		assert_string_not_equal(want, info.core);
	}
	/* Once OpenBLAS runs the advised kernels there is nothing to advise. */
	const char *pinned = getenv("OPENBLAS_CORETYPE");
	if (pinned && info.best_core[0] && strcmp(pinned, info.best_core) == 0 &&
	    strcasecmp(info.core, info.best_core) == 0)
		assert_null(want);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_blas_info_names_the_library_and_core),
		cmocka_unit_test(test_blas_preferred_coretype_is_the_cpus_best_or_none),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
