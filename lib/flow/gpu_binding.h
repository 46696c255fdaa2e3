/* Which CUDA device a rank uses: a pure function of what the rank knows
 * (its local rank among the ranks of its node, how many devices CUDA
 * shows it, and a few environment variables), so that every launcher
 * (srun --mpi=pmix, mpirun, flow-train --nproc) gets the same answer and
 * the rule is tested without a GPU.
 *
 * The rule, in the order it is applied:
 *
 *   1. No device visible (visible_count == 0): FLOW_ERR_DEVICE.
 *   2. FLOW_CUDA_DEVICE set: that ordinal (0 .. visible_count-1), taken as
 *      given; anything else is FLOW_ERR_USAGE.  Ranks of one node given
 *      the same ordinal share it (the NCCL communicator refuses that by
 *      PCI bus id; --comm cpu allows it).
 *   3. Bound by Slurm: one visible device, several ranks on the node, and
 *      SLURM_STEP_GPUS, SLURM_JOB_GPUS or CUDA_VISIBLE_DEVICES set.  That
 *      is what srun --gpus-per-task=1, --gpu-bind=single:1 or closest
 *      give: each task sees only its own GPU, as ordinal 0.  Ordinal 0.
 *   4. local_size <= visible_count: the local rank, so the ranks of a node
 *      take one device each.
 *   5. shared_ok (flow-train --comm cpu): local_rank % visible_count, so
 *      the ranks spread over the devices as evenly as they can.
 *   6. Otherwise two ranks would share a GPU: FLOW_ERR_USAGE.
 *
 * CUDA applies CUDA_VISIBLE_DEVICES before it counts, so ordinals are
 * always 0 .. visible_count-1 and the variable's entries (integers,
 * GPU-<uuid>, MIG-<uuid>, renumbered ones under a device cgroup) are never
 * read as indices: they only name the device in messages.
 *
 * What one rank cannot see: several tasks given the same single GPU
 * (srun -n 2 --gres=gpu:1: CUDA_VISIBLE_DEVICES=0 on both) look like rule
 * 3, and tasks bound to several GPUs each (--gpus-per-task=2) with more
 * ranks than that on the node are refused by rule 6.  The first is caught
 * by the NCCL communicator's exchange of PCI bus ids; for the second give
 * each task one GPU.
 *
 * Thread-safe: no state.  flow_gpu_binding_input_from_env reads the
 * environment, so it must not race with setenv. */
#ifndef FLOW_GPU_BINDING_H
#define FLOW_GPU_BINDING_H

#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the rule reads.  The strings are borrowed for the call; NULL or ""
 * means unset. */
typedef struct flow_gpu_binding_input {
	int rank;          /* world rank, for messages */
	int local_rank;    /* 0 .. local_size-1 (flow_world_info_t) */
	int local_size;    /* ranks on this node, >= 1 */
	int visible_count; /* cudaGetDeviceCount(), >= 0 */
	const char *node;  /* node name (flow_world_info_t.host), for
			      messages */
	bool shared_ok;    /* several ranks may use one device */
	/* From the environment (flow_gpu_binding_input_from_env). */
	const char *cuda_visible_devices; /* for messages only */
	const char *slurm_step_gpus;
	const char *slurm_job_gpus;
	const char *cuda_device; /* FLOW_CUDA_DEVICE: an ordinal */
} flow_gpu_binding_input_t;

/* Which rule of the list above picked the device. */
typedef enum {
	FLOW_GPU_BINDING_LOCAL_RANK = 0, /* rule 4 */
	FLOW_GPU_BINDING_SLURM = 1,      /* rule 3 */
	FLOW_GPU_BINDING_OVERRIDE = 2,   /* rule 2 */
	FLOW_GPU_BINDING_SHARED = 3,     /* rule 5 */
} flow_gpu_binding_how_t;

/* Longest description kept, including the terminating NUL. */
#define FLOW_GPU_BINDING_DESC_MAX 512

typedef struct flow_gpu_binding {
	int device; /* the CUDA ordinal, for cudaSetDevice */
	flow_gpu_binding_how_t how;
	/* One line for the run's preamble, e.g.
	 * "rank 3: cuda:1 (local rank 1 of 8); device 1 of
	 * CUDA_VISIBLE_DEVICES=2,3 (physical 3)" (without the line break).
	 * A CUDA_VISIBLE_DEVICES longer than 160 characters is not copied:
	 * "device 1 of the 16 entries of CUDA_VISIBLE_DEVICES (MIG-...)". */
	char desc[FLOW_GPU_BINDING_DESC_MAX];
} flow_gpu_binding_t;

/* Set the four environment fields of in from getenv:
 * CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS, SLURM_JOB_GPUS and
 * FLOW_CUDA_DEVICE (NULL when unset).  The other fields are left as they
 * are, for the caller to fill from its world and from CUDA.  The pointers
 * are borrowed from the environment: valid until the variable is set or
 * unset. */
FLOW_EXPORT void flow_gpu_binding_input_from_env(flow_gpu_binding_input_t *in);

/* Apply the rule to in.  Returns FLOW_OK and sets *out; otherwise *out is
 * untouched and diag holds one line that starts with the rank, e.g.
 *   rank 5 (local rank 5 of 8): only 4 CUDA devices are visible on node
 *   gpu07; two ranks would share a GPU (pass --comm cpu to allow it, or
 *   launch at most 4 ranks per node)
 * FLOW_ERR_DEVICE when no device is visible; FLOW_ERR_USAGE when ranks
 * would share one without shared_ok, for a malformed or out-of-range
 * FLOW_CUDA_DEVICE, and for inputs outside their ranges (a caller's bug:
 * local_size < 1, local_rank outside 0 .. local_size-1, visible_count < 0,
 * node NULL). */
FLOW_EXPORT flow_err_t flow_gpu_binding_pick(const flow_gpu_binding_input_t *in,
					     flow_gpu_binding_t *out,
					     flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
