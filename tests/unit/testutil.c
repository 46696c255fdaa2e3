/* Scratch-file helpers for the unit tests (see testutil.h). */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flow/mem.h>

#include "testutil.h"

int testutil_mkdtemp(char *buf, size_t cap, const char *tag)
{
	const char *base = getenv("TMPDIR");
	int n = snprintf(buf, cap, "%s/flow-test-%s-XXXXXX",
			 base && *base ? base : "/tmp", tag);
	if (n < 0 || (size_t)n >= cap) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return mkdtemp(buf) ? 0 : -1;
}

int testutil_rmtree(const char *path)
{
	struct stat st;
	if (lstat(path, &st) != 0)
		return -1;
	if (!S_ISDIR(st.st_mode))
		return unlink(path);
	DIR *d = opendir(path);
	if (!d)
		return -1;
	int rc = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		char child[4096];
		int n = snprintf(child, sizeof(child), "%s/%s", path, e->d_name);
		if (n < 0 || (size_t)n >= sizeof(child) ||
		    testutil_rmtree(child) != 0)
			rc = -1;
	}
	closedir(d);
	return rmdir(path) == 0 ? rc : -1;
}

const char *testutil_data_path(const char *sub, const char *name)
{
	static char path[4096];
	const char *top = getenv("top_srcdir");
	snprintf(path, sizeof(path), "%s/tests/data/%s/%s", top ? top : ".",
		 sub, name);
	return path;
}

int testutil_write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	int rc = len && fwrite(data, 1, len, f) != len ? -1 : 0;
	if (fclose(f) != 0)
		rc = -1;
	return rc;
}

int testutil_count_entries(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			n++;
	closedir(d);
	return n;
}

void testutil_free_all(void *const *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		flow_free(p[i]);
}
