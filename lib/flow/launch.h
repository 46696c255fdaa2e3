/* A single-node launcher that is its own PMIx server: the engine of
 * `flow-train --nproc N` and `flow-bench --nproc N`.
 *
 * The launcher hosts a PMIx server through libpmix's server API, registers
 * one namespace of N ranks on this node and forks N copies of a program,
 * which then join the job with the ordinary PMIx client calls
 * (flow_world_init), exactly as under srun --mpi=pmix or mpirun.  It
 * forwards SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 to every rank;
 * when a rank fails (exits non-zero, is killed, calls PMIx_Abort, or exits
 * without PMIx_Finalize) it stops the others (SIGTERM, then SIGKILL after a
 * grace period) and reports the rank. */
#ifndef FLOW_LAUNCH_H
#define FLOW_LAUNCH_H

#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flow_launch_opts {
	int nproc;            /* ranks, >= 1 */
	const char *path;     /* program to run; NULL: this program
				 (/proc/self/exe) */
	char *const *argv;    /* its argv (argv[0] included), NULL-ended */
	double grace_s;       /* SIGTERM -> SIGKILL delay; <= 0: 5 s */
	/* Prefix of the launcher's own messages, e.g. "flow-train". */
	const char *prog;
} flow_launch_opts_t;

/* Run the job and wait for it.  Returns the exit status the launcher's
 * caller should exit with: 0 when every rank finalized and exited 0; the
 * first failed rank's status otherwise (128+N for a signal, the PMIx_Abort
 * status, 1 for an exit 0 without PMIx_Finalize).  Before returning a
 * failure it prints one line on stderr naming the rank, e.g.
 *   flow-train: rank 2 was killed by signal 9 (Killed); stopping the other 3 ranks
 * When the launcher itself was ended by SIGINT/SIGTERM/SIGHUP it re-raises
 * that signal after the ranks are gone (the shell sees 128+N).
 * Returns -1 with diag set when nothing could be started: FLOW_ERR_NOTSUP
 * (a build without PMIx), FLOW_ERR_USAGE (nproc outside 1 to 4096, no
 * argv[0], or already one of several ranks of a job:
 * SLURM_STEP_NUM_TASKS, OMPI_COMM_WORLD_SIZE or PMI_SIZE > 1),
 * FLOW_ERR_NOMEM, FLOW_ERR_IO (server or fork failure; the program not
 * found or not executable). */
FLOW_EXPORT int flow_launch(const flow_launch_opts_t *opts, flow_diag_t *diag);

/* A copy of argv without the --nproc option ("--nproc N" or "--nproc=N")
 * for the ranks; NULL-ended, free with free() (one block).  NULL on
 * allocation failure. */
FLOW_EXPORT char **flow_launch_strip_option(int argc, char *const *argv,
					    const char *option);

#ifdef __cplusplus
}
#endif

#endif
