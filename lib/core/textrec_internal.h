/* Line-oriented, checksummed text records, private to libflow: the reader
 * behind the dataset manifest (lib/data/manifest.c), the checkpoint manifest
 * and indexes (lib/ckpt/ckpt_index.c) and plan files (lib/plan/plan.c).
 *
 * Such a text is a sequence of lines, each ending in a newline (the last
 * one too).  A line is a record of fields, the first naming it, and the
 * last record, "KEY SUM", holds the XXH3-64 of every byte before its line.
 * What differs between the formats (separators, the closing key, how a
 * checksum may be spelled) is in flow_textrec_format_t; each format's
 * grammar is in its section-5 page, flow-shard(5) and flow-ckpt(5).
 *
 * A reader walks the lines with flow_textrec_next(), cuts each into fields
 * with flow_textrec_split(), checks them with the flow_textrec_field_*()
 * helpers, and closes with flow_textrec_verify_end().  Every error is one
 * line in diag, "PATH:LINE: message", with FLOW_ERR_FORMAT (or
 * FLOW_ERR_CHECKSUM for a closing checksum that does not match).  A
 * writer prints the records into a flow_textrec_buf_t and seals it with
 * flow_textrec_seal().
 *
 * Not thread-safe: a reader belongs to one thread. */
#ifndef FLOW_TEXTREC_INTERNAL_H
#define FLOW_TEXTREC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <flow/checksum.h>
#include <flow/error.h>

/* The most fields a record has. */
#define FLOW_TEXTREC_MAX_FIELDS 8

typedef enum {
	/* Runs of spaces and tabs separate fields; leading and trailing ones
	 * are ignored, and a blank line is a record of no fields. */
	FLOW_TEXTREC_SEP_BLANKS,
	/* Exactly one space separates fields; an empty line, or an empty
	 * field (a leading, trailing or repeated space), is an error. */
	FLOW_TEXTREC_SEP_SPACE,
} flow_textrec_sep_t;

/* What one format fixes; a static const per format. */
typedef struct flow_textrec_format {
	flow_textrec_sep_t sep;
	/* The first field of the closing record: "checksum", "end". */
	const char *end_key;
	/* Checksums are 16 lowercase hex digits (false: either case). */
	bool lowercase_sums;
	/* Messages about a cut-short or a damaged text end with the likely
	 * cause: "(truncated?)", "(damaged file)". */
	bool hint_causes;
} flow_textrec_format_t;

typedef struct flow_textrec {
	const flow_textrec_format_t *format;
	const char *path;   /* names the text in messages (borrowed) */
	size_t line;        /* the current line, from 1 */
	/* The current record, after flow_textrec_split(): pointers into its
	 * line. */
	char *fields[FLOW_TEXTREC_MAX_FIELDS];
	int nfields;
	flow_diag_t *diag;
	char *text;         /* cut up in place as it is read (borrowed) */
	size_t len;
	size_t at;          /* offset of the next line */
	flow_checksum_state_t *sum; /* the lines before the closing one */
} flow_textrec_t;

/* Start reading the len bytes of text, whose lines flow_textrec_next()
 * cuts up in place; path names it in messages.  format, path, text and
 * diag must outlive the reader.  Returns FLOW_OK or FLOW_ERR_NOMEM.
 * Release with flow_textrec_release(), whatever this returns. */
flow_err_t flow_textrec_init(flow_textrec_t *r,
			     const flow_textrec_format_t *format,
			     const char *path, char *text, size_t len,
			     flow_diag_t *diag) FLOW_MUST_CHECK;

/* Free what the reader holds (not the text).  Accepts NULL and a released
 * reader. */
void flow_textrec_release(flow_textrec_t *r);

/* Advance to the next line: its newline becomes a NUL, *line_out points
 * at it in the text and *len_out is its length without the newline (a NUL
 * byte inside the line is left for the caller to refuse).  Every line
 * before the closing one is folded into the checksum as read.  Returns 1
 * with a line, 0 at the end of the text, FLOW_ERR_FORMAT for a last line
 * without a newline. */
int flow_textrec_next(flow_textrec_t *r, char **line_out, size_t *len_out)
	FLOW_MUST_CHECK;

/* Cut the current line (modified in place) into r->fields, as the
 * format's separator says.  Returns FLOW_OK or FLOW_ERR_FORMAT. */
flow_err_t flow_textrec_split(flow_textrec_t *r, char *line) FLOW_MUST_CHECK;

/* Set diag to "PATH:LINE: <message>" for the current line and return
 * FLOW_ERR_FORMAT. */
flow_err_t flow_textrec_error(flow_textrec_t *r, const char *fmt, ...)
	FLOW_PRINTF(2, 3);

/* The text ended before the record spelled want: "unexpected end of file,
 * expected 'WANT'", on the line after the last.  Returns FLOW_ERR_FORMAT. */
flow_err_t flow_textrec_error_eof(flow_textrec_t *r, const char *want);

/* The current record has n fields, else "expected 'SYNTAX', got N
 * fields".  Returns FLOW_OK or FLOW_ERR_FORMAT. */
flow_err_t flow_textrec_expect_fields(flow_textrec_t *r, int n,
				      const char *syntax) FLOW_MUST_CHECK;

/* The text form of a number: decimal, no sign, no leading zeros ("0"
 * aside), at most max.  Reads the len bytes at s; true with *out set, or
 * false. */
bool flow_textrec_parse_u64(const char *s, size_t len, uint64_t max,
			    uint64_t *out);

/* Field i as a number in [min, max] (flow_textrec_parse_u64), else
 * "invalid WHAT 'FIELD'".  Returns FLOW_OK with *out set, or
 * FLOW_ERR_FORMAT. */
flow_err_t flow_textrec_field_u64(flow_textrec_t *r, int i, const char *what,
				  uint64_t min, uint64_t max, uint64_t *out)
	FLOW_MUST_CHECK;

/* Field i as an XXH3-64 checksum in 16 hex digits (lowercase only when the
 * format says so).  Returns FLOW_OK with *out set, or FLOW_ERR_FORMAT. */
flow_err_t flow_textrec_field_sum(flow_textrec_t *r, int i, uint64_t *out)
	FLOW_MUST_CHECK;

/* The current record closes the text: compare stored, the checksum its
 * field 1 holds (quoted as written in the message), with the XXH3-64 of
 * every byte before its line.  Returns FLOW_OK or FLOW_ERR_CHECKSUM. */
flow_err_t flow_textrec_verify_end(flow_textrec_t *r, uint64_t stored)
	FLOW_MUST_CHECK;

/* ---- writing ---------------------------------------------------------------- */

/* A text being written, in memory.  Initialise with
 * FLOW_TEXTREC_BUF_INIT; release with flow_textrec_buf_release(). */
typedef struct flow_textrec_buf {
	char *buf;   /* len bytes, NUL-terminated once anything is printed */
	size_t len, cap;
	bool failed; /* out of memory: the text is incomplete, and later calls
		      * add nothing */
} flow_textrec_buf_t;

#define FLOW_TEXTREC_BUF_INIT { NULL, 0, 0, false }

/* Append printf-style text; on running out of memory, set b->failed. */
void flow_textrec_printf(flow_textrec_buf_t *b, const char *fmt, ...)
	FLOW_PRINTF(2, 3);

/* Append the closing record "KEY SUM", KEY the format's end_key and SUM the
 * XXH3-64 of every byte before it in 16 lowercase hex digits, and return
 * SUM (meaningless when b->failed). */
uint64_t flow_textrec_seal(flow_textrec_buf_t *b,
			   const flow_textrec_format_t *format);

/* Free the text.  Accepts NULL and a released buffer. */
void flow_textrec_buf_release(flow_textrec_buf_t *b);

#endif
