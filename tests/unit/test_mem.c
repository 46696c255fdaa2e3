/* Aligned allocation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <flow/mem.h>

static void test_mem_alloc_is_aligned(void **state)
{
	(void)state;
	for (size_t n = 0; n < 300; n += 7) {
		void *p = flow_alloc(n);
		assert_non_null(p);
		assert_int_equal((uintptr_t)p % FLOW_ALIGNMENT, 0);
		flow_free(p);
	}
}

static void test_mem_calloc_zeroes_and_checks_overflow(void **state)
{
	(void)state;
	unsigned char *p = flow_calloc(100, 3);
	assert_non_null(p);
	for (int i = 0; i < 300; i++)
		assert_int_equal(p[i], 0);
	flow_free(p);
	assert_null(flow_calloc(SIZE_MAX / 2, 3));
	assert_null(flow_alloc(SIZE_MAX - 10));
	flow_free(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mem_alloc_is_aligned),
		cmocka_unit_test(test_mem_calloc_zeroes_and_checks_overflow),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
