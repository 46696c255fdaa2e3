/* Cluster profiles (flow/cluster.h): the built-in profile and the reader
 * of profile files, which the boxing cost model and the plan checker use.
 * Each line is one setting; an error names the file and line. */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/cluster.h>
#include <flow/parse.h>

void flow_cluster_default(flow_cluster_t *cluster)
{
	cluster->ranks_per_node = 8;
	cluster->intra.alpha_s = 5e-6;
	cluster->intra.beta_bps = 100e9;
	cluster->inter.alpha_s = 10e-6;
	cluster->inter.beta_bps = 12.5e9;
	cluster->memory_bytes = 0;
}

/* Splits line in place into at most max whitespace-separated fields,
 * ignoring a '#' comment; returns the number of fields, max + 1 when there
 * are more. */
static int split_fields(char *line, char **fields, int max)
{
	char *hash = strchr(line, '#');
	if (hash)
		*hash = '\0';
	int n = 0;
	char *p = line;
	for (;;) {
		while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
			p++;
		if (!*p)
			return n;
		if (n == max)
			return max + 1;
		fields[n++] = p;
		while (*p && *p != ' ' && *p != '\t' && *p != '\r' && *p != '\n')
			p++;
		if (*p)
			*p++ = '\0';
	}
}

/* Applies one line of a cluster profile; seen records the settings
 * already given, which may not repeat. */
static flow_err_t cluster_line(const char *path, long lineno, char *line,
			       flow_cluster_t *c, unsigned *seen,
			       flow_diag_t *diag)
{
	char *f[4];
	int n = split_fields(line, f, 4);
	if (n == 0)
		return FLOW_OK;
	flow_diag_t why = FLOW_DIAG_INIT;
	flow_err_t err = FLOW_OK;
	unsigned bit;
	if (strcmp(f[0], "ranks_per_node") == 0) {
		if (n != 2)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s:%ld: expected 'ranks_per_node N'",
					     path, lineno);
		bit = 1;
		err = flow_parse_int(f[1], 1, INT64_MAX, &c->ranks_per_node, &why);
	} else if (strcmp(f[0], "link") == 0) {
		if (n != 4 || (strcmp(f[1], "intra") != 0 && strcmp(f[1], "inter") != 0))
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s:%ld: expected 'link intra|inter ALPHA_US BETA_GBPS'",
					     path, lineno);
		bool intra = strcmp(f[1], "intra") == 0;
		flow_link_t *link = intra ? &c->intra : &c->inter;
		bit = intra ? 2 : 4;
		double alpha_us, beta_gbps;
		err = flow_parse_double(f[2], 0, 1e9, &alpha_us, &why);
		if (err == FLOW_OK)
			err = flow_parse_double(f[3], 0, 1e9, &beta_gbps, &why);
		if (err == FLOW_OK && beta_gbps <= 0)
			err = flow_diag_set(&why, FLOW_ERR_RANGE,
					    "bandwidth '%s' is not positive", f[3]);
		if (err == FLOW_OK) {
			link->alpha_s = alpha_us * 1e-6;
			link->beta_bps = beta_gbps * 1e9;
		}
	} else if (strcmp(f[0], "memory") == 0) {
		if (n != 2)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s:%ld: expected 'memory GIB'",
					     path, lineno);
		bit = 8;
		double gib;
		err = flow_parse_double(f[1], 1.0 / 1024, 1 << 20, &gib, &why);
		if (err == FLOW_OK)
			c->memory_bytes = (uint64_t)(gib * 1073741824.0);
	} else {
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s:%ld: unknown setting '%s'", path,
				     lineno, f[0]);
	}
	if (err != FLOW_OK)
		return flow_diag_set(diag, FLOW_ERR_FORMAT, "%s:%ld: %s", path,
				     lineno, flow_diag_message(&why));
	if (*seen & bit)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s:%ld: '%s%s%s' given twice", path, lineno,
				     f[0], n == 4 ? " " : "", n == 4 ? f[1] : "");
	*seen |= bit;
	return FLOW_OK;
}

flow_err_t flow_cluster_read(const char *path, flow_cluster_t *cluster_out,
			     flow_diag_t *diag)
{
	flow_cluster_t c;
	flow_cluster_default(&c);
	FILE *f = fopen(path, "r");
	if (!f)
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot open cluster profile '%s'", path);
	char *line = NULL;
	size_t cap = 0;
	long lineno = 0;
	unsigned seen = 0;
	flow_err_t err = FLOW_OK;
	while (getline(&line, &cap, f) >= 0) {
		err = cluster_line(path, ++lineno, line, &c, &seen, diag);
		if (err != FLOW_OK)
			goto out_close;
	}
	if (ferror(f))
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot read cluster profile '%s'", path);
out_close:
	free(line);
	fclose(f);
	if (err == FLOW_OK)
		*cluster_out = c;
	return err;
}
