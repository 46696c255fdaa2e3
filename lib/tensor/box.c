/* Boxes of a logical tensor: counts, intersections, element indices and
 * the row-major walk that every copy between two boxes goes through
 * (checkpoint reads, the boxing executors, --verify). */
#include <config.h>

#include <string.h>

#include <flow/box.h>

void flow_box_whole(const flow_shape_t *shape, flow_box_t *box_out)
{
	flow_box_t box;

	memset(&box, 0, sizeof(box));
	box.ndim = shape->ndim;
	for (int d = 0; d < shape->ndim; d++)
		box.extent[d] = shape->dims[d];
	*box_out = box;
}

int64_t flow_box_numel(const flow_box_t *box)
{
	int64_t n = 1;

	for (int d = 0; d < box->ndim; d++)
		n *= box->extent[d];
	return n;
}

bool flow_box_equal(const flow_box_t *a, const flow_box_t *b)
{
	if (a->ndim != b->ndim)
		return false;
	for (int d = 0; d < a->ndim; d++)
		if (a->start[d] != b->start[d] || a->extent[d] != b->extent[d])
			return false;
	return true;
}

bool flow_box_inside(const flow_box_t *box, const flow_shape_t *shape)
{
	if (box->ndim != shape->ndim)
		return false;
	for (int d = 0; d < box->ndim; d++)
		if (box->start[d] < 0 || box->extent[d] < 0 ||
		    box->start[d] > shape->dims[d] ||
		    box->extent[d] > shape->dims[d] - box->start[d])
			return false;
	return true;
}

bool flow_box_intersect(const flow_box_t *a, const flow_box_t *b,
			flow_box_t *out)
{
	flow_box_t cut;

	memset(&cut, 0, sizeof(cut));
	cut.ndim = a->ndim;
	for (int d = 0; d < a->ndim; d++) {
		int64_t lo = a->start[d] > b->start[d] ? a->start[d] : b->start[d];
		int64_t ea = a->start[d] + a->extent[d];
		int64_t eb = b->start[d] + b->extent[d];
		int64_t hi = ea < eb ? ea : eb;

		if (hi <= lo)
			return false;
		cut.start[d] = lo;
		cut.extent[d] = hi - lo;
	}
	*out = cut;
	return true;
}

int64_t flow_box_element(const flow_shape_t *shape, const flow_box_t *box,
			 int64_t k, int64_t pos_out[FLOW_MAX_DIMS])
{
	int64_t pos[FLOW_MAX_DIMS] = { 0 }, e = 0;

	for (int d = box->ndim - 1; d >= 0; d--) {
		pos[d] = box->start[d] + k % box->extent[d];
		k /= box->extent[d];
	}
	for (int d = 0; d < shape->ndim; d++)
		e = e * shape->dims[d] + pos[d];
	if (pos_out)
		memcpy(pos_out, pos, sizeof(pos));
	return e;
}

void flow_box_apply(void *dst, const flow_box_t *dbox, const void *src,
		    const flow_box_t *sbox, const flow_box_t *region,
		    size_t elsize, flow_box_run_fn *run, void *ctx)
{
	int nd = region->ndim;

	if (flow_box_numel(region) == 0)
		return;
	if (nd == 0) {
		run(dst, src, 1, ctx);
		return;
	}
	/* Element strides of both layouts. */
	size_t sstr[FLOW_MAX_DIMS], dstr[FLOW_MAX_DIMS];
	sstr[nd - 1] = dstr[nd - 1] = 1;
	for (int d = nd - 2; d >= 0; d--) {
		sstr[d] = sstr[d + 1] * (size_t)sbox->extent[d + 1];
		dstr[d] = dstr[d + 1] * (size_t)dbox->extent[d + 1];
	}
	/* Merge the trailing dimensions that all three span whole: below
	 * dimension k the region is one contiguous run in both layouts. */
	int k = nd - 1;
	size_t len = (size_t)region->extent[k];
	while (k > 0 && region->extent[k] == sbox->extent[k] &&
	       region->extent[k] == dbox->extent[k]) {
		k--;
		len *= (size_t)region->extent[k];
	}
	int64_t idx[FLOW_MAX_DIMS] = { 0 }; /* offsets within region, dims < k */
	for (;;) {
		size_t so = 0, dof = 0;
		for (int d = 0; d <= k; d++) {
			int64_t at = region->start[d] + (d < k ? idx[d] : 0);
			so += (size_t)(at - sbox->start[d]) * sstr[d];
			dof += (size_t)(at - dbox->start[d]) * dstr[d];
		}
		run((char *)dst + dof * elsize, (const char *)src + so * elsize,
		    len, ctx);
		int d = k - 1;
		for (; d >= 0; d--) {
			if (++idx[d] < region->extent[d])
				break;
			idx[d] = 0;
		}
		if (d < 0)
			break;
	}
}

static void copy_run(void *dst, const void *src, size_t n, void *ctx)
{
	memcpy(dst, src, n * *(const size_t *)ctx);
}

void flow_box_copy(void *dst, const flow_box_t *dbox, const void *src,
		   const flow_box_t *sbox, const flow_box_t *region,
		   size_t elsize)
{
	flow_box_apply(dst, dbox, src, sbox, region, elsize, copy_run, &elsize);
}
