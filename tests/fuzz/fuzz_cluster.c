/* Cluster profiles (flow_cluster_read, flow/cluster.h): the reader takes a
 * path, so the input goes to a scratch file.  A profile that reads must
 * hold the values its contract promises. */
#include <config.h>

#include <flow/cluster.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[1024];
	fuzz_write(path, sizeof path, "cluster.prof", data, size);
	flow_cluster_t c;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_cluster_read(path, &c, &diag);
	fuzz_check_diag("flow_cluster_read", err, &diag);
	if (err == FLOW_OK &&
	    (c.ranks_per_node < 1 || !(c.intra.beta_bps > 0) ||
	     !(c.inter.beta_bps > 0) || !(c.intra.alpha_s >= 0) ||
	     !(c.inter.alpha_s >= 0)))
		fuzz_fail("flow_cluster_read accepted a profile out of range");
	return 0;
}
