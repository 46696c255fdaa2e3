/* Helpers the unit tests share for their scratch files: a fresh temporary
 * directory, its removal, the path of a committed data file, and writing
 * or counting small files; and freeing a list of buffers.  None of them
 * uses cmocka, so they serve group setup and teardown as well as the
 * tests, which assert on the results. */
#ifndef FLOW_TEST_TESTUTIL_H
#define FLOW_TEST_TESTUTIL_H

#include <stddef.h>

/* Create a directory $TMPDIR/flow-test-<tag>-XXXXXX (/tmp when TMPDIR is
 * unset or empty) and write its path to buf (cap bytes).  Returns 0, or -1
 * with errno set when the path does not fit or mkdtemp fails. */
int testutil_mkdtemp(char *buf, size_t cap, const char *tag);

/* Remove path and, when it is a directory, everything below it; links are
 * removed, never followed.  Returns 0 when all of it is gone, -1 when
 * something could not be removed (path missing counts as failure too). */
int testutil_rmtree(const char *path);

/* $top_srcdir/tests/data/<sub>/<name> (the source tree's "." when
 * top_srcdir is unset).  Borrowed: valid until the next call. */
const char *testutil_data_path(const char *sub, const char *name);

/* Create or truncate path and write len bytes of data to it.  Returns 0,
 * or -1 with errno set when opening, writing or closing fails. */
int testutil_write_file(const char *path, const void *data, size_t len);

/* The number of entries in directory path, not counting "." and "..";
 * -1 when it cannot be opened. */
int testutil_count_entries(const char *path);

/* flow_free each of the n buffers p[i] (NULL is ignored); through
 * BUFS_FREE(out, mean, rstd), which lists them. */
void testutil_free_all(void *const *p, size_t n);
#define BUFS_FREE(...)                                                     \
	testutil_free_all((void *[]){ __VA_ARGS__ },                       \
			  sizeof((void *[]){ __VA_ARGS__ }) / sizeof(void *))

#endif
