/* ckpt_close A B TOL: do two committed checkpoints hold the same tensors
 * (names, dtypes, logical shapes) with values within TOL, whatever shards
 * each was written in?  For the parity tests of sharded training: a ZeRO
 * run's parameters and moments against one rank's.  A tensor passes when
 * ||a - b|| <= TOL ||a|| (L2, over the whole tensor): element by element
 * would fail on parameters whose true gradient is zero (the attention key
 * bias), where Adam turns rounding noise into full-size steps.  Such
 * elements are left out by naming them: SKIP is NAME:START:END, the
 * elements [START, END) of tensor NAME in row-major order.  Prints the
 * worst relative difference and each tensor over TOL; exit 0 when all
 * pass, 1 when some differ, 2 on bad usage or an unreadable checkpoint. */
#include <config.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/ckpt.h>

typedef struct skip {
	char name[FLOW_CKPT_NAME_MAX];
	size_t start, end;
} skip_t;

static skip_t *skips;
static size_t nskips;

static bool skipped(const char *name, size_t k)
{
	for (size_t i = 0; i < nskips; i++)
		if (k >= skips[i].start && k < skips[i].end &&
		    strcmp(skips[i].name, name) == 0)
			return true;
	return false;
}

static int fail_open(const char *what, flow_diag_t *diag)
{
	fprintf(stderr, "ckpt_close: %s: %s\n", what, flow_diag_message(diag));
	return 2;
}

/* Compare tensor i of a with its namesake in b; 1 when within tol. */
static int tensor_close(const flow_ckpt_t *a, const flow_ckpt_t *b, size_t i,
			double tol, double *worst, flow_diag_t *diag)
{
	const flow_ckpt_tensor_desc_t *da = flow_ckpt_tensor_at(a, i);
	int j = flow_ckpt_tensor_find(b, da->name);
	if (j < 0) {
		printf("%s: missing from the second checkpoint\n", da->name);
		return 0;
	}
	const flow_ckpt_tensor_desc_t *db = flow_ckpt_tensor_at(b, (size_t)j);
	if (da->dtype != FLOW_DTYPE_F32 || db->dtype != FLOW_DTYPE_F32 ||
	    !flow_shape_equal(&da->shape, &db->shape)) {
		printf("%s: dtype or shape differs\n", da->name);
		return 0;
	}
	size_t n = 0;
	if (flow_shape_numel(&da->shape, &n, diag) != FLOW_OK)
		return -1;
	float *x = malloc((n ? n : 1) * sizeof *x);
	float *y = malloc((n ? n : 1) * sizeof *y);
	int ok = -1;
	if (x && y && flow_ckpt_read(a, i, NULL, x, diag) == FLOW_OK &&
	    flow_ckpt_read(b, (size_t)j, NULL, y, diag) == FLOW_OK) {
		double dd = 0.0, aa = 0.0, maxd = 0.0;
		size_t at = 0;
		for (size_t k = 0; k < n; k++) {
			if (skipped(da->name, k))
				continue;
			double d = fabs((double)x[k] - y[k]);
			dd += d * d;
			aa += (double)x[k] * x[k];
			if (!(d <= maxd)) { /* NaN counts as worst */
				maxd = isnan(d) ? INFINITY : d;
				at = k;
			}
		}
		double mine = aa > 0 ? sqrt(dd / aa) : sqrt(dd);
		if (isnan(mine))
			mine = INFINITY;
		if (mine > *worst)
			*worst = mine;
		ok = mine <= tol;
		if (!ok)
			printf("%s: relative L2 difference %.3g (largest at element %zu: %.9g vs %.9g)\n",
			       da->name, mine, at, (double)x[at], (double)y[at]);
	}
	free(x);
	free(y);
	return ok;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: ckpt_close STEP_DIR_A STEP_DIR_B TOL [NAME:START:END...]\n");
		return 2;
	}
	nskips = (size_t)(argc - 4);
	skips = calloc(nskips + 1, sizeof *skips);
	if (!skips)
		return 2;
	for (size_t i = 0; i < nskips; i++) {
		const char *arg = argv[4 + i], *colon = strchr(arg, ':');
		if (!colon || (size_t)(colon - arg) >= FLOW_CKPT_NAME_MAX ||
		    sscanf(colon + 1, "%zu:%zu", &skips[i].start,
			   &skips[i].end) != 2) {
			fprintf(stderr, "ckpt_close: bad skip '%s'\n", arg);
			return 2;
		}
		memcpy(skips[i].name, arg, (size_t)(colon - arg));
	}
	double tol = atof(argv[3]);
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_ckpt_t *a = NULL, *b = NULL;
	if (flow_ckpt_open(argv[1], &a, &diag) != FLOW_OK)
		return fail_open(argv[1], &diag);
	if (flow_ckpt_open(argv[2], &b, &diag) != FLOW_OK) {
		flow_ckpt_free(a);
		return fail_open(argv[2], &diag);
	}
	int status = 0;
	double worst = 0.0;
	size_t n = flow_ckpt_tensor_count(a);
	if (n != flow_ckpt_tensor_count(b)) {
		printf("%zu tensors against %zu\n", n, flow_ckpt_tensor_count(b));
		status = 1;
	}
	for (size_t i = 0; i < n && status != 2; i++) {
		int ok = tensor_close(a, b, i, tol, &worst, &diag);
		if (ok < 0)
			status = fail_open(argv[1], &diag);
		else if (!ok)
			status = 1;
	}
	if (status != 2)
		printf("%zu tensors, worst relative difference %.3g\n", n, worst);
	flow_ckpt_free(a);
	flow_ckpt_free(b);
	free(skips);
	return status;
}
