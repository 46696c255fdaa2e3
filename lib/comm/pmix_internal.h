/* What the PMIx bootstrap (world.c) and the launcher (launch.c) share:
 * <pmix.h>, and how an outer launcher's environment is read.
 *
 * pmix_common.h's inline helpers call atoi, which lib/core/banned.h turns into a
 * compile error; the ban is lifted for the foreign headers only and stays
 * in force for flow's own code. */
#ifndef FLOW_PMIX_INTERNAL_H
#define FLOW_PMIX_INTERNAL_H

#ifdef HAVE_PMIX
#pragma push_macro("atoi")
#undef atoi
#include <pmix.h>
#include <pmix_server.h>
#pragma pop_macro("atoi")
#endif

/* How many tasks an outer launcher started, as its environment says
 * without PMIx: the first of SLURM_STEP_NUM_TASKS, OMPI_COMM_WORLD_SIZE
 * and PMI_SIZE that holds a number above 1 (not SLURM_NTASKS, which a
 * batch script sees outside any step).  Returns that number, with the
 * variable and its text in *var_out and *value_out; 1, with both NULL,
 * when none does.  Defined in world.c. */
long flow_launcher_tasks(const char **var_out, const char **value_out);

#endif
