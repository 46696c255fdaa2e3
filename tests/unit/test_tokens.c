/* Token sources: every input format round trips, auto-detection goes by
 * magic then extension, standard input streams, and every kind of bad input
 * gets one line naming the file and what is wrong.  Small inputs are written
 * to a mkdtemp directory; the committed files of tests/data/{good,bad}
 * (made by tests/data/make-data.py, described in tests/data/README) are
 * checked with their exact messages, which the flow-shard CLI tests rely
 * on too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <flow/tokens.h>

#include "testutil.h"

static char dir[256];

static int setup(void **state)
{
	(void)state;
	return testutil_mkdtemp(dir, sizeof(dir), "tokens");
}

static int teardown(void **state)
{
	(void)state;
	return testutil_rmtree(dir);
}

/* ---- helpers -------------------------------------------------------------- */

static const char *tmp_path(const char *name)
{
	static char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return path;
}

static const char *write_tmp(const char *name, const void *data, size_t len)
{
	const char *path = tmp_path(name);
	assert_int_equal(testutil_write_file(path, data, len), 0);
	return path;
}

static void put_le(unsigned char *p, uint64_t v, size_t width)
{
	for (size_t i = 0; i < width; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/* An llm.c file: 1024-byte header, then tokens of width 2 or 4. */
static size_t make_llmc(unsigned char *out, int32_t magic, int32_t version,
			int32_t count, const uint32_t *tokens, size_t n)
{
	size_t width = version == 2 ? 4 : 2;
	memset(out, 0, 1024);
	put_le(out, (uint32_t)magic, 4);
	put_le(out + 4, (uint32_t)version, 4);
	put_le(out + 8, (uint32_t)count, 4);
	for (size_t i = 0; i < n; i++)
		put_le(out + 1024 + i * width, tokens[i], width);
	return 1024 + n * width;
}

/* A .npy file of the given major version with a header dictionary
 * followed by pad spaces and '\n', then len bytes of data. */
static size_t make_npy(unsigned char *out, int major, const char *dict,
		       size_t pad, const void *data, size_t len)
{
	size_t hlen = strlen(dict) + pad + 1;
	size_t pre = major == 1 ? 10 : 12;
	memcpy(out, "\x93NUMPY", 6);
	out[6] = (unsigned char)major;
	out[7] = 0;
	put_le(out + 8, hlen, major == 1 ? 2 : 4);
	memcpy(out + pre, dict, strlen(dict));
	memset(out + pre + strlen(dict), ' ', pad);
	out[pre + hlen - 1] = '\n';
	if (len)
		memcpy(out + pre + hlen, data, len);
	return pre + hlen + len;
}

static flow_token_source_options_t opts(flow_input_format_t format,
					flow_dtype_t raw_dtype,
					uint64_t vocab)
{
	flow_token_source_options_t o = { format, raw_dtype, vocab };
	return o;
}

static const flow_token_source_options_t auto_opts = { FLOW_INPUT_AUTO,
						       FLOW_DTYPE_F32, 0 };

/* Open and read everything with reads of at most cap tokens.  Returns
 * FLOW_OK with *n_out tokens, or the first error with diag filled. */
static flow_err_t read_all(const char *path,
			   const flow_token_source_options_t *o,
			   uint32_t *tokens, size_t max, size_t cap,
			   size_t *n_out, flow_input_format_t *format_out,
			   flow_diag_t *diag)
{
	flow_token_source_t *s = NULL;
	flow_err_t err = flow_token_source_open(path, o, &s, diag);
	if (err != FLOW_OK) {
		assert_null(s); /* outputs only on success */
		return err;
	}
	if (format_out)
		*format_out = flow_token_source_format(s);
	size_t n = 0;
	for (;;) {
		size_t want = max - n < cap ? max - n : cap;
		uint32_t spare;
		/* With the buffer full, only the end (or an error) may come. */
		int64_t r = want > 0
			? flow_token_source_read(s, tokens + n, want, diag)
			: flow_token_source_read(s, &spare, 1, diag);
		if (want == 0)
			assert_true(r <= 0);
		if (r < 0) {
			err = (flow_err_t)r;
			break;
		}
		if (r == 0)
			break;
		assert_true((size_t)r <= want);
		n += (size_t)r;
	}
	if (err == FLOW_OK) {
		/* The end is sticky. */
		assert_int_equal(flow_token_source_read(s, tokens, 1, diag), 0);
		*n_out = n;
	}
	flow_token_source_free(s);
	return err;
}

/* Expect exactly err and the message "<shown>: <what>". */
static void expect_error_as(const char *path, const char *shown,
			    const flow_token_source_options_t *o,
			    flow_err_t err, const char *what)
{
	uint32_t tokens[64];
	size_t n = 12345;
	char want[1024];
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(read_all(path, o, tokens, 64, 64, &n, NULL, &diag),
			 err);
	assert_int_equal(diag.err, err);
	assert_int_equal(n, 12345);
	snprintf(want, sizeof(want), "%s: %s", shown, what);
	assert_string_equal(diag.msg, want);
}

/* Expect exactly err and the message "<path>: <what>". */
static void expect_error(const char *path,
			 const flow_token_source_options_t *o,
			 flow_err_t err, const char *what)
{
	expect_error_as(path, path, o, err, what);
}

static void expect_tokens(const char *path,
			  const flow_token_source_options_t *o,
			  flow_input_format_t format, const uint32_t *want,
			  size_t count)
{
	uint32_t tokens[256];
	size_t n = 0;
	flow_input_format_t found = FLOW_INPUT_AUTO;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_true(count <= 256);
	/* Reads of 1, 3 and everything at once give the same stream. */
	const size_t caps[] = { 1, 3, 256 };
	for (size_t c = 0; c < 3; c++) {
		flow_err_t err = read_all(path, o, tokens, 256, caps[c], &n,
					  &found, &diag);
		if (err != FLOW_OK)
			fail_msg("%s: %s", path, diag.msg);
		assert_int_equal(found, format);
		assert_int_equal(n, count);
		assert_memory_equal(tokens, want, count * sizeof(*want));
	}
}

/* Point standard input at a pipe fed by a child with len bytes of data;
 * returns the child's pid.  restore_stdin() undoes it. */
static int saved_stdin = -1;

static pid_t stdin_from(const void *data, size_t len)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(fds[0]);
		const unsigned char *p = data;
		while (len > 0) {
			ssize_t w = write(fds[1], p, len);
			if (w <= 0)
				_exit(1);
			p += w;
			len -= (size_t)w;
		}
		_exit(0);
	}
	close(fds[1]);
	if (saved_stdin < 0)
		saved_stdin = dup(0);
	assert_int_equal(dup2(fds[0], 0), 0);
	close(fds[0]);
	clearerr(stdin);
	return pid;
}

static void restore_stdin(pid_t pid)
{
	int status;
	/* Drop what the child may still be writing. */
	assert_int_equal(dup2(saved_stdin, 0), 0);
	clearerr(stdin);
	assert_int_equal(waitpid(pid, &status, 0), pid);
}

/* ---- names ---------------------------------------------------------------- */

static void test_tokens_format_names_round_trip(void **state)
{
	(void)state;
	const flow_input_format_t all[] = { FLOW_INPUT_AUTO, FLOW_INPUT_TEXT,
		FLOW_INPUT_LLMC, FLOW_INPUT_RAW, FLOW_INPUT_NPY };
	for (size_t i = 0; i < 5; i++) {
		flow_input_format_t f = FLOW_INPUT_NPY;
		const char *name = flow_input_format_name(all[i]);
		assert_non_null(name);
		assert_int_equal(flow_input_format_parse(name, &f, NULL),
				 FLOW_OK);
		assert_int_equal(f, all[i]);
	}
	assert_string_equal(flow_input_format_name(FLOW_INPUT_LLMC), "llmc");
	assert_null(flow_input_format_name((flow_input_format_t)42));

	flow_input_format_t f = FLOW_INPUT_RAW;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_input_format_parse("bin", &f, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "unknown input format 'bin' (expected "
				      "auto, text, llmc, raw or npy)");
	assert_int_equal(f, FLOW_INPUT_RAW); /* untouched on failure */
}

/* ---- formats that round trip --------------------------------------------- */

static void test_tokens_text_is_one_token_per_byte(void **state)
{
	(void)state;
	const char *text = "hello, world\n";
	uint32_t want[13];
	for (size_t i = 0; i < 13; i++)
		want[i] = (unsigned char)text[i];
	const char *path = testutil_data_path("good", "hello.txt");
	expect_tokens(path, &auto_opts, FLOW_INPUT_TEXT, want, 13);

	flow_token_source_t *s;
	assert_int_equal(flow_token_source_open(path, &auto_opts, &s, NULL),
			 FLOW_OK);
	assert_int_equal(flow_token_source_vocab(s), 256);
	assert_int_equal(flow_token_source_count(s), 13);
	flow_token_source_free(s);

	/* Every byte value, even ones that are not text. */
	unsigned char all[256];
	uint32_t ids[256];
	for (size_t i = 0; i < 256; i++) {
		all[i] = (unsigned char)(255 - i);
		ids[i] = 255 - (uint32_t)i;
	}
	flow_token_source_options_t o = opts(FLOW_INPUT_TEXT, 0, 256);
	expect_tokens(write_tmp("bytes.bin", all, 256), &o, FLOW_INPUT_TEXT,
		      ids, 256);
}

static void test_tokens_llmc_versions_round_trip(void **state)
{
	(void)state;
	const uint32_t v1[] = { 15496, 11, 995, 50256, 0 };
	const uint32_t v2[] = { 1, 70000, 100000, 128000 };
	flow_token_source_options_t o = opts(FLOW_INPUT_AUTO, 0, 50257);
	expect_tokens(testutil_data_path("good", "tiny.llmc.bin"), &o, FLOW_INPUT_LLMC,
		      v1, 5);
	o.vocab = 128256;
	expect_tokens(testutil_data_path("good", "tiny32.llmc.bin"), &o,
		      FLOW_INPUT_LLMC, v2, 4);

	/* The largest ids each version holds; the format is forced. */
	unsigned char buf[1024 + 16];
	const uint32_t big16[] = { 65535, 0, 65534 };
	const uint32_t big32[] = { 4294967295u, 0 };
	o = opts(FLOW_INPUT_LLMC, 0, 0);
	size_t len = make_llmc(buf, 20240520, 1, 3, big16, 3);
	expect_tokens(write_tmp("big16.data", buf, len), &o, FLOW_INPUT_LLMC,
		      big16, 3);
	len = make_llmc(buf, 20240520, 2, 2, big32, 2);
	const char *path = write_tmp("big32.data", buf, len);
	expect_tokens(path, &o, FLOW_INPUT_LLMC, big32, 2);

	flow_token_source_t *s;
	assert_int_equal(flow_token_source_open(path, &o, &s, NULL), FLOW_OK);
	assert_int_equal(flow_token_source_count(s), 2);
	assert_int_equal(flow_token_source_vocab(s), 0);
	flow_token_source_free(s);
}

static void test_tokens_raw_dtype_from_extension_or_option(void **state)
{
	(void)state;
	const uint32_t u16[] = { 15496, 11, 995, 50256 };
	const uint32_t u32[] = { 1, 70000 };
	expect_tokens(testutil_data_path("good", "tiny.u16"), &auto_opts,
		      FLOW_INPUT_RAW, u16, 4);
	expect_tokens(testutil_data_path("good", "tiny.u32"), &auto_opts,
		      FLOW_INPUT_RAW, u32, 2);

	/* Any name with --format raw and a dtype; the dtype wins over the
	 * extension. */
	unsigned char b[8];
	put_le(b, 70000, 4);
	put_le(b + 4, 3, 4);
	const uint32_t want[] = { 70000, 3 };
	flow_token_source_options_t o = opts(FLOW_INPUT_RAW, FLOW_DTYPE_U32, 0);
	expect_tokens(write_tmp("ids.dat", b, 8), &o, FLOW_INPUT_RAW, want, 2);
	expect_tokens(write_tmp("ids.u16", b, 8), &o, FLOW_INPUT_RAW, want, 2);

	flow_token_source_t *s;
	assert_int_equal(flow_token_source_open(tmp_path("ids.dat"), &o, &s,
						NULL), FLOW_OK);
	assert_int_equal(flow_token_source_count(s), 2);
	flow_token_source_free(s);

	/* A dtype alone does not make auto input raw: it stays text. */
	o = opts(FLOW_INPUT_AUTO, FLOW_DTYPE_U16, 0);
	assert_int_equal(flow_token_source_open(tmp_path("ids.dat"), &o, &s,
						NULL), FLOW_OK);
	assert_int_equal(flow_token_source_format(s), FLOW_INPUT_TEXT);
	flow_token_source_free(s);
}

static void test_tokens_npy_integer_dtypes_round_trip(void **state)
{
	(void)state;
	const uint32_t hello[] = { 15496, 11, 995, 50256 };
	expect_tokens(testutil_data_path("good", "tiny.npy"), &auto_opts,
		      FLOW_INPUT_NPY, hello, 4);

	static const struct {
		const char *descr;
		size_t width;
	} dtypes[] = { { "|u1", 1 }, { "|i1", 1 }, { "<u2", 2 }, { "<i2", 2 },
		       { "<u4", 4 }, { "<i4", 4 }, { "<u8", 8 }, { "<i8", 8 } };
	const uint32_t ids[] = { 0, 1, 7, 100, 127 };
	unsigned char data[5 * 8], file[512];
	char dict[128];
	for (size_t d = 0; d < 8; d++) {
		for (int major = 1; major <= 3; major++) {
			for (size_t i = 0; i < 5; i++)
				put_le(data + i * dtypes[d].width, ids[i],
				       dtypes[d].width);
			snprintf(dict, sizeof(dict),
				 "{'descr': '%s', 'fortran_order': False, "
				 "'shape': (5,), }", dtypes[d].descr);
			/* Odd padding: tokens straddle nothing aligned. */
			size_t len = make_npy(file, major, dict, (size_t)major,
					      data, 5 * dtypes[d].width);
			expect_tokens(write_tmp("a.npy", file, len),
				      &auto_opts, FLOW_INPUT_NPY, ids, 5);
		}
	}

	/* C-order 2-D, Fortran 1-D, a 0-D scalar, double quotes, no
	 * trailing comma, keys in another order. */
	int32_t m[6] = { 0, 1, 2, 3, 4, 5 };
	const uint32_t m_ids[] = { 0, 1, 2, 3, 4, 5 };
	size_t len = make_npy(file, 1,
			      "{'descr': '<i4', 'fortran_order': False, "
			      "'shape': (2, 3), }", 60, m, sizeof(m));
	expect_tokens(write_tmp("m.npy", file, len), &auto_opts,
		      FLOW_INPUT_NPY, m_ids, 6);
	len = make_npy(file, 1,
		       "{'shape': (6,), \"fortran_order\": True, "
		       "'descr': '<i4'}", 0, m, sizeof(m));
	expect_tokens(write_tmp("f.npy", file, len), &auto_opts,
		      FLOW_INPUT_NPY, m_ids, 6);
	len = make_npy(file, 1,
		       "{'descr': '<i4', 'fortran_order': False, "
		       "'shape': (), }", 0, m + 5, 4);
	expect_tokens(write_tmp("s.npy", file, len), &auto_opts,
		      FLOW_INPUT_NPY, m_ids + 5, 1);
	flow_token_source_t *s;
	assert_int_equal(flow_token_source_open(tmp_path("m.npy"), &auto_opts,
						&s, NULL), FLOW_OK);
	assert_int_equal(flow_token_source_count(s), 6);
	assert_int_equal(flow_token_source_vocab(s), 0);
	flow_token_source_free(s);
}

/* ---- detection ------------------------------------------------------------ */

static void test_tokens_auto_goes_by_magic_then_extension(void **state)
{
	(void)state;
	unsigned char buf[2048];
	const uint32_t ids[] = { 5, 6 };
	size_t len = make_llmc(buf, 20240520, 1, 2, ids, 2);
	/* Magic beats every extension. */
	const char *names[] = { "llmc.txt", "llmc.u32", "llmc.npy" };
	for (size_t i = 0; i < 3; i++)
		expect_tokens(write_tmp(names[i], buf, len), &auto_opts,
			      FLOW_INPUT_LLMC, ids, 2);
	int32_t v[2] = { 5, 6 };
	len = make_npy(buf, 1, "{'descr': '<i4', 'fortran_order': False, "
			       "'shape': (2,), }", 0, v, 8);
	expect_tokens(write_tmp("npy.u16", buf, len), &auto_opts,
		      FLOW_INPUT_NPY, ids, 2);

	/* A .bin without the llm.c magic is text when nothing is forced... */
	const char *bad = testutil_data_path("bad", "badmagic.llmc.bin");
	flow_token_source_t *s;
	assert_int_equal(flow_token_source_open(bad, &auto_opts, &s, NULL),
			 FLOW_OK);
	assert_int_equal(flow_token_source_format(s), FLOW_INPUT_TEXT);
	assert_int_equal(flow_token_source_count(s), 1032);
	flow_token_source_free(s);
	/* ...but forced to llmc it is an error. */
	flow_token_source_options_t o = opts(FLOW_INPUT_LLMC, 0, 0);
	expect_error(bad, &o, FLOW_ERR_FORMAT,
		     "not an llm.c token file (magic 12345, expected "
		     "20240520)");
	/* A .npy name promises the NumPy magic. */
	expect_error(write_tmp("text.npy", "hello", 5), &auto_opts,
		     FLOW_ERR_FORMAT,
		     "not a NumPy .npy file (no \\x93NUMPY magic at byte 0)");
	/* Text forced over a magic reads the header as bytes. */
	o = opts(FLOW_INPUT_TEXT, 0, 0);
	assert_int_equal(flow_token_source_open(testutil_data_path("bad",
		"truncated.llmc.bin"), &o, &s, NULL), FLOW_OK);
	assert_int_equal(flow_token_source_format(s), FLOW_INPUT_TEXT);
	assert_int_equal(flow_token_source_count(s), 1036);
	flow_token_source_free(s);
}

/* ---- streaming ------------------------------------------------------------- */

static void test_tokens_large_inputs_stream_in_chunks(void **state)
{
	(void)state;
	/* Bigger than the 64 KiB read buffer, with a header length that puts
	 * 8-byte tokens across every buffer boundary. */
	const size_t n = 40000;
	unsigned char *file = malloc(256 + n * 8);
	unsigned char *data = malloc(n * 8);
	uint32_t *got = malloc(n * sizeof(*got));
	assert_non_null(file);
	assert_non_null(data);
	assert_non_null(got);
	for (size_t i = 0; i < n; i++)
		put_le(data + i * 8, (i * 2654435761u) % 50257, 8);
	size_t len = make_npy(file, 2, "{'descr': '<i8', 'fortran_order': "
				       "False, 'shape': (40000,), }", 3, data,
			      n * 8);
	const char *path = write_tmp("big.npy", file, len);
	flow_token_source_options_t o = opts(FLOW_INPUT_AUTO, 0, 50257);
	const size_t caps[] = { 4097, 65536, n };
	for (size_t c = 0; c < 3; c++) {
		size_t count = 0;
		flow_diag_t diag = FLOW_DIAG_INIT;
		assert_int_equal(read_all(path, &o, got, n, caps[c], &count,
					  NULL, &diag), FLOW_OK);
		assert_int_equal(count, n);
		for (size_t i = 0; i < n; i++)
			assert_int_equal(got[i], (i * 2654435761u) % 50257);
	}

	/* The last token over the vocabulary: its offset is exact. */
	put_le(file + len - 8, 50257, 8);
	path = write_tmp("big.npy", file, len);
	flow_diag_t diag = FLOW_DIAG_INIT;
	size_t count;
	assert_int_equal(read_all(path, &o, got, n, 4097, &count, NULL, &diag),
			 FLOW_ERR_FORMAT);
	char want[1024];
	snprintf(want, sizeof(want), "%s: token 50257 at byte %zu is not "
		 "below the vocabulary size 50257", path, len - 8);
	assert_string_equal(diag.msg, want);
	free(got);
	free(data);
	free(file);
}

static void test_tokens_stdin_text_and_magic(void **state)
{
	(void)state;
	uint32_t got[2048];
	size_t n;
	flow_input_format_t format;
	flow_diag_t diag = FLOW_DIAG_INIT;

	/* Text: the count is unknown until the end. */
	pid_t pid = stdin_from("abc", 3);
	flow_token_source_t *s;
	assert_int_equal(flow_token_source_open("-", &auto_opts, &s, NULL),
			 FLOW_OK);
	assert_int_equal(flow_token_source_format(s), FLOW_INPUT_TEXT);
	assert_int_equal(flow_token_source_count(s), -1);
	assert_int_equal(flow_token_source_read(s, got, 2048, NULL), 3);
	assert_int_equal(got[0], 'a');
	assert_int_equal(got[2], 'c');
	assert_int_equal(flow_token_source_read(s, got, 2048, NULL), 0);
	flow_token_source_free(s);
	restore_stdin(pid);

	/* llm.c detected by its magic on a pipe. */
	unsigned char buf[2048];
	const uint32_t ids[] = { 9, 8, 7 };
	size_t len = make_llmc(buf, 20240520, 2, 3, ids, 3);
	pid = stdin_from(buf, len);
	assert_int_equal(read_all("-", &auto_opts, got, 2048, 2, &n, &format,
				  &diag), FLOW_OK);
	assert_int_equal(format, FLOW_INPUT_LLMC);
	assert_int_equal(n, 3);
	assert_memory_equal(got, ids, sizeof(ids));
	restore_stdin(pid);

	/* npy too: nothing needs seeking back. */
	int32_t v[2] = { 4, 2 };
	len = make_npy(buf, 1, "{'descr': '<i4', 'fortran_order': False, "
			       "'shape': (2,), }", 0, v, 8);
	pid = stdin_from(buf, len);
	assert_int_equal(read_all("-", &auto_opts, got, 2048, 5, &n, &format,
				  &diag), FLOW_OK);
	assert_int_equal(format, FLOW_INPUT_NPY);
	assert_int_equal(n, 2);
	restore_stdin(pid);

	/* Raw needs the dtype: no extension to go by. */
	pid = stdin_from("\x01\x00\x02\x00", 4);
	flow_token_source_options_t o = opts(FLOW_INPUT_RAW, FLOW_DTYPE_U16, 0);
	assert_int_equal(read_all("-", &o, got, 2048, 5, &n, &format, &diag),
			 FLOW_OK);
	assert_int_equal(n, 2);
	assert_int_equal(got[1], 2);
	restore_stdin(pid);
}

static void test_tokens_stdin_errors_say_stdin(void **state)
{
	(void)state;
	unsigned char buf[2048];
	const uint32_t ids[] = { 1, 2, 3, 4, 5, 6 };

	pid_t pid = stdin_from("", 0);
	expect_error_as("-", "(stdin)", &auto_opts, FLOW_ERR_FORMAT,
			"empty input");
	restore_stdin(pid);

	/* Sizes are checked when the stream ends. */
	size_t len = make_llmc(buf, 20240520, 1, 10, ids, 6);
	pid = stdin_from(buf, len);
	expect_error_as("-", "(stdin)", &auto_opts, FLOW_ERR_FORMAT,
			"truncated llm.c file: the header declares 10 tokens "
			"(1044 bytes) but the file has 1036 bytes");
	restore_stdin(pid);
	len = make_llmc(buf, 20240520, 1, 4, ids, 6);
	pid = stdin_from(buf, len);
	expect_error_as("-", "(stdin)", &auto_opts, FLOW_ERR_FORMAT,
			"trailing bytes in llm.c file: the header declares 4 "
			"tokens (1032 bytes) but the file has 1036 bytes");
	restore_stdin(pid);

	pid = stdin_from("\x01\x00\x02", 3);
	flow_token_source_options_t o = opts(FLOW_INPUT_RAW, FLOW_DTYPE_U16, 0);
	expect_error_as("-", "(stdin)", &o, FLOW_ERR_FORMAT,
			"raw u16 input has 3 bytes, not a multiple of 2 "
			"(partial token at byte 2)");
	restore_stdin(pid);

	pid = stdin_from("\x01\x00", 2);
	o = opts(FLOW_INPUT_RAW, FLOW_DTYPE_F32, 0);
	expect_error_as("-", "(stdin)", &o, FLOW_ERR_USAGE,
			"raw input needs a token dtype: give u16 or u32, or "
			"name the file .u16 or .u32");
	restore_stdin(pid);
}

/* ---- bad input: the committed files --------------------------------------- */

static void test_tokens_llmc_bad_files(void **state)
{
	(void)state;
	flow_token_source_options_t o = opts(FLOW_INPUT_AUTO, 0, 0);
	expect_error(testutil_data_path("bad", "truncated.llmc.bin"), &o,
		     FLOW_ERR_FORMAT,
		     "truncated llm.c file: the header declares 10 tokens "
		     "(1044 bytes) but the file has 1036 bytes");
	expect_error(testutil_data_path("bad", "trailing.llmc.bin"), &o,
		     FLOW_ERR_FORMAT,
		     "trailing bytes in llm.c file: the header declares 4 "
		     "tokens (1032 bytes) but the file has 1036 bytes");
	expect_error(testutil_data_path("bad", "badversion.llmc.bin"), &o,
		     FLOW_ERR_FORMAT,
		     "unsupported llm.c version 3 at byte 4 (expected 1 for "
		     "uint16 or 2 for uint32 tokens)");
	expect_error(testutil_data_path("bad", "empty.llmc.bin"), &o, FLOW_ERR_FORMAT,
		     "empty input");
	o.format = FLOW_INPUT_LLMC;
	expect_error(testutil_data_path("bad", "badmagic.llmc.bin"), &o,
		     FLOW_ERR_FORMAT,
		     "not an llm.c token file (magic 12345, expected "
		     "20240520)");
}

static void test_tokens_npy_bad_files(void **state)
{
	(void)state;
	expect_error(testutil_data_path("bad", "float32.npy"), &auto_opts,
		     FLOW_ERR_FORMAT, "npy dtype '<f4' is not an integer type");
	expect_error(testutil_data_path("bad", "negative.npy"), &auto_opts,
		     FLOW_ERR_FORMAT, "token -1 at byte 132 is negative");
	expect_error(testutil_data_path("bad", "fortran.npy"), &auto_opts,
		     FLOW_ERR_FORMAT,
		     "npy array is in Fortran order; only C order is "
		     "supported");
	expect_error(testutil_data_path("bad", "badheader.npy"), &auto_opts,
		     FLOW_ERR_FORMAT, "bad npy header: missing 'shape'");
	expect_error(testutil_data_path("bad", "truncated.npy"), &auto_opts,
		     FLOW_ERR_FORMAT,
		     "truncated npy file: the header declares 10 tokens (168 "
		     "bytes) but the file has 144 bytes");
	flow_token_source_options_t o = opts(FLOW_INPUT_AUTO, 0, 50257);
	expect_error(testutil_data_path("bad", "bigtoken.npy"), &o, FLOW_ERR_FORMAT,
		     "token 70000 at byte 136 is not below the vocabulary "
		     "size 50257");
	/* Without a vocabulary the same file is fine. */
	const uint32_t ids[] = { 1, 70000 };
	expect_tokens(testutil_data_path("bad", "bigtoken.npy"), &auto_opts,
		      FLOW_INPUT_NPY, ids, 2);
}

static void test_tokens_raw_text_and_missing_bad_files(void **state)
{
	(void)state;
	flow_token_source_options_t o = opts(FLOW_INPUT_AUTO, 0, 50257);
	expect_error(testutil_data_path("bad", "bigtoken.u16"), &o, FLOW_ERR_FORMAT,
		     "token 60000 at byte 4 is not below the vocabulary size "
		     "50257");
	expect_error(testutil_data_path("bad", "odd.u16"), &auto_opts, FLOW_ERR_FORMAT,
		     "raw u16 input has 5 bytes, not a multiple of 2 (partial "
		     "token at byte 4)");
	expect_error(testutil_data_path("bad", "empty.txt"), &auto_opts,
		     FLOW_ERR_FORMAT, "empty input");

	const char *path = tmp_path("no-such-file.bin");
	flow_token_source_t *s = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	char want[600];
	assert_int_equal(flow_token_source_open(path, &auto_opts, &s, &diag),
			 FLOW_ERR_IO);
	assert_null(s);
	snprintf(want, sizeof(want), "cannot open '%s': %s", path,
		 strerror(ENOENT));
	assert_string_equal(diag.msg, want);
}

/* ---- bad input: made here -------------------------------------------------- */

static void test_tokens_vocab_is_checked_in_every_format(void **state)
{
	(void)state;
	/* Text: 'h' is 104. */
	flow_token_source_options_t o = opts(FLOW_INPUT_AUTO, 0, 100);
	expect_error(testutil_data_path("good", "hello.txt"), &o, FLOW_ERR_FORMAT,
		     "token 104 at byte 0 is not below the vocabulary size "
		     "100");
	/* llm.c v1 and v2: the offset counts the 1024-byte header. */
	o.vocab = 50256;
	expect_error(testutil_data_path("good", "tiny.llmc.bin"), &o, FLOW_ERR_FORMAT,
		     "token 50256 at byte 1030 is not below the vocabulary "
		     "size 50256");
	o.vocab = 100000;
	expect_error(testutil_data_path("good", "tiny32.llmc.bin"), &o,
		     FLOW_ERR_FORMAT,
		     "token 100000 at byte 1032 is not below the vocabulary "
		     "size 100000");
	/* Raw and npy. */
	o.vocab = 70000;
	expect_error(testutil_data_path("good", "tiny.u32"), &o, FLOW_ERR_FORMAT,
		     "token 70000 at byte 4 is not below the vocabulary size "
		     "70000");
	o.vocab = 50257;
	expect_tokens(testutil_data_path("good", "tiny.npy"), &o, FLOW_INPUT_NPY,
		      (const uint32_t[]){ 15496, 11, 995, 50256 }, 4);
	o.vocab = 995;
	expect_error(testutil_data_path("good", "tiny.npy"), &o, FLOW_ERR_FORMAT,
		     "token 15496 at byte 128 is not below the vocabulary "
		     "size 995");
}

static void test_tokens_errors_are_sticky(void **state)
{
	(void)state;
	flow_token_source_options_t o = opts(FLOW_INPUT_AUTO, 0, 50257);
	const char *path = testutil_data_path("bad", "bigtoken.u16");
	flow_token_source_t *s;
	uint32_t got[8];
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_token_source_open(path, &o, &s, &diag), FLOW_OK);
	assert_int_equal(flow_token_source_count(s), 4);
	/* The good tokens before the bad one come back first. */
	assert_int_equal(flow_token_source_read(s, got, 2, &diag), 2);
	assert_int_equal(flow_token_source_read(s, got, 8, &diag),
			 FLOW_ERR_FORMAT);
	char first[FLOW_DIAG_MAX];
	snprintf(first, sizeof(first), "%s", diag.msg);
	flow_diag_clear(&diag);
	assert_int_equal(flow_token_source_read(s, got, 8, &diag),
			 FLOW_ERR_FORMAT);
	assert_string_equal(diag.msg, first);
	/* A NULL diag is fine; reading nothing is a usage error. */
	assert_int_equal(flow_token_source_read(s, got, 8, NULL),
			 FLOW_ERR_FORMAT);
	flow_token_source_free(s);

	assert_int_equal(flow_token_source_open(testutil_data_path("good", "tiny.u16"),
						&o, &s, NULL), FLOW_OK);
	flow_diag_clear(&diag);
	assert_int_equal(flow_token_source_read(s, got, 0, &diag),
			 FLOW_ERR_USAGE);
	assert_int_equal(flow_token_source_read(s, got, 8, &diag), 4);
	flow_token_source_free(s);
	flow_token_source_free(NULL);
}

static void test_tokens_npy_bad_headers(void **state)
{
	(void)state;
	unsigned char file[1024];
	int32_t v[2] = { 1, 2 };
	size_t len;
	const char *path;
	static const struct {
		const char *dict;
		const char *what;
	} cases[] = {
		{ "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }",
		  "npy dtype '>i4' is big-endian; only little-endian "
		  "integers are supported" },
		{ "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
		  "npy dtype '<f8' is not an integer type" },
		{ "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }",
		  "npy dtype '<c8' is not an integer type" },
		{ "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }",
		  "npy dtype '|O' is not an integer type" },
		{ "{'descr': '|b1', 'fortran_order': False, 'shape': (8,), }",
		  "npy dtype '|b1' is not an integer type" },
		{ "{'descr': '<i16', 'fortran_order': False, 'shape': (1,), }",
		  "unsupported npy dtype '<i16' (expected '|u1', '<u2', "
		  "'<i4', '<u4' or '<i8')" },
		{ "{'descr': [('a', '<i4')], 'fortran_order': False, "
		  "'shape': (2,), }",
		  "bad npy header at byte 20: structured dtypes are not "
		  "supported" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), "
		  "'x': 1}",
		  "bad npy header: unexpected or repeated key 'x'" },
		{ "{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, "
		  "'shape': (2,)}",
		  "bad npy header: unexpected or repeated key 'descr'" },
		{ "{'descr': '<i4', 'fortran_order': 0, 'shape': (2,)}",
		  "bad npy header at byte 44: expected True or False" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (-2,)}",
		  "bad npy header at byte 61: expected a dimension in "
		  "'shape'" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (2,)} x",
		  "bad npy header at byte 66: unexpected text after '}'" },
		{ "{'descr': '<i4' 'fortran_order': False, 'shape': (2,)}",
		  "bad npy header at byte 26: expected ',' or '}'" },
		{ "'descr'", "bad npy header at byte 10: expected '{'" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': "
		  "(4294967296, 4294967296)}",
		  "bad npy header at byte 73: shape has too many elements" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (3,)}",
		  "truncated npy file: the header declares 3 tokens (78 "
		  "bytes) but the file has 74 bytes" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (1,)}",
		  "trailing bytes in npy file: the header declares 1 token "
		  "(70 bytes) but the file has 74 bytes" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		len = make_npy(file, 1, cases[i].dict, 0, v, sizeof(v));
		path = write_tmp("bad.npy", file, len);
		expect_error(path, &auto_opts, FLOW_ERR_FORMAT, cases[i].what);
	}
	/* No elements: sizes agree, but there is nothing to read. */
	len = make_npy(file, 3, "{'descr': '<i4', 'fortran_order': False, "
				"'shape': (2, 0)}", 0, NULL, 0);
	path = write_tmp("empty.npy", file, len);
	expect_error(path, &auto_opts, FLOW_ERR_FORMAT, "empty input");

	/* Versions, header lengths and headers cut short. */
	len = make_npy(file, 1, "{'descr': '<i4', 'fortran_order': False, "
				"'shape': (2,)}", 0, v, sizeof(v));
	file[6] = 4;
	path = write_tmp("v4.npy", file, len);
	expect_error(path, &auto_opts, FLOW_ERR_FORMAT,
		     "unsupported npy version 4.0 at byte 6 (expected 1.0, "
		     "2.0 or 3.0)");
	path = write_tmp("cut.npy", file, 7);
	expect_error(path, &auto_opts, FLOW_ERR_FORMAT,
		     "truncated npy header: the file has 7 bytes");
	file[6] = 1;
	path = write_tmp("cut.npy", file, 40);
	expect_error(path, &auto_opts, FLOW_ERR_FORMAT,
		     "truncated npy header: it declares 56 bytes after byte "
		     "10, the file has 40 bytes");
	file[6] = 2;
	put_le(file + 8, 0x7fffffff, 4);
	path = write_tmp("long.npy", file, 64);
	expect_error(path, &auto_opts, FLOW_ERR_FORMAT,
		     "npy header length 2147483647 at byte 8 is larger than "
		     "1048576 bytes");

	/* Ids beyond 32 bits, even without a vocabulary. */
	int64_t big[2] = { 1, (int64_t)1 << 32 };
	len = make_npy(file, 1, "{'descr': '<i8', 'fortran_order': False, "
				"'shape': (2,)}", 0, big, sizeof(big));
	path = write_tmp("big.npy", file, len);
	expect_error(path, &auto_opts, FLOW_ERR_FORMAT,
		     "token 4294967296 at byte 74 does not fit a 32-bit token "
		     "id");
	/* Negative in each signed width. */
	int8_t neg8[2] = { 1, -128 };
	len = make_npy(file, 1, "{'descr': '|i1', 'fortran_order': False, "
				"'shape': (2,)}", 0, neg8, sizeof(neg8));
	path = write_tmp("neg.npy", file, len);
	expect_error(path, &auto_opts, FLOW_ERR_FORMAT,
		     "token -128 at byte 67 is negative");
	int64_t neg64[1] = { INT64_MIN };
	len = make_npy(file, 1, "{'descr': '<i8', 'fortran_order': False, "
				"'shape': (1,)}", 0, neg64, sizeof(neg64));
	path = write_tmp("neg.npy", file, len);
	expect_error(path, &auto_opts, FLOW_ERR_FORMAT,
		     "token -9223372036854775808 at byte 66 is negative");
}

static void test_tokens_llmc_bad_headers(void **state)
{
	(void)state;
	unsigned char file[1100];
	const uint32_t ids[] = { 1, 2 };
	flow_token_source_options_t o = opts(FLOW_INPUT_LLMC, 0, 0);
	size_t len = make_llmc(file, 20240520, 1, 2, ids, 2);
	expect_error(write_tmp("short.bin", file, 3), &o, FLOW_ERR_FORMAT,
		     "not an llm.c token file (3 bytes, shorter than the "
		     "1024-byte header)");
	expect_error(write_tmp("short.bin", file, 600), &auto_opts,
		     FLOW_ERR_FORMAT,
		     "truncated llm.c header: the file has 600 bytes, the "
		     "header alone needs 1024");
	len = make_llmc(file, 20240520, 1, -5, ids, 2);
	expect_error(write_tmp("neg.bin", file, len), &auto_opts,
		     FLOW_ERR_FORMAT,
		     "negative llm.c token count -5 at byte 8");
	/* Llama-3's variant (magic 20240801, version 7) is not llm.c's. */
	len = make_llmc(file, 20240801, 7, 2, ids, 2);
	expect_error(write_tmp("llama.bin", file, len), &o, FLOW_ERR_FORMAT,
		     "not an llm.c token file (magic 20240801, expected "
		     "20240520)");
	expect_error(testutil_data_path("bad", "empty.txt"), &o, FLOW_ERR_FORMAT,
		     "empty input");
}

static void test_tokens_raw_and_paths_bad(void **state)
{
	(void)state;
	flow_token_source_options_t o = opts(FLOW_INPUT_RAW, FLOW_DTYPE_I32, 0);
	expect_error(testutil_data_path("good", "hello.txt"), &o, FLOW_ERR_USAGE,
		     "raw input needs a token dtype: give u16 or u32, or name "
		     "the file .u16 or .u32");
	o.raw_dtype = FLOW_DTYPE_U32;
	expect_error(testutil_data_path("good", "hello.txt"), &o, FLOW_ERR_FORMAT,
		     "raw u32 input has 13 bytes, not a multiple of 4 (partial "
		     "token at byte 12)");
	expect_error(write_tmp("three.u32", "abc", 3), &auto_opts,
		     FLOW_ERR_FORMAT,
		     "raw u32 input has 3 bytes, not a multiple of 4 (partial "
		     "token at byte 0)");
	/* A directory. */
	char want[600];
	flow_token_source_t *s = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(mkdir(tmp_path("sub.u16"), 0755), 0);
	assert_int_equal(flow_token_source_open(tmp_path("sub.u16"),
						&auto_opts, &s, &diag),
			 FLOW_ERR_IO);
	assert_null(s);
	snprintf(want, sizeof(want), "cannot read '%s': %s",
		 tmp_path("sub.u16"), strerror(EISDIR));
	assert_string_equal(diag.msg, want);
	/* Options may be NULL: auto, no vocabulary. */
	assert_int_equal(flow_token_source_open(testutil_data_path("good", "tiny.u16"),
						NULL, &s, NULL), FLOW_OK);
	assert_int_equal(flow_token_source_format(s), FLOW_INPUT_RAW);
	flow_token_source_free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tokens_format_names_round_trip),
		cmocka_unit_test(test_tokens_text_is_one_token_per_byte),
		cmocka_unit_test(test_tokens_llmc_versions_round_trip),
		cmocka_unit_test(test_tokens_raw_dtype_from_extension_or_option),
		cmocka_unit_test(test_tokens_npy_integer_dtypes_round_trip),
		cmocka_unit_test(test_tokens_auto_goes_by_magic_then_extension),
		cmocka_unit_test(test_tokens_large_inputs_stream_in_chunks),
		cmocka_unit_test(test_tokens_stdin_text_and_magic),
		cmocka_unit_test(test_tokens_stdin_errors_say_stdin),
		cmocka_unit_test(test_tokens_llmc_bad_files),
		cmocka_unit_test(test_tokens_npy_bad_files),
		cmocka_unit_test(test_tokens_raw_text_and_missing_bad_files),
		cmocka_unit_test(test_tokens_vocab_is_checked_in_every_format),
		cmocka_unit_test(test_tokens_errors_are_sticky),
		cmocka_unit_test(test_tokens_npy_bad_headers),
		cmocka_unit_test(test_tokens_llmc_bad_headers),
		cmocka_unit_test(test_tokens_raw_and_paths_bad),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
