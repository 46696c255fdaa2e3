/* Shared helpers of the fuzz targets (tests/fuzz/README): the entry point
 * every target defines, the checks every reader's result goes through,
 * scratch files for the readers that take a path, and the checksum
 * fix-ups that let mutated inputs past a reader's integrity checks to the
 * logic behind them.
 *
 * A target is one file tests/fuzz/fuzz_<name>.c defining
 * LLVMFuzzerTestOneInput.  It is linked either with libFuzzer
 * (--enable-fuzzing) or with tests/fuzz/replay.c, which runs it on the
 * committed corpus and regressions in 'make check'.  Every failure is an
 * abort() with one line on stderr, which both drivers report. */
#ifndef FLOW_FUZZ_UTIL_H
#define FLOW_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <flow/error.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Print "fuzz: <message>" on stderr and abort(). */
void fuzz_fail(const char *fmt, ...) FLOW_PRINTF(1, 2)
	__attribute__((noreturn));

/* The checks on any reader's outcome: on FLOW_OK, nothing; on an error,
 * err is a flow_err_t other than FLOW_ERR_NOMEM (inputs are small, and
 * both drivers bound the memory at 2 GiB), diag holds it and a non-empty
 * message of one line (no control byte).  what names the call in the failure.  With
 * FLOW_FUZZ_DEBUG set, every error is printed on stderr, to see why an
 * input is refused. */
void fuzz_check_diag(const char *what, flow_err_t err,
		     const flow_diag_t *diag);

/* A NUL-terminated copy of the input (malloc; free()).  Aborts when out
 * of memory. */
char *fuzz_strndup(const uint8_t *data, size_t size);

/* The first byte of the input, for targets that take harness options
 * from it (0 for an empty input), and the rest after it. */
uint8_t fuzz_take_byte(const uint8_t **data, size_t *size);

/* Cut the input at each FUZZ_SEPARATOR into at most max parts: part i is
 * parts[i], lens[i] (pointers into data).  Parts beyond max stay in the
 * last.  Returns the count, at least 1. */
#define FUZZ_SEPARATOR "\n--8<--\n"
size_t fuzz_split(const uint8_t *data, size_t size, const uint8_t **parts,
		  size_t *lens, size_t max);

/* This process's scratch directory, created at the first call and
 * removed at exit: $TMPDIR (else /dev/shm, else /tmp)/flow-fuzz-PID. */
const char *fuzz_dir(void);
/* "<fuzz_dir()>/<name>" into buf (cap bytes); aborts when it does not
 * fit. */
void fuzz_path(char *buf, size_t cap, const char *name);
/* Write len bytes to the scratch file name, returning its path in buf. */
void fuzz_write(char *buf, size_t cap, const char *name, const void *data,
		size_t len);
/* Remove every entry of the scratch directory (one level of
 * subdirectories too), so one input's files never reach the next. */
void fuzz_clean(void);

/* ---- checksum fix-ups ------------------------------------------------- */

/* Shard files end in the XXH3-64 of every byte before it: rewrite the
 * last 8 bytes of buf (when len >= 8). */
void fuzz_fix_trailing_sum(uint8_t *buf, size_t len);

/* Checksummed text records (the dataset manifest, "checksum"; checkpoint
 * manifests and indexes, "end"): when a line "KEY <16 hex>" follows
 * at least one newline, rewrite its digits with the XXH3-64 of every byte
 * before that line.  The last such line is used.  Returns true when one
 * was rewritten. */
bool fuzz_fix_text_sum(char *text, size_t len, const char *key);

/* ---- round trips ------------------------------------------------------ */

/* Abort unless the two printed forms a and b (alen, blen bytes) are the
 * same bytes; what names the format. */
void fuzz_check_same(const char *what, const char *a, size_t alen,
		     const char *b, size_t blen);

/* A value with a one-line text form: parse text into the value at out
 * (size bytes), format the value into buf (cap bytes) returning the
 * length it needs. */
typedef struct fuzz_text_codec {
	const char *name;   /* "flow_mesh_parse", in failures */
	size_t size;
	flow_err_t (*parse)(const char *text, void *out, flow_diag_t *diag);
	size_t (*format)(const void *value, char *buf, size_t cap);
} fuzz_text_codec_t;

/* The round trip of a text form: parse the input (up to its first NUL);
 * when it parses, its print must parse again and print the same bytes.
 * Returns whether the input parsed. */
bool fuzz_text_round_trip(const fuzz_text_codec_t *codec,
			  const uint8_t *data, size_t size);

#endif
