/* The unit tests' singleton world; see worldutil.h. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>

#include "worldutil.h"

void worldutil_clear_launcher_environment(void)
{
	static const char *const vars[] = {
		"PMIX_NAMESPACE", "PMIX_RANK", "SLURM_STEP_NUM_TASKS",
		"SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
	};
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
}

int worldutil_singleton_open(double timeout_s, flow_world_t **world_out,
			     flow_comm_t **comm_out)
{
	flow_world_t *w = NULL;
	flow_comm_t *c = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	worldutil_clear_launcher_environment();
	if (flow_world_init(&w, timeout_s, &diag) != FLOW_OK)
		goto out_fail;
	if (flow_comm_world(w, FLOW_COMM_CPU, &c, &diag) != FLOW_OK) {
		flow_world_abort(w, 1, flow_diag_message(&diag));
		goto out_fail;
	}
	*world_out = w;
	*comm_out = c;
	return 0;
out_fail:
	fprintf(stderr, "%s\n", flow_diag_message(&diag));
	return -1;
}

int worldutil_singleton_close(flow_world_t *world, flow_comm_t *comm)
{
	flow_comm_free(comm);
	return flow_world_free(world, NULL) == FLOW_OK ? 0 : -1;
}

flow_world_t *worldutil_world;
flow_comm_t *worldutil_comm;

int worldutil_setup(void **state)
{
	(void)state;
	return worldutil_singleton_open(5.0, &worldutil_world, &worldutil_comm);
}

int worldutil_teardown(void **state)
{
	(void)state;
	return worldutil_singleton_close(worldutil_world, worldutil_comm);
}
