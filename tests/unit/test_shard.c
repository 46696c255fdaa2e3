/* The shard file: round trips in every configuration, reads across frame
 * boundaries, and every kind of damage found with its byte offset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <flow/checksum.h>
#include <flow/shard.h>

#include "testutil.h"

static char dir[256];
static char path[512];

static int setup(void **state)
{
	(void)state;
	if (testutil_mkdtemp(dir, sizeof(dir), "shard") != 0)
		return -1;
	snprintf(path, sizeof(path), "%s/s.bin", dir);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	return testutil_rmtree(dir);
}

static uint32_t *make_tokens(size_t n, uint32_t vocab, uint32_t seed)
{
	uint32_t *t = calloc(n ? n : 1, sizeof(*t));
	uint64_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		/* Runs of repeats so zstd has something to find. */
		t[i] = (uint32_t)((x >> 33) % (i % 7 ? 17 : vocab));
	}
	return t;
}

static void write_shard(const uint32_t *t, size_t n, flow_dtype_t dtype,
			uint64_t vocab, int level, uint32_t frame,
			flow_shard_file_info_t *info)
{
	flow_shard_write_options_t o = { dtype, vocab, level, frame };
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_shard_write(path, t, n, &o, info, &diag), FLOW_OK);
}

static void round_trip(size_t n, flow_dtype_t dtype, uint64_t vocab,
		       int level, uint32_t frame)
{
	uint32_t *t = make_tokens(n, (uint32_t)(vocab > 0xffffffffu ? 0xffffffffu : vocab), 7);
	uint32_t *back = calloc(n ? n : 1, sizeof(*back));
	flow_shard_file_info_t info;
	flow_diag_t diag = FLOW_DIAG_INIT;
	write_shard(t, n, dtype, vocab, level, frame, &info);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(info.bytes, (uint64_t)st.st_size);
	assert_int_equal(info.tokens, n);
	assert_int_equal(flow_shard_verify_file(path, &info, &diag), FLOW_OK);

	flow_shard_t *s;
	assert_int_equal(flow_shard_open(path, &s, &diag), FLOW_OK);
	assert_int_equal(flow_shard_token_count(s), n);
	assert_int_equal(flow_shard_vocab(s), vocab);
	assert_int_equal(flow_shard_token_dtype(s), dtype);
	assert_int_equal(flow_shard_read(s, 0, n, back, &diag), FLOW_OK);
	assert_memory_equal(t, back, n * sizeof(*t));
	/* Pieces that start and end inside frames and span several. */
	for (size_t first = 0; first < n; first += n / 5 + 1) {
		size_t count = (n - first) / 2 + 1;
		memset(back, 0xff, count * sizeof(*back));
		assert_int_equal(flow_shard_read(s, first, count, back, &diag), FLOW_OK);
		assert_memory_equal(t + first, back, count * sizeof(*t));
	}
	/* Backwards, one token at a time: the frame cache must follow. */
	for (size_t i = n; i-- > 0 && i + 50 > n;) {
		uint32_t one;
		assert_int_equal(flow_shard_read(s, i, 1, &one, &diag), FLOW_OK);
		assert_int_equal(one, t[i]);
	}
	flow_shard_close(s);
	free(back);
	free(t);
}

static void test_shard_round_trip_uncompressed_u16(void **state)
{
	(void)state;
	round_trip(10007, FLOW_DTYPE_U16, 50257, 0, 0);
}

static void test_shard_round_trip_uncompressed_u32(void **state)
{
	(void)state;
	round_trip(10007, FLOW_DTYPE_U32, 100277, 0, 0);
}

static void test_shard_round_trip_compressed_frame_sizes(void **state)
{
	(void)state;
	static const uint32_t frames[] = { 1, 7, 1000, 4096, 10007, 65536 };
	for (size_t i = 0; i < sizeof(frames) / sizeof(frames[0]); i++) {
		round_trip(10007, FLOW_DTYPE_U16, 65536, 3, frames[i]);
		round_trip(10007, FLOW_DTYPE_U32, 4294967296ull, 1, frames[i]);
	}
}

static void test_shard_round_trip_empty_and_single(void **state)
{
	(void)state;
	round_trip(0, FLOW_DTYPE_U16, 256, 0, 0);
	round_trip(0, FLOW_DTYPE_U16, 256, 3, 16);
	round_trip(1, FLOW_DTYPE_U32, 256, 3, 16);
}

static void test_shard_layout_is_little_endian_and_documented(void **state)
{
	(void)state;
	uint32_t t[3] = { 0x0102, 0x0304, 0x0506 };
	flow_shard_file_info_t info;
	write_shard(t, 3, FLOW_DTYPE_U16, 2000, 0, 0, &info);
	unsigned char b[64 + 6 + 8];
	FILE *f = fopen(path, "rb");
	assert_int_equal(fread(b, 1, sizeof(b) + 1, f), sizeof(b));
	fclose(f);
	assert_memory_equal(b, "FLOWSHRD", 8);
	assert_int_equal(b[8], 1);      /* version */
	assert_int_equal(b[12], 64);    /* header length */
	assert_int_equal(b[16], 2);     /* bytes per token */
	assert_int_equal(b[20], 0);     /* flags */
	assert_int_equal(b[24], 3);     /* token count */
	assert_int_equal(b[32], 0xd0);  /* vocab 2000 = 0x7d0 */
	assert_int_equal(b[33], 0x07);
	assert_int_equal(b[48], 6);     /* payload length */
	assert_int_equal(b[64], 0x02);
	assert_int_equal(b[65], 0x01);
	uint64_t sum = 0;
	for (int i = 7; i >= 0; i--)
		sum = sum << 8 | b[70 + i];
	assert_int_equal(sum, flow_checksum(b, 70));
	assert_int_equal(sum, info.checksum);
}

static void test_shard_write_rejects_bad_options(void **state)
{
	(void)state;
	uint32_t t[2] = { 1, 300 };
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_shard_write_options_t o = { FLOW_DTYPE_U16, 256, 0, 0 };
	assert_int_equal(flow_shard_write(path, t, 2, &o, NULL, &diag), FLOW_ERR_USAGE);
	assert_non_null(strstr(diag.msg, "token 300 at index 1 is not below the vocabulary size 256"));
	flow_diag_clear(&diag);
	o.vocab = 70000;
	assert_int_equal(flow_shard_write(path, t, 2, &o, NULL, &diag), FLOW_ERR_USAGE);
	assert_non_null(strstr(diag.msg, "does not fit 2-byte tokens"));
	flow_diag_clear(&diag);
	o.vocab = 1000;
	o.zstd_level = 3;
	assert_int_equal(flow_shard_write(path, t, 2, &o, NULL, &diag), FLOW_ERR_USAGE);
	assert_non_null(strstr(diag.msg, "tokens per frame 0 outside 1..16777216"));
	flow_diag_clear(&diag);
	o.frame_tokens = FLOW_SHARD_MAX_FRAME_TOKENS + 1;
	assert_int_equal(flow_shard_write(path, t, 2, &o, NULL, &diag), FLOW_ERR_USAGE);
	assert_non_null(strstr(diag.msg, "tokens per frame 16777217 outside 1..16777216"));
	assert_int_equal(access(path, F_OK), -1); /* nothing written */
}

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

/* Out of memory, the error names the file and what it was allocating: a
 * child process limited to its present size plus 16 MiB reads a shard of
 * one 64 MiB frame.  (It leaves with _exit: libraries' exit handlers
 * need not cope with the limit.)  ASan reserves more address space than
 * any limit allows, so not under ASan. */
static void test_shard_out_of_memory_names_the_file(void **state)
{
	(void)state;
#ifdef UNDER_ASAN
	skip();
#else
	uint32_t n = FLOW_SHARD_MAX_FRAME_TOKENS;
	uint32_t *t = calloc(n, sizeof(*t));
	assert_non_null(t);
	write_shard(t, n, FLOW_DTYPE_U32, 256, 1, n, NULL);
	free(t);
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(fds[0]);
		long pages = 0;
		FILE *f = fopen("/proc/self/statm", "r");
		if (!f || fscanf(f, "%ld", &pages) != 1)
			_exit(2);
		fclose(f);
		struct rlimit lim;
		lim.rlim_cur = lim.rlim_max =
			(rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (16u << 20);
		if (setrlimit(RLIMIT_AS, &lim) != 0)
			_exit(2);
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_shard_t *sh = NULL;
		uint32_t one;
		flow_err_t err = flow_shard_open(path, &sh, &diag);
		if (err == FLOW_OK)
			err = flow_shard_read(sh, 0, 1, &one, &diag);
		ssize_t w = write(fds[1], diag.msg, strlen(diag.msg));
		(void)w;
		_exit(err == FLOW_ERR_NOMEM ? 0 : 1);
	}
	close(fds[1]);
	char msg[FLOW_DIAG_MAX + 1] = { 0 };
	ssize_t got = read(fds[0], msg, FLOW_DIAG_MAX);
	close(fds[0]);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(got > 0);
	char want[1024];
	snprintf(want, sizeof(want), "%s: out of memory for a frame of 67108864 bytes",
		 path);
	assert_string_equal(msg, want);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
#endif
}

static void poke32(long offset, uint32_t v);

/* A header's frame length bounds what a reader allocates: beyond the limit
 * the shard is refused at open; within it, a short shard claiming long
 * frames reads through a buffer of its own length (under ASan, a larger
 * read would be caught). */
static void test_shard_frame_length_is_bounded(void **state)
{
	(void)state;
	uint32_t t[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, out[10];
	write_shard(t, 10, FLOW_DTYPE_U32, 256, 3, FLOW_SHARD_MAX_FRAME_TOKENS,
		    NULL);
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_shard_t *s = NULL;
	assert_int_equal(flow_shard_open(path, &s, &diag), FLOW_OK);
	assert_int_equal(flow_shard_read(s, 0, 10, out, &diag), FLOW_OK);
	assert_memory_equal(out, t, sizeof(t));
	flow_shard_close(s);
	poke32(40, FLOW_SHARD_MAX_FRAME_TOKENS + 1);
	s = NULL;
	assert_int_equal(flow_shard_open(path, &s, &diag), FLOW_ERR_FORMAT);
	assert_null(s);
	assert_non_null(strstr(diag.msg, ": tokens per frame 16777217 at byte 40 exceed the limit of 16777216"));
}

static void test_shard_read_outside_is_an_error(void **state)
{
	(void)state;
	uint32_t t[4] = { 1, 2, 3, 4 }, out[8];
	flow_diag_t diag = FLOW_DIAG_INIT;
	write_shard(t, 4, FLOW_DTYPE_U16, 256, 3, 3, NULL);
	flow_shard_t *s;
	assert_int_equal(flow_shard_open(path, &s, &diag), FLOW_OK);
	assert_int_equal(flow_shard_read(s, 2, 3, out, &diag), FLOW_ERR_USAGE);
	assert_non_null(strstr(diag.msg, "tokens [2, 5) are outside the shard's 4 tokens"));
	assert_int_equal(flow_shard_read(s, 4, 0, out, NULL), FLOW_OK);
	flow_shard_close(s);
	flow_shard_close(NULL);
}

/* ---- damage ---------------------------------------------------------------- */

static void poke(long offset, const void *bytes, size_t len)
{
	int fd = open(path, O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, bytes, len, offset), (ssize_t)len);
	close(fd);
}

static void poke32(long offset, uint32_t v)
{
	unsigned char b[4] = { (unsigned char)v, (unsigned char)(v >> 8),
			       (unsigned char)(v >> 16), (unsigned char)(v >> 24) };
	poke(offset, b, 4);
}

static void flip(long offset)
{
	unsigned char c;
	FILE *f = fopen(path, "r+b");
	fseek(f, offset, SEEK_SET);
	assert_int_equal(fread(&c, 1, 1, f), 1);
	c ^= 0x40;
	fseek(f, offset, SEEK_SET);
	fwrite(&c, 1, 1, f);
	fclose(f);
}

/* Write a fresh compressed shard (2 frames of 100 + 50 tokens), damage it
 * with fn, and expect err and a message containing want from both open
 * (when at_open) and verify. */
static void expect_damage(void (*fn)(void), flow_err_t err, bool at_open,
			  const char *want)
{
	uint32_t *t = make_tokens(150, 1000, 3);
	write_shard(t, 150, FLOW_DTYPE_U16, 1000, 3, 100, NULL);
	free(t);
	fn();
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_shard_t *s = NULL;
	if (at_open) {
		assert_int_equal(flow_shard_open(path, &s, &diag), err);
		assert_null(s);
		if (!strstr(diag.msg, want))
			fail_msg("open: '%s' lacks '%s'", diag.msg, want);
		assert_non_null(strstr(diag.msg, path));
		flow_diag_clear(&diag);
	}
	assert_int_equal(flow_shard_verify_file(path, NULL, &diag), err);
	if (!strstr(diag.msg, want))
		fail_msg("verify: '%s' lacks '%s'", diag.msg, want);
	assert_non_null(strstr(diag.msg, path));
}

static void bad_magic(void) { poke(0, "FLOWSHRX", 8); }
static void bad_version(void) { poke32(8, 2); }
static void bad_header_len(void) { poke32(12, 65); }
static void bad_token_bytes(void) { poke32(16, 3); }
static void bad_flags(void) { poke32(20, 3); }
static void bad_frame_count(void) { poke32(44, 3); }
static void bad_reserved(void) { poke32(60, 1); }
static void bad_frame_offset(void) { poke32(64 + 16, 5); }
static void bad_frame_length(void) { poke32(64 + 8, 0); }
static void flip_payload(void) { flip(64 + 32 + 5); }
static void flip_header(void) { flip(33); } /* vocab stays valid */
static void flip_trailer(void)
{
	struct stat st;
	stat(path, &st);
	flip((long)st.st_size - 1);
}
static void truncate_one(void)
{
	struct stat st;
	stat(path, &st);
	assert_int_equal(truncate(path, st.st_size - 1), 0);
}
static void truncate_short(void) { assert_int_equal(truncate(path, 40), 0); }
static void append_one(void)
{
	FILE *f = fopen(path, "ab");
	fputc(0, f);
	fclose(f);
}

static void test_shard_damage_is_found_with_its_byte_offset(void **state)
{
	(void)state;
	expect_damage(bad_magic, FLOW_ERR_FORMAT, true, ": bad magic at byte 0: not a flow shard");
	expect_damage(bad_version, FLOW_ERR_FORMAT, true, ": unsupported version 2 at byte 8 (expected 1)");
	expect_damage(bad_header_len, FLOW_ERR_FORMAT, true, ": bad header length 65 at byte 12 (expected 96)");
	expect_damage(bad_token_bytes, FLOW_ERR_FORMAT, true, ": bad bytes per token 3 at byte 16");
	expect_damage(bad_flags, FLOW_ERR_FORMAT, true, ": unknown flags 0x3 at byte 20");
	expect_damage(bad_frame_count, FLOW_ERR_FORMAT, true, ": frame count 3 at byte 44 does not match 150 tokens in frames of 100");
	expect_damage(bad_reserved, FLOW_ERR_FORMAT, true, ": reserved field at byte 56 is not 0");
	expect_damage(bad_frame_offset, FLOW_ERR_FORMAT, true, ": frame 1 offset 5 at byte 80 is not the end of the previous frame");
	expect_damage(bad_frame_length, FLOW_ERR_FORMAT, true, ": frame 0 length 0 at byte 72 runs outside the payload");
	expect_damage(truncate_one, FLOW_ERR_FORMAT, true, ": truncated at byte ");
	expect_damage(truncate_short, FLOW_ERR_FORMAT, true, ": truncated at byte 40: a shard has at least 72 bytes");
	expect_damage(append_one, FLOW_ERR_FORMAT, true, ": 1 unexpected bytes after the end at byte ");
	expect_damage(flip_payload, FLOW_ERR_CHECKSUM, false, ": checksum mismatch at byte ");
	expect_damage(flip_header, FLOW_ERR_CHECKSUM, false, ": checksum mismatch at byte ");
	expect_damage(flip_trailer, FLOW_ERR_CHECKSUM, false, ": checksum mismatch at byte ");
}

static void test_shard_corrupt_frame_fails_the_read_with_its_offset(void **state)
{
	(void)state;
	uint32_t *t = make_tokens(150, 1000, 3), out[150] = { 0 };
	write_shard(t, 150, FLOW_DTYPE_U16, 1000, 3, 100, NULL);
	free(t);
	poke(64 + 32, "\0\0\0\0", 4); /* the first frame's zstd magic */
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_shard_t *s;
	assert_int_equal(flow_shard_open(path, &s, &diag), FLOW_OK);
	assert_int_equal(flow_shard_read(s, 120, 10, out, &diag), FLOW_OK); /* frame 1 is fine */
	assert_int_equal(flow_shard_read(s, 90, 20, out, &diag), FLOW_ERR_FORMAT);
	assert_non_null(strstr(diag.msg, ": frame 0 at byte 96: "));
	flow_shard_close(s);
}

static void test_shard_verify_compares_the_manifest_values(void **state)
{
	(void)state;
	uint32_t t[4] = { 1, 2, 3, 4 };
	flow_shard_file_info_t info, other;
	flow_diag_t diag = FLOW_DIAG_INIT;
	write_shard(t, 4, FLOW_DTYPE_U16, 256, 0, 0, &info);
	other = info;
	other.tokens = 5;
	assert_int_equal(flow_shard_verify_file(path, &other, &diag), FLOW_ERR_FORMAT);
	assert_non_null(strstr(diag.msg, "token count 4 at byte 24, the manifest says 5"));
	flow_diag_clear(&diag);
	other = info;
	other.bytes = 1;
	assert_int_equal(flow_shard_verify_file(path, &other, &diag), FLOW_ERR_FORMAT);
	assert_non_null(strstr(diag.msg, "file has 80 bytes, the manifest says 1"));
	flow_diag_clear(&diag);
	other = info;
	other.checksum ^= 1;
	assert_int_equal(flow_shard_verify_file(path, &other, &diag), FLOW_ERR_CHECKSUM);
	assert_non_null(strstr(diag.msg, "at byte 72, the manifest says"));
}

static void test_shard_verify_finds_tokens_above_the_vocabulary(void **state)
{
	(void)state;
	/* A writer bug, not damage: a valid checksum over an id >= vocab. */
	uint32_t t[4] = { 1, 2, 3, 4 };
	write_shard(t, 4, FLOW_DTYPE_U16, 256, 0, 0, NULL);
	unsigned char b[72];
	FILE *f = fopen(path, "rb");
	assert_int_equal(fread(b, 1, 72, f), 72);
	fclose(f);
	b[68] = 0x00;
	b[69] = 0x01; /* token 2 = 256 */
	uint64_t sum = flow_checksum(b, 72);
	unsigned char le[8];
	for (int i = 0; i < 8; i++)
		le[i] = (unsigned char)(sum >> (8 * i));
	poke(0, b, 72);
	poke(72, le, 8);
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_shard_verify_file(path, NULL, &diag), FLOW_ERR_FORMAT);
	assert_non_null(strstr(diag.msg, "token 256 at byte 68 is not below the vocabulary size 256"));
}

static void test_shard_open_names_a_missing_file(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_shard_t *s;
	assert_int_equal(flow_shard_open(path, &s, &diag), FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "cannot open '"));
	assert_non_null(strstr(diag.msg, "No such file or directory"));
}

static void test_shard_split_names(void **state)
{
	(void)state;
	flow_split_t s;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_string_equal(flow_split_name(FLOW_SPLIT_TRAIN), "train");
	assert_string_equal(flow_split_name(FLOW_SPLIT_VAL), "val");
	assert_int_equal(flow_split_parse("val", &s, &diag), FLOW_OK);
	assert_int_equal(s, FLOW_SPLIT_VAL);
	assert_int_equal(flow_split_parse("test", &s, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "unknown split 'test' (expected train or val)");
}

#ifdef _OPENMP
#include <omp.h>
#endif

/* flow_shard_write compresses frames on OpenMP threads: the file must be
 * the same bytes with 1, 2 or 3 threads, and a token above the vocabulary
 * must be reported at the same (first) index whichever thread finds it. */
static void test_shard_compressed_bytes_do_not_depend_on_threads(void **state)
{
	(void)state;
	size_t n = 300007;
	uint32_t *t = make_tokens(n, 50257, 11);
	flow_shard_write_options_t o = { FLOW_DTYPE_U16, 50257, 3, 1000 };
	flow_diag_t diag = FLOW_DIAG_INIT;
	unsigned char *bytes[3] = { NULL, NULL, NULL };
	long len[3];
#ifdef _OPENMP
	int saved = omp_get_max_threads();
#endif
	for (int k = 0; k < 3; k++) {
#ifdef _OPENMP
		omp_set_num_threads(k + 1);
#endif
		char p[600];
		snprintf(p, sizeof(p), "%s/threads%d.bin", dir, k + 1);
		assert_int_equal(flow_shard_write(p, t, n, &o, NULL, &diag), FLOW_OK);
		FILE *f = fopen(p, "rb");
		assert_non_null(f);
		assert_int_equal(fseek(f, 0, SEEK_END), 0);
		len[k] = ftell(f);
		rewind(f);
		bytes[k] = malloc((size_t)len[k]);
		assert_int_equal(fread(bytes[k], 1, (size_t)len[k], f), (size_t)len[k]);
		fclose(f);
		assert_int_equal(flow_shard_verify_file(p, NULL, &diag), FLOW_OK);
	}
	for (int k = 1; k < 3; k++) {
		assert_int_equal(len[k], len[0]);
		assert_memory_equal(bytes[k], bytes[0], (size_t)len[0]);
	}
	/* Bad tokens in frames 12 and 250: frame 12's is the one reported. */
	t[250000] = 60000;
	t[12345] = 50257;
	for (int k = 0; k < 3; k++) {
#ifdef _OPENMP
		omp_set_num_threads(k + 1);
#endif
		flow_diag_clear(&diag);
		assert_int_equal(flow_shard_write(path, t, n, &o, NULL, &diag),
				 FLOW_ERR_USAGE);
		assert_non_null(strstr(diag.msg, "token 50257 at index 12345 is not below the vocabulary size 50257"));
		assert_int_equal(access(path, F_OK), -1);
	}
#ifdef _OPENMP
	omp_set_num_threads(saved);
#endif
	for (int k = 0; k < 3; k++)
		free(bytes[k]);
	free(t);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_shard_round_trip_uncompressed_u16),
		T(test_shard_round_trip_uncompressed_u32),
		T(test_shard_round_trip_compressed_frame_sizes),
		T(test_shard_round_trip_empty_and_single),
		T(test_shard_layout_is_little_endian_and_documented),
		T(test_shard_write_rejects_bad_options),
	T(test_shard_frame_length_is_bounded),
	T(test_shard_out_of_memory_names_the_file),
		T(test_shard_read_outside_is_an_error),
		T(test_shard_damage_is_found_with_its_byte_offset),
		T(test_shard_corrupt_frame_fails_the_read_with_its_offset),
		T(test_shard_verify_compares_the_manifest_values),
		T(test_shard_verify_finds_tokens_above_the_vocabulary),
		T(test_shard_open_names_a_missing_file),
		T(test_shard_split_names),
		T(test_shard_compressed_bytes_do_not_depend_on_threads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
