/* Cluster profiles (flow(7), CLUSTER PROFILE): what the cost model knows of
 * the machines a plan runs on.  Ranks are packed into nodes in rank order;
 * two link classes, within a node and across nodes, each with a latency
 * and a bandwidth (the alpha and beta of the boxing costs, flow/boxing.h);
 * and the memory of one rank, which flow_plan_check holds a plan's
 * per-rank bytes against.  A profile is a small text file, written by
 * `flow-bench profile` or by hand.  Profiles are plain values: no state,
 * safe from any thread. */
#ifndef FLOW_CLUSTER_H
#define FLOW_CLUSTER_H

#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One link class. */
typedef struct flow_link {
	double alpha_s;      /* latency per message, seconds */
	double beta_bps;     /* bandwidth, bytes per second */
} flow_link_t;

typedef struct flow_cluster {
	int64_t ranks_per_node; /* ranks r and s share a node iff
				 * r / ranks_per_node == s / ranks_per_node */
	flow_link_t intra;      /* within a node */
	flow_link_t inter;      /* across nodes */
	uint64_t memory_bytes;  /* of one rank (its device, or its share of
				 * the node); 0: unknown, not checked */
} flow_cluster_t;

/* Fill *cluster with the built-in profile: 8 ranks per node, intra 5 us /
 * 100 GB/s, inter 10 us / 12.5 GB/s (NVLink-class and 100 Gb/s-class
 * links), memory unknown (0). */
FLOW_EXPORT void flow_cluster_default(flow_cluster_t *cluster);

/* Read the cluster profile at path: '#' comments, blank lines, and at most
 * one each of the lines "ranks_per_node N" (N >= 1), "link intra ALPHA_US
 * BETA_GBPS", "link inter ALPHA_US BETA_GBPS" (latency in microseconds,
 * 0 to 1e9; bandwidth in GB/s, positive, at most 1e9) and "memory GIB"
 * (per rank, 1/1024 to 2^20); settings not given keep
 * flow_cluster_default's values.
 * Returns FLOW_OK and sets *cluster_out.  FLOW_ERR_IO when the file
 * cannot be opened or read ("cannot open cluster profile 'PATH': ..." or
 * "cannot read cluster profile 'PATH': ...", with strerror);
 * FLOW_ERR_FORMAT for a bad line, "PATH:LINE: message".  On error
 * *cluster_out is untouched. */
FLOW_EXPORT flow_err_t flow_cluster_read(const char *path,
					 flow_cluster_t *cluster_out,
					 flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
