/* Token sources: the inputs flow-shard accepts, read as a stream of token
 * ids whatever their format.
 *
 * Formats (FLOW_INPUT_AUTO picks by magic: the llm.c int32 20240520 or
 * "\x93NUMPY" at byte 0; then by extension: .npy is npy (and must have the
 * magic), .u16/.u32 raw; anything else, a .bin without the magic included,
 * is text):
 * - text   raw text or any bytes, tokenised by the built-in byte-level
 *          tokenizer: each byte is one token, vocabulary 256;
 * - llmc   llm.c token files: a header of 256 little-endian int32 (magic
 *          20240520, version 1 = uint16 tokens or 2 = uint32, token count),
 *          then the tokens; the file size must match exactly;
 * - raw    headerless little-endian uint16 or uint32 tokens (the dtype is
 *          given; it is never guessed), extension .u16/.u32 or --format;
 * - npy    NumPy .npy arrays (format 1.0, 2.0 or 3.0) of uint16, int32 or
 *          int64, also uint8/int8/int16/uint32/uint64 (any shape, C order;
 *          Fortran order only with one dimension); negative ids, ids above
 *          32 bits, big-endian, float and other dtypes are errors.
 * Inputs are read through a 64 KiB buffer, never whole, and never seeked,
 * so every format also works on standard input.  An input with no tokens is
 * an error.  Sizes a header promises are checked against the file size at
 * open, and against where the stream really ends while reading.
 * Every error names the file and what is wrong, with the byte offset where
 * one applies: "corpus.bin: token 70000 at byte 1124 is not below the
 * vocabulary size 50257".  Standard input is named "(stdin)" in messages.
 * A source is used by one thread at a time. */
#ifndef FLOW_TOKENS_H
#define FLOW_TOKENS_H

#include <flow/error.h>
#include <flow/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
	FLOW_INPUT_AUTO = 0,
	FLOW_INPUT_TEXT = 1,
	FLOW_INPUT_LLMC = 2,
	FLOW_INPUT_RAW = 3,
	FLOW_INPUT_NPY = 4,
} flow_input_format_t;

/* "auto", "text", "llmc", "raw", "npy"; static; NULL for any other value.
 * _parse is the inverse: FLOW_ERR_USAGE "unknown input format 'x' (expected
 * auto, text, llmc, raw or npy)" for any other text. */
FLOW_EXPORT const char *flow_input_format_name(flow_input_format_t format);
FLOW_EXPORT flow_err_t flow_input_format_parse(const char *text,
					       flow_input_format_t *format_out,
					       flow_diag_t *diag)
	FLOW_MUST_CHECK;

typedef struct flow_token_source_options {
	flow_input_format_t format; /* FLOW_INPUT_AUTO to detect */
	flow_dtype_t raw_dtype;     /* FLOW_DTYPE_U16 or FLOW_DTYPE_U32 for
				     * raw input; any other value (0 is F32)
				     * means "not given": raw input then
				     * needs a .u16 or .u32 extension */
	uint64_t vocab;             /* every id must be below it; 0: no check */
} flow_token_source_options_t;

typedef struct flow_token_source flow_token_source_t;

/* Open path ("-" is standard input: auto-detection goes by the magic only,
 * so raw input there needs FLOW_INPUT_RAW and a raw_dtype) and read and
 * validate its header.  options may be NULL (auto, no vocabulary check).
 * Returns FLOW_OK and sets *source_out; FLOW_ERR_IO when the file cannot
 * be opened or read ("cannot open 'x': No such file or directory");
 * FLOW_ERR_USAGE for raw input without a dtype; FLOW_ERR_FORMAT for a bad
 * header, a size that does not match it, or an empty input;
 * FLOW_ERR_NOMEM.  Free with flow_token_source_free() (NULL is fine). */
FLOW_EXPORT flow_err_t flow_token_source_open(
	const char *path, const flow_token_source_options_t *options,
	flow_token_source_t **source_out, flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT void flow_token_source_free(flow_token_source_t *source);

/* The format found (never FLOW_INPUT_AUTO). */
FLOW_EXPORT flow_input_format_t flow_token_source_format(
	const flow_token_source_t *source);
/* Vocabulary the format implies: 256 for text, 0 when the format does not
 * say (tokens). */
FLOW_EXPORT uint64_t flow_token_source_vocab(const flow_token_source_t *source);
/* Number of tokens when the header or the file size tells, else -1
 * (text or raw on a pipe). */
FLOW_EXPORT int64_t flow_token_source_count(const flow_token_source_t *source);

/* Read up to cap (> 0) tokens into tokens.  Returns the number read (> 0),
 * 0 at the clean end of the input (again on every later call), or a
 * negative flow_err_t with diag naming the file and the byte offset:
 * FLOW_ERR_FORMAT for a truncated input, trailing bytes, a partial raw
 * token, an id >= vocab, a negative npy value; FLOW_ERR_IO for a read
 * error; FLOW_ERR_USAGE for cap 0.  Errors are sticky: later calls return
 * the same error and message.  The caller owns tokens. */
FLOW_EXPORT int64_t flow_token_source_read(flow_token_source_t *source,
					   uint32_t *tokens, size_t cap,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
