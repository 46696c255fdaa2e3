/* Atomic writes never leave a half-written file under the final name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flow/file.h>

#include "testutil.h"

static char dir[256];

static int setup(void **state)
{
	(void)state;
	return testutil_mkdtemp(dir, sizeof(dir), "file");
}

static int teardown(void **state)
{
	(void)state;
	return testutil_rmtree(dir);
}

static void test_file_write_atomic_then_read_back(void **state)
{
	(void)state;
	char path[512], *data;
	size_t len;
	snprintf(path, sizeof(path), "%s/a.txt", dir);
	assert_int_equal(flow_file_write_atomic(path, "hello\n", 6, NULL), FLOW_OK);
	assert_int_equal(flow_file_read_all(path, &data, &len, NULL), FLOW_OK);
	assert_int_equal(len, 6);
	assert_string_equal(data, "hello\n");
	free(data);
	assert_int_equal(testutil_count_entries(dir), 1); /* no temporary left */
}

static void test_file_abort_keeps_the_old_contents(void **state)
{
	(void)state;
	char path[512], *data;
	size_t len;
	snprintf(path, sizeof(path), "%s/b.txt", dir);
	assert_int_equal(flow_file_write_atomic(path, "old", 3, NULL), FLOW_OK);
	flow_atomic_file_t *f;
	assert_int_equal(flow_atomic_file_open(path, &f, NULL), FLOW_OK);
	assert_int_equal(flow_atomic_file_write(f, "new data", 8, NULL), FLOW_OK);
	assert_int_equal(testutil_count_entries(dir), 2); /* the temporary beside it */
	assert_non_null(strstr(flow_atomic_file_temp_path(f), "b.txt.tmp."));
	flow_atomic_file_abort(f);
	assert_int_equal(testutil_count_entries(dir), 1);
	assert_int_equal(flow_file_read_all(path, &data, &len, NULL), FLOW_OK);
	assert_string_equal(data, "old");
	free(data);
	flow_atomic_file_abort(NULL);
}

static void test_file_cleanup_all_removes_open_temporaries(void **state)
{
	(void)state;
	char path[512];
	snprintf(path, sizeof(path), "%s/c.bin", dir);
	flow_atomic_file_t *f;
	assert_int_equal(flow_atomic_file_open(path, &f, NULL), FLOW_OK);
	assert_int_equal(testutil_count_entries(dir), 1);
	flow_atomic_file_cleanup_all(); /* what a signal handler does */
	assert_int_equal(testutil_count_entries(dir), 0);
	flow_atomic_file_abort(f);
}

static void test_file_errors_name_the_file(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	char *data;
	size_t len;
	assert_int_equal(flow_file_read_all("/nonexistent/x", &data, &len, &diag),
			 FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "cannot open '/nonexistent/x': "));
	flow_diag_clear(&diag);
	assert_int_equal(flow_file_write_atomic("/nonexistent/dir/y", "x", 1, &diag),
			 FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "cannot create '/nonexistent/dir/y.tmp."));
	flow_diag_clear(&diag);
	assert_int_equal(flow_file_read_all(dir, &data, &len, &diag), FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "not a regular file"));
}

static void test_file_commit_failure_leaves_final_name_alone(void **state)
{
	(void)state;
	/* Renaming onto an existing directory fails: the old entry stays and
	 * the temporary is removed. */
	char path[512];
	snprintf(path, sizeof(path), "%s/sub", dir);
	assert_int_equal(mkdir(path, 0755), 0);
	char inner[600];
	snprintf(inner, sizeof(inner), "%s/keep", path);
	assert_int_equal(testutil_write_file(inner, "", 0), 0);
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_atomic_file_t *f;
	assert_int_equal(flow_atomic_file_open(path, &f, NULL), FLOW_OK);
	assert_int_equal(flow_atomic_file_write(f, "x", 1, NULL), FLOW_OK);
	assert_int_equal(flow_atomic_file_commit(f, &diag), FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "cannot rename"));
	struct stat st;
	assert_int_equal(stat(inner, &st), 0);
	assert_int_equal(testutil_rmtree(path), 0);
	assert_int_equal(testutil_count_entries(dir), 0);
}

static void put_files(const char *in, int n)
{
	char p[1024];
	for (int i = 0; i < n; i++) {
		snprintf(p, sizeof(p), "%s/f%03d", in, i);
		assert_int_equal(flow_file_write_atomic(p, "x", 1, NULL), FLOW_OK);
	}
}

static void test_file_temp_dir_commit_renames_into_place(void **state)
{
	(void)state;
	char path[512], want[600];
	snprintf(path, sizeof(path), "%s/out/", dir); /* trailing '/' */
	flow_temp_dir_t *t;
	assert_int_equal(flow_temp_dir_create(path, &t, NULL), FLOW_OK);
	snprintf(want, sizeof(want), "%s/out.tmp.%ld", dir, (long)getpid());
	assert_string_equal(flow_temp_dir_path(t), want);
	put_files(flow_temp_dir_path(t), 3);
	assert_int_equal(flow_temp_dir_commit(t, NULL), FLOW_OK);
	snprintf(path, sizeof(path), "%s/out", dir);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(testutil_count_entries(dir), 1);
	assert_int_equal(testutil_rmtree(path), 0);
}

static void test_file_temp_dir_refuses_an_existing_path(void **state)
{
	(void)state;
	char path[512];
	snprintf(path, sizeof(path), "%s/out", dir);
	assert_int_equal(mkdir(path, 0755), 0);
	flow_temp_dir_t *t;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_temp_dir_create(path, &t, &diag), FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "already exists"));
	rmdir(path);
	/* Appearing between create and commit: still not replaced, even
	 * though rename(2) would replace an empty directory. */
	assert_int_equal(flow_temp_dir_create(path, &t, NULL), FLOW_OK);
	put_files(flow_temp_dir_path(t), 2);
	assert_int_equal(mkdir(path, 0755), 0);
	flow_diag_clear(&diag);
	assert_int_equal(flow_temp_dir_commit(t, &diag), FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "already exists"));
	assert_int_equal(testutil_count_entries(dir), 1); /* the temporary is gone */
	rmdir(path);
}

static void test_file_temp_dir_abort_and_cleanup_remove_everything(void **state)
{
	(void)state;
	char path[512];
	snprintf(path, sizeof(path), "%s/out", dir);
	flow_temp_dir_t *t;
	assert_int_equal(flow_temp_dir_create(path, &t, NULL), FLOW_OK);
	put_files(flow_temp_dir_path(t), 300); /* more than one getdents64 buffer */
	flow_temp_dir_abort(t);
	assert_int_equal(testutil_count_entries(dir), 0);
	flow_temp_dir_abort(NULL);

	/* The signal path: files (and an open atomic file) inside an
	 * uncommitted directory all go. */
	assert_int_equal(flow_temp_dir_create(path, &t, NULL), FLOW_OK);
	put_files(flow_temp_dir_path(t), 5);
	char inner[1024];
	snprintf(inner, sizeof(inner), "%s/open", flow_temp_dir_path(t));
	flow_atomic_file_t *f;
	assert_int_equal(flow_atomic_file_open(inner, &f, NULL), FLOW_OK);
	flow_atomic_file_cleanup_all();
	assert_int_equal(testutil_count_entries(dir), 0);
	flow_atomic_file_abort(f);
	flow_temp_dir_abort(t); /* already gone: harmless */
	assert_int_equal(testutil_count_entries(dir), 0);
}

/* A stream is read to its end, past the first buffer, and NUL-terminated;
 * a stream that cannot be read is named in the error. */
/* flow_pread_full reads what is there: all of it inside the file, the rest
 * of the file across its end, and the errno of a bad descriptor. */
static void test_file_pread_full_reads_to_the_end(void **state)
{
	(void)state;
	char path[512], buf[16];
	size_t got = 99;
	snprintf(path, sizeof(path), "%s/p.bin", dir);
	assert_int_equal(flow_file_write_atomic(path, "0123456789", 10, NULL),
			 FLOW_OK);
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(flow_pread_full(fd, buf, 4, 3, &got), 0);
	assert_int_equal(got, 4);
	assert_memory_equal(buf, "3456", 4);
	assert_int_equal(flow_pread_full(fd, buf, sizeof buf, 7, &got), 0);
	assert_int_equal(got, 3);
	assert_memory_equal(buf, "789", 3);
	assert_int_equal(flow_pread_full(fd, buf, 4, 50, &got), 0);
	assert_int_equal(got, 0);
	close(fd);
	assert_int_equal(flow_pread_full(fd, buf, 4, 0, &got), EBADF);
}

static void test_file_read_stream_reads_to_the_end(void **state)
{
	(void)state;
	size_t n = 200000;
	char *text = malloc(n), *data = NULL;
	size_t len = 0;
	flow_diag_t diag = FLOW_DIAG_INIT;

	assert_non_null(text);
	for (size_t i = 0; i < n; i++)
		text[i] = (char)('a' + i % 26);
	FILE *f = fmemopen(text, n, "r");
	assert_non_null(f);
	assert_int_equal(flow_file_read_stream(f, "standard input", &data,
					       &len, &diag),
			 FLOW_OK);
	assert_int_equal(len, n);
	assert_memory_equal(data, text, n);
	assert_int_equal(data[n], '\0');
	fclose(f);
	free(data);
	free(text);

	FILE *w = fopen("/dev/null", "w"); /* reading it fails */
	assert_non_null(w);
	data = NULL;
	assert_int_equal(flow_file_read_stream(w, "standard input", &data,
					       &len, &diag),
			 FLOW_ERR_IO);
	assert_string_equal(flow_diag_message(&diag),
			    "cannot read standard input");
	assert_null(data);
	fclose(w);
}

/* A text file beyond the limit is refused before anything is allocated
 * for it (a sparse file: no disk is used). */
static void test_file_read_all_refuses_more_than_the_text_limit(void **state)
{
	(void)state;
	char path[512], *data = NULL;
	size_t len = 0;
	snprintf(path, sizeof(path), "%s/huge.plan", dir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(ftruncate(fileno(f), (off_t)FLOW_TEXT_FILE_MAX + 1), 0);
	fclose(f);
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_file_read_all(path, &data, &len, &diag),
			 FLOW_ERR_RANGE);
	assert_null(data);
	char want[1024];
	snprintf(want, sizeof(want),
		 "%s: 1073741825 bytes is more than a text file may hold (1073741824)",
		 path);
	assert_string_equal(flow_diag_message(&diag), want);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_file_write_atomic_then_read_back, setup, teardown),
		cmocka_unit_test_setup_teardown(test_file_read_all_refuses_more_than_the_text_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_file_abort_keeps_the_old_contents, setup, teardown),
		cmocka_unit_test_setup_teardown(test_file_cleanup_all_removes_open_temporaries, setup, teardown),
		cmocka_unit_test_setup_teardown(test_file_errors_name_the_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_file_commit_failure_leaves_final_name_alone, setup, teardown),
		cmocka_unit_test_setup_teardown(test_file_temp_dir_commit_renames_into_place, setup, teardown),
		cmocka_unit_test_setup_teardown(test_file_temp_dir_refuses_an_existing_path, setup, teardown),
		cmocka_unit_test_setup_teardown(test_file_temp_dir_abort_and_cleanup_remove_everything, setup, teardown),
		cmocka_unit_test(test_file_read_stream_reads_to_the_end),
		cmocka_unit_test_setup_teardown(test_file_pread_full_reads_to_the_end, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
