/* Reader for the FLOWFIX1 kernel test fixtures (see fixture.h and
 * tests/ref/README.md).  The whole file is read into memory, checked
 * against its CRC-32 first, then parsed with every length checked against
 * the bytes that remain, so a truncated or corrupt fixture is an error that
 * names the offset, never a crash. */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/file.h>
#include <flow/mem.h>

#include "fixture.h"

static const char fixture_magic[8] = { 'F', 'L', 'O', 'W',
				       'F', 'I', 'X', '1' };

/* CRC-32 as zlib's crc32() (reflected, polynomial 0xEDB88320); bitwise is
 * plenty fast for fixtures under a megabyte. */
static uint32_t fixture_crc32(const unsigned char *p, size_t n)
{
	uint32_t crc = 0xFFFFFFFFu;

	for (size_t i = 0; i < n; i++) {
		crc ^= p[i];
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
	}
	return crc ^ 0xFFFFFFFFu;
}

static uint64_t fixture_le(const unsigned char *p, size_t bytes)
{
	uint64_t v = 0;

	for (size_t i = bytes; i-- > 0;)
		v = (v << 8) | p[i];
	return v;
}

/* Parse one record at *pos into a; on return *pos is past it. */
static flow_err_t fixture_parse_array(flow_fixture_array_t *a,
				      const unsigned char *buf, size_t end,
				      size_t *pos, const char *path,
				      flow_diag_t *diag)
{
	size_t p = *pos, count = 1, bytes;

	if (end - p < 2)
		goto truncated;
	size_t nlen = (size_t)fixture_le(buf + p, 2);
	p += 2;
	if (nlen == 0 || nlen > 255)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: offset %zu: bad name length %zu",
				     path, p - 2, nlen);
	if (end - p < nlen + 2)
		goto truncated;
	for (size_t i = 0; i < nlen; i++)
		if (buf[p + i] < 0x21 || buf[p + i] > 0x7e)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: offset %zu: non-printable "
					     "byte in array name", path, p + i);
	memcpy(a->name, buf + p, nlen);
	a->name[nlen] = '\0';
	p += nlen;
	unsigned dtype = buf[p], ndim = buf[p + 1];
	if (dtype != FLOW_FIXTURE_F32 && dtype != FLOW_FIXTURE_I32)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: offset %zu: array '%s' has unknown "
				     "dtype %u", path, p, a->name, dtype);
	if (ndim > FLOW_FIXTURE_MAX_NDIM)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: offset %zu: array '%s' has %u "
				     "dimensions (at most %d)", path, p + 1,
				     a->name, ndim, FLOW_FIXTURE_MAX_NDIM);
	p += 2;
	if (end - p < 8 * (size_t)ndim)
		goto truncated;
	for (unsigned d = 0; d < ndim; d++) {
		uint64_t dim = fixture_le(buf + p, 8);
		if ((uint64_t)(size_t)dim != dim ||
		    !flow_mul_size(count, (size_t)dim, &count))
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: offset %zu: array '%s' is "
					     "too large", path, p, a->name);
		a->dims[d] = (size_t)dim;
		p += 8;
	}
	if (!flow_mul_size(count, 4, &bytes) || end - p < bytes)
		goto truncated;
	a->dtype = (flow_fixture_dtype_t)dtype;
	a->ndim = ndim;
	a->count = count;
	a->data = flow_alloc(bytes);
	if (!a->data)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				     path);
	/* Decode little-endian explicitly: the file's byte order is fixed,
	 * the host's is not. */
	for (size_t i = 0; i < count; i++) {
		uint32_t u = (uint32_t)fixture_le(buf + p + 4 * i, 4);
		memcpy((char *)a->data + 4 * i, &u, 4);
	}
	*pos = p + bytes;
	return FLOW_OK;

truncated:
	return flow_diag_set(diag, FLOW_ERR_FORMAT,
			     "%s: offset %zu: truncated array record", path,
			     p);
}

flow_err_t flow_fixture_read(flow_fixture_t *fx, const char *path,
			     flow_diag_t *diag)
{
	flow_err_t err;
	unsigned char *buf = NULL;
	size_t len = 0, pos, narrays = 0;
	flow_fixture_array_t *arrays = NULL;

	err = flow_file_read_all(path, (char **)&buf, &len, diag);
	if (err != FLOW_OK)
		return err;
	if (len < sizeof(fixture_magic) + 8 ||
	    memcmp(buf, fixture_magic, sizeof(fixture_magic)) != 0) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: offset 0: not a FLOWFIX1 fixture",
				    path);
		goto out_free_buf;
	}
	size_t end = len - 4;
	uint32_t stored = (uint32_t)fixture_le(buf + end, 4);
	uint32_t computed = fixture_crc32(buf, end);
	if (stored != computed) {
		err = flow_diag_set(diag, FLOW_ERR_CHECKSUM,
				    "%s: offset %zu: CRC-32 %08x, computed "
				    "%08x", path, end, (unsigned)stored,
				    (unsigned)computed);
		goto out_free_buf;
	}
	size_t count = (size_t)fixture_le(buf + 8, 4);
	if (count == 0 || count > FLOW_FIXTURE_MAX_ARRAYS) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: offset 8: bad array count %zu", path,
				    count);
		goto out_free_buf;
	}
	arrays = calloc(count, sizeof(*arrays));
	if (!arrays) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				    path);
		goto out_free_buf;
	}
	pos = 12;
	for (; narrays < count; narrays++) {
		size_t at = pos;
		err = fixture_parse_array(&arrays[narrays], buf, end, &pos,
					  path, diag);
		if (err != FLOW_OK)
			goto out_free_arrays;
		for (size_t k = 0; k < narrays; k++)
			if (strcmp(arrays[k].name, arrays[narrays].name) == 0) {
				err = flow_diag_set(diag, FLOW_ERR_FORMAT,
						    "%s: offset %zu: duplicate "
						    "array '%s'", path, at,
						    arrays[k].name);
				goto out_free_arrays;
			}
	}
	if (pos != end) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: offset %zu: %zu unexpected bytes "
				    "before the CRC", path, pos, end - pos);
		goto out_free_arrays;
	}
	free(buf);
	fx->narrays = narrays;
	fx->arrays = arrays;
	return FLOW_OK;

out_free_arrays:
	for (size_t k = 0; k < count; k++)
		flow_free(arrays[k].data);
	free(arrays);
out_free_buf:
	free(buf);
	return err;
}

void flow_fixture_release(flow_fixture_t *fx)
{
	if (!fx)
		return;
	for (size_t k = 0; k < fx->narrays; k++)
		flow_free(fx->arrays[k].data);
	free(fx->arrays);
	fx->arrays = NULL;
	fx->narrays = 0;
}

const flow_fixture_array_t *flow_fixture_find(const flow_fixture_t *fx,
					      const char *name)
{
	for (size_t k = 0; k < fx->narrays; k++)
		if (strcmp(fx->arrays[k].name, name) == 0)
			return &fx->arrays[k];
	return NULL;
}

const void *flow_fixture_get(const flow_fixture_t *fx, const char *name,
			     flow_fixture_dtype_t dtype, size_t ndim,
			     const size_t *dims, flow_diag_t *diag)
{
	const flow_fixture_array_t *a = flow_fixture_find(fx, name);

	if (!a) {
		flow_diag_set(diag, FLOW_ERR_FORMAT, "no array '%s'", name);
		return NULL;
	}
	if (a->dtype != dtype) {
		flow_diag_set(diag, FLOW_ERR_FORMAT, "array '%s' is %s", name,
			      a->dtype == FLOW_FIXTURE_F32 ? "f32" : "i32");
		return NULL;
	}
	if (a->ndim != ndim) {
		flow_diag_set(diag, FLOW_ERR_FORMAT,
			      "array '%s' has %zu dimensions, expected %zu",
			      name, a->ndim, ndim);
		return NULL;
	}
	for (size_t d = 0; d < ndim; d++)
		if (a->dims[d] != dims[d]) {
			flow_diag_set(diag, FLOW_ERR_FORMAT,
				      "array '%s' dimension %zu is %zu, "
				      "expected %zu", name, d, a->dims[d],
				      dims[d]);
			return NULL;
		}
	return a->data;
}

flow_err_t flow_fixture_load(flow_fixture_t *fx, const char *name,
			     flow_diag_t *diag)
{
	const char *top = getenv("top_srcdir");
	char path[4096];

	if (!top || !*top)
		top = ".";
	snprintf(path, sizeof(path), "%s/tests/ref/fixtures/%s.bin", top,
		 name);
	return flow_fixture_read(fx, path, diag);
}
