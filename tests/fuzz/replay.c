/* The fuzz targets' driver in every build without libFuzzer: runs
 * LLVMFuzzerTestOneInput once on each file named on the command line or
 * found in a directory named there (sorted, not recursive), and prints
 * TAP, one "ok" line per input.  A failing input aborts the process, so
 * the last "# PATH" line before the crash names it.
 *
 * Without arguments it replays the committed inputs of its own target,
 * $top_srcdir/tests/fuzz/corpus/NAME and tests/fuzz/regressions/NAME, NAME
 * being the program's name without "fuzz_" (and without libtool's "lt-"):
 * that is how 'make check' runs it, with top_srcdir exported.
 *
 * As libFuzzer does (-rss_limit_mb=2048), it bounds the memory an input
 * may take, here with RLIMIT_DATA at 2 GiB, so that a reader allocating
 * for what a small input merely claims fails (fuzz_check_diag refuses
 * FLOW_ERR_NOMEM).  Not under ASan, whose shadow memory the limit would
 * count. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "fuzz_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REPLAY_ASAN 1
#endif
#endif

#define REPLAY_DATA_LIMIT (2ull << 30)

typedef struct list {
	char **paths;
	size_t n, cap;
} list_t;

static void list_add(list_t *l, const char *a, const char *b)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 64;
		l->paths = realloc(l->paths, l->cap * sizeof *l->paths);
		if (!l->paths)
			fuzz_fail("out of memory");
	}
	size_t len = strlen(a) + (b ? strlen(b) + 1 : 0) + 1;
	char *p = malloc(len);
	if (!p)
		fuzz_fail("out of memory");
	snprintf(p, len, b ? "%s/%s" : "%s", a, b);
	l->paths[l->n++] = p;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Add path, or the files of the directory path; a missing path adds
 * nothing when optional. */
static void add_inputs(list_t *l, const char *path, bool optional)
{
	struct stat st;
	if (stat(path, &st) != 0) {
		if (optional && errno == ENOENT)
			return;
		fuzz_fail("cannot read '%s': %s", path, strerror(errno));
	}
	if (!S_ISDIR(st.st_mode)) {
		list_add(l, path, NULL);
		return;
	}
	DIR *d = opendir(path);
	if (!d)
		fuzz_fail("cannot open '%s': %s", path, strerror(errno));
	size_t first = l->n;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			list_add(l, path, e->d_name);
	closedir(d);
	qsort(l->paths + first, l->n - first, sizeof *l->paths, by_name);
}

static uint8_t *read_input(const char *path, size_t *size_out)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		fuzz_fail("cannot open '%s': %s", path, strerror(errno));
	size_t cap = 4096, n = 0;
	uint8_t *buf = malloc(cap);
	size_t got;
	while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
		n += got;
		if (n == cap)
			buf = realloc(buf, cap *= 2);
	}
	if (!buf || ferror(f))
		fuzz_fail("cannot read '%s'", path);
	fclose(f);
	*size_out = n;
	return buf;
}

int main(int argc, char **argv)
{
	list_t inputs = { NULL, 0, 0 };
#ifndef REPLAY_ASAN
	struct rlimit lim;
	if (getrlimit(RLIMIT_DATA, &lim) == 0 &&
	    (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur > REPLAY_DATA_LIMIT)) {
		lim.rlim_cur = REPLAY_DATA_LIMIT;
		if (setrlimit(RLIMIT_DATA, &lim) != 0)
			fuzz_fail("cannot limit the memory: %s", strerror(errno));
	}
#endif
	if (argc > 1) {
		for (int i = 1; i < argc; i++)
			add_inputs(&inputs, argv[i], false);
	} else {
		const char *name = strrchr(argv[0], '/');
		name = name ? name + 1 : argv[0];
		if (strncmp(name, "lt-", 3) == 0)
			name += 3;
		if (strncmp(name, "fuzz_", 5) == 0)
			name += 5;
		const char *top = getenv("top_srcdir");
		char dir[1024];
		snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s",
			 top ? top : ".", name);
		add_inputs(&inputs, dir, false);
		snprintf(dir, sizeof dir, "%s/tests/fuzz/regressions/%s",
			 top ? top : ".", name);
		add_inputs(&inputs, dir, true);
	}
	if (inputs.n == 0)
		fuzz_fail("no inputs to replay");
	printf("1..%zu\n", inputs.n);
	for (size_t i = 0; i < inputs.n; i++) {
		printf("# %s\n", inputs.paths[i]);
		fflush(stdout);
		size_t size;
		uint8_t *data = read_input(inputs.paths[i], &size);
		LLVMFuzzerTestOneInput(data, size);
		free(data);
		printf("ok %zu - %s\n", i + 1, inputs.paths[i]);
		free(inputs.paths[i]);
	}
	free(inputs.paths);
	return fflush(stdout) == 0 ? 0 : 1;
}
