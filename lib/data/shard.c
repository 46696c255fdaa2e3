/* The shard file: a fixed little-endian header, a frame index, the token
 * payload (raw or independently decodable zstd frames) and a trailing
 * XXH3-64.  Writers go through an atomic file; readers map the file and
 * validate every header field against the file size before use, naming
 * the byte offset of the first field that is wrong.  flow-shard(5) is the
 * specification. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <flow/checksum.h>
#include <flow/compress.h>
#include <flow/file.h>
#include <flow/shard.h>

#define SHARD_MAGIC "FLOWSHRD"
#define SHARD_FIXED_HEADER 64u
#define SHARD_INDEX_ENTRY 16u
#define SHARD_TRAILER 8u
#define SHARD_FLAG_ZSTD 1u

/* Field offsets, named so every error can quote the byte it is about. */
enum {
	OFF_MAGIC = 0,
	OFF_VERSION = 8,
	OFF_HEADER_LEN = 12,
	OFF_TOKEN_BYTES = 16,
	OFF_FLAGS = 20,
	OFF_TOKENS = 24,
	OFF_VOCAB = 32,
	OFF_FRAME_TOKENS = 40,
	OFF_FRAMES = 44,
	OFF_PAYLOAD_LEN = 48,
	OFF_RESERVED = 56,
};

/* Tokens encoded per write() when the payload is not compressed: 512 KiB
 * or 1 MiB writes. */
#define ENCODE_CHUNK (1u << 18)

struct flow_shard {
	char *path;
	const unsigned char *map;
	size_t size;
	uint32_t token_bytes;
	uint32_t frame_tokens;
	uint32_t frames;
	uint64_t tokens;
	uint64_t vocab;
	uint64_t header_len;
	uint64_t payload_len;
	bool unchecked;            /* flow_shard_skip_checks */
	/* The last decoded frame, kept because readers walk forwards. */
	unsigned char *frame_buf;
	int64_t cached_frame;
};

const char *flow_split_name(flow_split_t split)
{
	switch (split) {
	case FLOW_SPLIT_TRAIN:
		return "train";
	case FLOW_SPLIT_VAL:
		return "val";
	}
	return "unknown";
}

flow_err_t flow_split_parse(const char *text, flow_split_t *split_out,
			    flow_diag_t *diag)
{
	if (strcmp(text, "train") == 0) {
		*split_out = FLOW_SPLIT_TRAIN;
		return FLOW_OK;
	}
	if (strcmp(text, "val") == 0) {
		*split_out = FLOW_SPLIT_VAL;
		return FLOW_OK;
	}
	return flow_diag_set(diag, FLOW_ERR_USAGE,
			     "unknown split '%s' (expected train or val)",
			     text);
}

/* ---- little-endian fields ---------------------------------------------- */

static void flow_put_le32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void flow_put_le64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t flow_get_le32(const unsigned char *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t flow_get_le64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Encode count tokens as little-endian u16/u32 into dst and check them in
 * the same pass: true when every token is below vocab.  Writing a shard
 * used to walk the tokens twice (check, then encode); this is one walk.
 * The loops have no early exit, so the compiler can vectorise them. */
static bool encode_checked(unsigned char *dst, const uint32_t *tokens,
			   size_t count, uint32_t token_bytes, uint64_t vocab)
{
	uint32_t max = 0;
	if (token_bytes == 2) {
		for (size_t i = 0; i < count; i++) {
			uint32_t t = tokens[i];
			max = t > max ? t : max;
			dst[2 * i] = (unsigned char)t;
			dst[2 * i + 1] = (unsigned char)(t >> 8);
		}
	} else {
		for (size_t i = 0; i < count; i++) {
			uint32_t t = tokens[i];
			max = t > max ? t : max;
			flow_put_le32(dst + 4 * i, t);
		}
	}
	return count == 0 || max < vocab;
}

/* Index of the first of count tokens at or above vocab; count if none. */
static size_t first_out_of_vocab(const uint32_t *tokens, size_t count,
				 uint64_t vocab)
{
	size_t i = 0;
	while (i < count && tokens[i] < vocab)
		i++;
	return i;
}

/* The error for the first token at or above vocab in tokens[first, first +
 * count), which must hold one. */
static flow_err_t out_of_vocab(flow_diag_t *diag, const char *path,
			       const uint32_t *tokens, size_t first,
			       size_t count, uint64_t vocab)
{
	size_t i = first + first_out_of_vocab(tokens + first, count, vocab);
	return flow_diag_set(diag, FLOW_ERR_USAGE,
			     "%s: token %" PRIu32 " at index %zu is not below the vocabulary size %" PRIu64,
			     path, tokens[i], i, vocab);
}

static void decode_tokens(uint32_t *dst, const unsigned char *src,
			  size_t count, uint32_t token_bytes)
{
	if (token_bytes == 2) {
		for (size_t i = 0; i < count; i++)
			dst[i] = (uint32_t)src[2 * i] |
				 (uint32_t)src[2 * i + 1] << 8;
	} else {
		for (size_t i = 0; i < count; i++)
			dst[i] = flow_get_le32(src + 4 * i);
	}
}

/* ---- writing ------------------------------------------------------------ */

/* Write through the atomic file and fold the bytes into the checksum. */
static flow_err_t put(flow_atomic_file_t *file, flow_checksum_state_t *sum,
		      const void *data, size_t len, flow_diag_t *diag)
{
	flow_checksum_update(sum, data, len);
	return flow_atomic_file_write(file, data, len, diag);
}

/* The options alone; the tokens are checked against the vocabulary while
 * they are encoded. */
static flow_err_t check_write_options(const char *path,
				      const flow_shard_write_options_t *o,
				      uint32_t *token_bytes_out,
				      flow_diag_t *diag)
{
	uint32_t token_bytes;
	if (o->token_dtype == FLOW_DTYPE_U16)
		token_bytes = 2;
	else if (o->token_dtype == FLOW_DTYPE_U32)
		token_bytes = 4;
	else
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: token dtype must be u16 or u32", path);
	if (o->vocab == 0 || o->vocab > (token_bytes == 2 ? 65536ull :
					 4294967296ull))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: vocabulary size %" PRIu64
				     " does not fit %" PRIu32 "-byte tokens",
				     path, o->vocab, token_bytes);
	if (o->zstd_level != 0) {
		if (o->zstd_level < flow_zstd_min_level() ||
		    o->zstd_level > flow_zstd_max_level())
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "invalid zstd level '%d' (expected %d..-1 or 1..%d)",
					     o->zstd_level,
					     flow_zstd_min_level(),
					     flow_zstd_max_level());
		if (o->frame_tokens == 0 ||
		    o->frame_tokens > FLOW_SHARD_MAX_FRAME_TOKENS)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: tokens per frame %" PRIu32
					     " outside 1..%u",
					     path, o->frame_tokens,
					     FLOW_SHARD_MAX_FRAME_TOKENS);
	}
	*token_bytes_out = token_bytes;
	return FLOW_OK;
}

/* Threads that compress the frames of one shard: OpenMP's count, but no
 * more than there are frames. */
static int compress_threads(uint32_t frames)
{
	int n = 1;
#ifdef _OPENMP
	n = omp_get_max_threads();
#endif
	if (n < 1)
		n = 1;
	if ((uint32_t)n > frames)
		n = frames ? (int)frames : 1;
	return n;
}

/* Encode, check and compress every frame into one buffer.  The frames are
 * independent, so threads take them in any order, each through its own
 * reused zstd context, and frame f is compressed into slot f (a frame's
 * bound apart).  Then, in order, the frames are moved down to lie end to
 * end and the index gets each offset: the payload and index are the same
 * bytes whatever the number of threads.  The error reported is that of the
 * lowest failing frame (so the first token above the vocabulary), also
 * whatever the number of threads: a thread skips only frames above the
 * lowest failure seen so far.  Fills the index (offset, length per frame,
 * little-endian) and the payload length. */
static flow_err_t compress_frames(const char *path, const uint32_t *tokens,
				  size_t count, uint32_t token_bytes,
				  const flow_shard_write_options_t *o,
				  uint32_t frames, unsigned char *index,
				  unsigned char **payload_out,
				  uint64_t *payload_len_out, flow_diag_t *diag)
{
	/* No frame is longer than the tokens there are. */
	size_t frame_bytes = (count < o->frame_tokens ? count : o->frame_tokens) *
			     (size_t)token_bytes;
	size_t bound = flow_zstd_bound(frame_bytes), cap;
	unsigned char *payload = NULL;
	if (!flow_mul_size(bound, frames, &cap) ||
	    !(payload = malloc(cap ? cap : 1)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "%s: out of memory compressing %zu tokens",
				     path, count);
	/* frames is below UINT32_MAX / 16, so UINT32_MAX is no frame. */
	uint32_t failed = UINT32_MAX;
	flow_diag_t failed_diag = FLOW_DIAG_INIT;
	int nthreads = compress_threads(frames);
	(void)nthreads; /* read only by the OpenMP clauses */

#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
	{
		flow_diag_t setup_diag = FLOW_DIAG_INIT;
		flow_zstd_cctx_t *cctx = NULL;
		unsigned char *raw = malloc(frame_bytes);
		flow_err_t setup = raw ? flow_zstd_cctx_new(&cctx, &setup_diag) :
			flow_diag_set(&setup_diag, FLOW_ERR_NOMEM,
				      "%s: out of memory compressing %zu tokens",
				      path, count);
#pragma omp for schedule(dynamic)
		for (uint32_t f = 0; f < frames; f++) {
			uint32_t lowest;
#pragma omp atomic read
			lowest = failed;
			if (f > lowest)
				continue;
			size_t first = (size_t)f * o->frame_tokens;
			size_t n = count - first < o->frame_tokens ?
					   count - first : o->frame_tokens;
			flow_diag_t fd = setup_diag;
			flow_err_t e = setup;
			size_t len = 0;
			if (e == FLOW_OK &&
			    !encode_checked(raw, tokens + first, n, token_bytes,
					    o->vocab))
				e = out_of_vocab(&fd, path, tokens, first, n,
						 o->vocab);
			if (e == FLOW_OK)
				e = flow_zstd_cctx_compress(cctx,
							    payload + f * bound,
							    bound, raw,
							    n * token_bytes,
							    o->zstd_level, &len,
							    &fd);
			if (e != FLOW_OK) {
#pragma omp critical(flow_shard_compress_failed)
				{
					if (f < failed) {
						failed_diag = fd;
#pragma omp atomic write
						failed = f;
					}
				}
				continue;
			}
			flow_put_le64(index + SHARD_INDEX_ENTRY * f + 8, len);
		}
		flow_zstd_cctx_free(cctx);
		free(raw);
	}

	if (failed != UINT32_MAX) {
		free(payload);
		return flow_diag_set(diag, failed_diag.err, "%s",
				     flow_diag_message(&failed_diag));
	}
	uint64_t at = 0;
	for (uint32_t f = 0; f < frames; f++) {
		unsigned char *entry = index + SHARD_INDEX_ENTRY * f;
		uint64_t len = flow_get_le64(entry + 8);
		if (at != (uint64_t)f * bound)
			memmove(payload + at, payload + (size_t)f * bound,
				(size_t)len);
		flow_put_le64(entry, at);
		at += len;
	}
	*payload_out = payload;
	*payload_len_out = at;
	return FLOW_OK;
}

/* Encode, check and write an uncompressed payload a chunk at a time. */
static flow_err_t put_tokens(flow_atomic_file_t *file,
			     flow_checksum_state_t *sum, const char *path,
			     const uint32_t *tokens, size_t count,
			     uint32_t token_bytes, uint64_t vocab,
			     flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	unsigned char *chunk = malloc((size_t)ENCODE_CHUNK * token_bytes);
	if (!chunk)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory encoding tokens", path);
	for (size_t at = 0; err == FLOW_OK && at < count; at += ENCODE_CHUNK) {
		size_t n = count - at < ENCODE_CHUNK ? count - at : ENCODE_CHUNK;
		if (!encode_checked(chunk, tokens + at, n, token_bytes, vocab))
			err = out_of_vocab(diag, path, tokens, at, n, vocab);
		else
			err = put(file, sum, chunk, n * token_bytes, diag);
	}
	free(chunk);
	return err;
}

flow_err_t flow_shard_write(const char *path, const uint32_t *tokens,
			    size_t count,
			    const flow_shard_write_options_t *options,
			    flow_shard_file_info_t *info_out,
			    flow_diag_t *diag)
{
	flow_err_t err;
	uint32_t token_bytes = 0, frames = 0;
	unsigned char header[SHARD_FIXED_HEADER];
	unsigned char *index = NULL, *payload = NULL;
	uint64_t payload_len = 0, header_len = SHARD_FIXED_HEADER;
	size_t index_len = 0;
	flow_checksum_state_t *sum = NULL;
	flow_atomic_file_t *file = NULL;

	err = check_write_options(path, options, &token_bytes, diag);
	if (err != FLOW_OK)
		return err;
	bool compressed = options->zstd_level != 0;
	if (compressed) {
		uint64_t nf = count / options->frame_tokens +
			      (count % options->frame_tokens != 0);
		if (nf > (UINT32_MAX - SHARD_FIXED_HEADER) / SHARD_INDEX_ENTRY)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: %zu tokens need too many frames of %" PRIu32,
					     path, count, options->frame_tokens);
		frames = (uint32_t)nf;
		index_len = (size_t)frames * SHARD_INDEX_ENTRY;
		header_len += index_len;
		if (!(index = malloc(index_len ? index_len : 1)))
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "%s: out of memory for an index of %" PRIu32 " frames", path, frames);
		/* Compressed before the file is opened: a token above the
		 * vocabulary leaves nothing behind. */
		err = compress_frames(path, tokens, count, token_bytes, options,
				      frames, index, &payload, &payload_len,
				      diag);
		if (err != FLOW_OK)
			goto out_free;
	} else {
		size_t n;
		if (!flow_mul_size(count, token_bytes, &n)) {
			err = flow_diag_set(diag, FLOW_ERR_RANGE,
					    "%s: %zu tokens overflow the payload size",
					    path, count);
			goto out_free;
		}
		payload_len = n;
	}

	memset(header, 0, sizeof(header));
	memcpy(header + OFF_MAGIC, SHARD_MAGIC, 8);
	flow_put_le32(header + OFF_VERSION, FLOW_SHARD_VERSION);
	flow_put_le32(header + OFF_HEADER_LEN, (uint32_t)header_len);
	flow_put_le32(header + OFF_TOKEN_BYTES, token_bytes);
	flow_put_le32(header + OFF_FLAGS, compressed ? SHARD_FLAG_ZSTD : 0);
	flow_put_le64(header + OFF_TOKENS, count);
	flow_put_le64(header + OFF_VOCAB, options->vocab);
	flow_put_le32(header + OFF_FRAME_TOKENS,
		      compressed ? options->frame_tokens : 0);
	flow_put_le32(header + OFF_FRAMES, frames);
	flow_put_le64(header + OFF_PAYLOAD_LEN, payload_len);

	if (!(sum = flow_checksum_state_new())) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory for a checksum state", path);
		goto out_free;
	}
	err = flow_atomic_file_open(path, &file, diag);
	if (err != FLOW_OK)
		goto out_free;
	err = put(file, sum, header, sizeof(header), diag);
	if (err == FLOW_OK && compressed) {
		err = put(file, sum, index, index_len, diag);
		if (err == FLOW_OK)
			err = put(file, sum, payload, payload_len, diag);
	} else if (err == FLOW_OK) {
		/* A token above the vocabulary aborts the temporary file, so
		 * again nothing is left under path. */
		err = put_tokens(file, sum, path, tokens, count, token_bytes,
				 options->vocab, diag);
	}
	if (err != FLOW_OK)
		goto out_abort;
	uint64_t digest = flow_checksum_digest(sum);
	unsigned char trailer[SHARD_TRAILER];
	flow_put_le64(trailer, digest);
	err = flow_atomic_file_write(file, trailer, sizeof(trailer), diag);
	if (err != FLOW_OK)
		goto out_abort;
	err = flow_atomic_file_commit(file, diag);
	file = NULL;
	if (err != FLOW_OK)
		goto out_free;
	if (info_out) {
		info_out->tokens = count;
		info_out->bytes = header_len + payload_len + SHARD_TRAILER;
		info_out->checksum = digest;
	}
	goto out_free;

out_abort:
	flow_atomic_file_abort(file);
out_free:
	flow_checksum_state_free(sum);
	free(payload);
	free(index);
	return err;
}

/* ---- reading ------------------------------------------------------------ */

/* Validate the header of a size-byte image; on success fill the fields of
 * shard (path must already be set). */
static flow_err_t parse_header(flow_shard_t *s, const unsigned char *p,
			       uint64_t size, flow_diag_t *diag)
{
	const char *path = s->path;
	uint64_t min = SHARD_FIXED_HEADER + SHARD_TRAILER;
	if (size < min)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: truncated at byte %" PRIu64
				     ": a shard has at least %" PRIu64 " bytes",
				     path, size, min);
	if (memcmp(p + OFF_MAGIC, SHARD_MAGIC, 8) != 0)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: bad magic at byte 0: not a flow shard",
				     path);
	uint32_t version = flow_get_le32(p + OFF_VERSION);
	if (version != FLOW_SHARD_VERSION)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: unsupported version %" PRIu32
				     " at byte %d (expected %d)",
				     path, version, OFF_VERSION,
				     FLOW_SHARD_VERSION);
	uint32_t token_bytes = flow_get_le32(p + OFF_TOKEN_BYTES);
	if (token_bytes != 2 && token_bytes != 4)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: bad bytes per token %" PRIu32
				     " at byte %d (expected 2 or 4)",
				     path, token_bytes, OFF_TOKEN_BYTES);
	uint32_t flags = flow_get_le32(p + OFF_FLAGS);
	if (flags & ~SHARD_FLAG_ZSTD)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: unknown flags 0x%" PRIx32 " at byte %d",
				     path, flags, OFF_FLAGS);
	bool compressed = flags & SHARD_FLAG_ZSTD;
	uint64_t tokens = flow_get_le64(p + OFF_TOKENS);
	uint64_t vocab = flow_get_le64(p + OFF_VOCAB);
	if (vocab == 0 || vocab > (token_bytes == 2 ? 65536ull : 4294967296ull))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: vocabulary size %" PRIu64
				     " at byte %d does not fit %" PRIu32
				     "-byte tokens",
				     path, vocab, OFF_VOCAB, token_bytes);
	uint32_t frame_tokens = flow_get_le32(p + OFF_FRAME_TOKENS);
	uint32_t frames = flow_get_le32(p + OFF_FRAMES);
	if (frame_tokens > FLOW_SHARD_MAX_FRAME_TOKENS)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: tokens per frame %" PRIu32
				     " at byte %d exceed the limit of %u",
				     path, frame_tokens, OFF_FRAME_TOKENS,
				     FLOW_SHARD_MAX_FRAME_TOKENS);
	if (compressed ? frame_tokens == 0 : frame_tokens != 0)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: bad tokens per frame %" PRIu32
				     " at byte %d (%s)",
				     path, frame_tokens, OFF_FRAME_TOKENS,
				     compressed ? "compressed: must be > 0" :
						  "uncompressed: must be 0");
	uint64_t want_frames = compressed ? tokens / frame_tokens +
						    (tokens % frame_tokens != 0) :
					    0;
	if (frames != want_frames)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: frame count %" PRIu32
				     " at byte %d does not match %" PRIu64
				     " tokens in frames of %" PRIu32,
				     path, frames, OFF_FRAMES, tokens,
				     frame_tokens);
	uint32_t header_len = flow_get_le32(p + OFF_HEADER_LEN);
	uint64_t want_header = SHARD_FIXED_HEADER +
			       (uint64_t)frames * SHARD_INDEX_ENTRY;
	if (header_len != want_header)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: bad header length %" PRIu32
				     " at byte %d (expected %" PRIu64 ")",
				     path, header_len, OFF_HEADER_LEN,
				     want_header);
	uint64_t payload_len = flow_get_le64(p + OFF_PAYLOAD_LEN);
	if (!compressed && (tokens > UINT64_MAX / token_bytes ||
			    payload_len != tokens * token_bytes))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: payload length %" PRIu64
				     " at byte %d does not match %" PRIu64
				     " tokens of %" PRIu32 " bytes",
				     path, payload_len, OFF_PAYLOAD_LEN, tokens,
				     token_bytes);
	if (flow_get_le64(p + OFF_RESERVED) != 0)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: reserved field at byte %d is not 0",
				     path, OFF_RESERVED);
	/* Sizes against the file: header, payload and trailer must be it. */
	if (payload_len > UINT64_MAX - header_len - SHARD_TRAILER)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: payload length %" PRIu64
				     " at byte %d is too large",
				     path, payload_len, OFF_PAYLOAD_LEN);
	uint64_t want_size = header_len + payload_len + SHARD_TRAILER;
	if (size < want_size)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: truncated at byte %" PRIu64
				     ": the header says the file has %" PRIu64
				     " bytes",
				     path, size, want_size);
	if (size > want_size)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: %" PRIu64
				     " unexpected bytes after the end at byte %" PRIu64,
				     path, size - want_size, want_size);
	/* Frames must tile the payload in order, each non-empty. */
	uint64_t end = 0;
	for (uint32_t f = 0; f < frames; f++) {
		uint64_t at = SHARD_FIXED_HEADER + (uint64_t)f * SHARD_INDEX_ENTRY;
		uint64_t off = flow_get_le64(p + at);
		uint64_t len = flow_get_le64(p + at + 8);
		if (off != end)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: frame %" PRIu32
					     " offset %" PRIu64 " at byte %" PRIu64
					     " is not the end of the previous frame (%" PRIu64 ")",
					     path, f, off, at, end);
		if (len == 0 || len > payload_len - off)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: frame %" PRIu32
					     " length %" PRIu64 " at byte %" PRIu64
					     " runs outside the payload of %" PRIu64 " bytes",
					     path, f, len, at + 8, payload_len);
		/* zstd turns a block of at least 4 bytes (a 3-byte header and
		 * one RLE byte) into at most 128 KiB: a frame too short for
		 * its tokens is damaged, and must not cost a buffer for them. */
		uint64_t ftokens = f + 1 < frames ? frame_tokens :
				   tokens - (uint64_t)f * frame_tokens;
		if (ftokens * token_bytes / 131072 > len / 4)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: frame %" PRIu32
					     " length %" PRIu64 " at byte %" PRIu64
					     " is too short for %" PRIu64 " tokens",
					     path, f, len, at + 8, ftokens);
		end = off + len;
	}
	if (end != payload_len && compressed)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: frames end at payload byte %" PRIu64
				     " but the payload length at byte %d is %" PRIu64,
				     path, end, OFF_PAYLOAD_LEN, payload_len);
	s->token_bytes = token_bytes;
	s->frame_tokens = frame_tokens;
	s->frames = frames;
	s->tokens = tokens;
	s->vocab = vocab;
	s->header_len = header_len;
	s->payload_len = payload_len;
	return FLOW_OK;
}

flow_err_t flow_shard_open(const char *path, flow_shard_t **shard_out,
			   flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	flow_shard_t *s = calloc(1, sizeof(*s));
	if (!s || !(s->path = strdup(path))) {
		free(s);
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "%s: out of memory opening the shard",
				     path);
	}
	s->cached_frame = -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot open '%s'", path);
		goto out_free;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot stat '%s'", path);
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		err = flow_diag_set(diag, FLOW_ERR_IO,
				    "cannot read '%s': not a regular file", path);
		goto out_close;
	}
	s->size = (size_t)st.st_size;
	if (s->size >= SHARD_FIXED_HEADER + SHARD_TRAILER) {
		void *map = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (map == MAP_FAILED) {
			err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
					      "cannot map '%s'", path);
			goto out_close;
		}
		s->map = map;
	}
	err = parse_header(s, s->map, s->size, diag);
	if (err != FLOW_OK)
		goto out_unmap;
	close(fd);
	*shard_out = s;
	return FLOW_OK;

out_unmap:
	if (s->map)
		munmap((void *)s->map, s->size);
out_close:
	close(fd);
out_free:
	free(s->path);
	free(s);
	return err;
}

void flow_shard_close(flow_shard_t *shard)
{
	if (!shard)
		return;
	if (shard->map)
		munmap((void *)shard->map, shard->size);
	free(shard->frame_buf);
	free(shard->path);
	free(shard);
}

void flow_shard_skip_checks(flow_shard_t *shard)
{
	shard->unchecked = true;
}

uint64_t flow_shard_token_count(const flow_shard_t *shard)
{
	return shard->tokens;
}

uint64_t flow_shard_vocab(const flow_shard_t *shard)
{
	return shard->vocab;
}

flow_dtype_t flow_shard_token_dtype(const flow_shard_t *shard)
{
	return shard->token_bytes == 2 ? FLOW_DTYPE_U16 : FLOW_DTYPE_U32;
}

static uint32_t frame_token_count(const flow_shard_t *s, uint32_t f)
{
	uint64_t first = (uint64_t)f * s->frame_tokens;
	uint64_t left = s->tokens - first;
	return left < s->frame_tokens ? (uint32_t)left : s->frame_tokens;
}

/* First token at or above vocab in count encoded tokens, or -1. */
static int64_t find_out_of_vocab(const unsigned char *p, size_t count,
				 uint32_t token_bytes, uint64_t vocab,
				 uint32_t *token_out)
{
	/* The largest token first, in a loop without an exit that the
	 * compiler vectorises: every decoded frame goes through here, and
	 * almost none holds a bad token. */
	uint32_t max = 0;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	/* The file's order: whole 16-bit loads, which vectorise well. */
	if (token_bytes == 2)
		for (size_t i = 0; i < count; i++) {
			uint16_t t;
			memcpy(&t, p + 2 * i, 2);
			max = t > max ? t : max;
		}
#else
	if (token_bytes == 2)
		for (size_t i = 0; i < count; i++) {
			uint32_t t = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
			max = t > max ? t : max;
		}
#endif
	else
		for (size_t i = 0; i < count; i++) {
			uint32_t t = flow_get_le32(p + 4 * i);
			max = t > max ? t : max;
		}
	if (count == 0 || max < vocab)
		return -1;
	for (size_t i = 0; i < count; i++) {
		uint32_t t = token_bytes == 2 ?
				     (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8 :
				     flow_get_le32(p + 4 * i);
		if (t >= vocab) {
			*token_out = t;
			return (int64_t)i;
		}
	}
	return -1;
}

/* The error for token `token`, the index-th of the shard, which is not
 * below the vocabulary: names the byte it was read from (or, compressed,
 * its frame and the frame's byte). */
static flow_err_t token_out_of_vocab(const flow_shard_t *s, uint32_t token,
				     uint64_t index, flow_diag_t *diag)
{
	if (!s->frames)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: token %" PRIu32 " at byte %" PRIu64
				     " is not below the vocabulary size %" PRIu64,
				     s->path, token,
				     s->header_len + index * s->token_bytes,
				     s->vocab);
	uint32_t f = (uint32_t)(index / s->frame_tokens);
	const unsigned char *entry = s->map + SHARD_FIXED_HEADER +
				     (size_t)f * SHARD_INDEX_ENTRY;
	return flow_diag_set(diag, FLOW_ERR_FORMAT,
			     "%s: token %" PRIu32 " (token %" PRIu64
			     " of the shard) in frame %" PRIu32 " at byte %" PRIu64
			     " is not below the vocabulary size %" PRIu64,
			     s->path, token, index, f,
			     s->header_len + flow_get_le64(entry), s->vocab);
}

/* Decode frame f into s->frame_buf (unless it is already there) and check
 * its tokens against the vocabulary: a frame is checked each time it is
 * decoded, so no token of it reaches a caller unchecked. */
static flow_err_t load_frame(flow_shard_t *s, uint32_t f, flow_diag_t *diag)
{
	if (s->cached_frame == (int64_t)f)
		return FLOW_OK;
	const unsigned char *entry = s->map + SHARD_FIXED_HEADER +
				     (size_t)f * SHARD_INDEX_ENTRY;
	uint64_t off = flow_get_le64(entry), len = flow_get_le64(entry + 8);
	size_t want = (size_t)frame_token_count(s, f) * s->token_bytes;
	flow_diag_t inner = FLOW_DIAG_INIT;
	s->cached_frame = -1;
	if (!s->frame_buf) {
		/* On first use, so that mapping many shards costs no memory;
		 * as long as the first frame, the longest: bounded by the
		 * limit, and a short shard claiming long frames gets a short
		 * buffer. */
		size_t bytes = (size_t)frame_token_count(s, 0) * s->token_bytes;
		if (!(s->frame_buf = malloc(bytes)))
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "%s: out of memory for a frame of %zu bytes",
					     s->path, bytes);
	}
	if (flow_zstd_decompress(s->frame_buf, want,
				 s->map + s->header_len + off, (size_t)len,
				 &inner) != FLOW_OK)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: frame %" PRIu32 " at byte %" PRIu64
				     ": %s",
				     s->path, f, s->header_len + off,
				     flow_diag_message(&inner));
	uint32_t token;
	int64_t i = s->unchecked ? -1 :
		find_out_of_vocab(s->frame_buf, frame_token_count(s, f),
				  s->token_bytes, s->vocab, &token);
	if (i >= 0)
		return token_out_of_vocab(s, token,
					  (uint64_t)f * s->frame_tokens +
						  (uint64_t)i,
					  diag);
	s->cached_frame = f;
	return FLOW_OK;
}

flow_err_t flow_shard_read(flow_shard_t *shard, uint64_t first, size_t count,
			   uint32_t *tokens_out, flow_diag_t *diag)
{
	flow_shard_t *s = shard;
	if (first > s->tokens || count > s->tokens - first)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: tokens [%" PRIu64 ", %" PRIu64
				     ") are outside the shard's %" PRIu64
				     " tokens",
				     s->path, first, first + count, s->tokens);
	if (!s->frames) {
		decode_tokens(tokens_out,
			      s->map + s->header_len + first * s->token_bytes,
			      count, s->token_bytes);
		size_t i = s->unchecked ? count :
			first_out_of_vocab(tokens_out, count, s->vocab);
		if (i < count)
			return token_out_of_vocab(s, tokens_out[i], first + i,
						  diag);
		return FLOW_OK;
	}
	while (count > 0) {
		uint32_t f = (uint32_t)(first / s->frame_tokens);
		uint64_t in_frame = first - (uint64_t)f * s->frame_tokens;
		uint64_t avail = frame_token_count(s, f) - in_frame;
		size_t n = count < avail ? count : (size_t)avail;
		flow_err_t err = load_frame(s, f, diag);
		if (err != FLOW_OK)
			return err;
		decode_tokens(tokens_out, s->frame_buf + in_frame * s->token_bytes,
			      n, s->token_bytes);
		tokens_out += n;
		first += n;
		count -= n;
	}
	return FLOW_OK;
}

flow_err_t flow_shard_check(const flow_shard_t *shard,
			    const flow_shard_file_info_t *expected,
			    uint64_t vocab, flow_diag_t *diag)
{
	const flow_shard_t *s = shard;
	uint64_t body = s->header_len + s->payload_len;
	uint64_t stored = flow_get_le64(s->map + body);
	if (expected && expected->bytes != s->size)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: file has %zu bytes, the manifest says %" PRIu64,
				     s->path, s->size, expected->bytes);
	if (expected && expected->tokens != s->tokens)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: token count %" PRIu64
				     " at byte %d, the manifest says %" PRIu64,
				     s->path, s->tokens, OFF_TOKENS,
				     expected->tokens);
	if (vocab != 0 && s->vocab != vocab)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: vocabulary size %" PRIu64
				     " at byte %d, the manifest says %" PRIu64,
				     s->path, s->vocab, OFF_VOCAB, vocab);
	if (expected && expected->checksum != stored) {
		char a[17], b[17];
		flow_checksum_format(stored, a);
		flow_checksum_format(expected->checksum, b);
		return flow_diag_set(diag, FLOW_ERR_CHECKSUM,
				     "%s: checksum %s at byte %" PRIu64
				     ", the manifest says %s",
				     s->path, a, body, b);
	}
	return FLOW_OK;
}

flow_err_t flow_shard_verify_checksum(const flow_shard_t *shard,
				      flow_diag_t *diag)
{
	const flow_shard_t *s = shard;
	uint64_t body = s->header_len + s->payload_len;
	uint64_t stored = flow_get_le64(s->map + body);
	uint64_t computed = flow_checksum(s->map, (size_t)body);
	if (computed == stored)
		return FLOW_OK;
	char a[17], b[17];
	flow_checksum_format(stored, a);
	flow_checksum_format(computed, b);
	return flow_diag_set(diag, FLOW_ERR_CHECKSUM,
			     "%s: checksum mismatch at byte %" PRIu64
			     ": stored %s, computed %s",
			     s->path, body, a, b);
}

flow_err_t flow_shard_verify_file(const char *path,
				  const flow_shard_file_info_t *expected,
				  flow_diag_t *diag)
{
	flow_shard_t *s;
	flow_err_t err = flow_shard_open(path, &s, diag);
	if (err != FLOW_OK)
		return err;
	/* The bytes first: a damaged file is reported as damaged, not as
	 * another file than the manifest's. */
	err = flow_shard_verify_checksum(s, diag);
	if (err == FLOW_OK)
		err = flow_shard_check(s, expected, 0, diag);
	if (err != FLOW_OK)
		goto out_close;
	/* The checksum matched, so what follows finds files written wrong
	 * rather than damaged: frames that do not decode, ids out of range
	 * (load_frame checks each frame's). */
	if (!s->frames) {
		uint32_t token;
		int64_t i = find_out_of_vocab(s->map + s->header_len,
					      (size_t)s->tokens, s->token_bytes,
					      s->vocab, &token);
		if (i >= 0)
			err = token_out_of_vocab(s, token, (uint64_t)i, diag);
		goto out_close;
	}
	for (uint32_t f = 0; err == FLOW_OK && f < s->frames; f++)
		err = load_frame(s, f, diag);
out_close:
	flow_shard_close(s);
	return err;
}
