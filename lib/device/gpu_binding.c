/* Which CUDA device a rank uses (flow/gpu_binding.h has the rule), and the
 * words that say why.  Nothing here calls CUDA: the caller counts the
 * devices, so the rule is the same with or without a GPU build. */
#include <config.h>

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/gpu_binding.h>
#include <flow/parse.h>

/* A CUDA_VISIBLE_DEVICES longer than this is counted, not copied, so
 * that the entry that names the device still fits in a line. */
#define LIST_COPY_MAX 160
/* The longest entry named (a MIG id is 44 characters, the older
 * MIG-GPU-<uuid>/GI/CI form about 56). */
#define ENTRY_SHOW_MAX 64

static bool is_set(const char *s)
{
	return s && *s;
}

void flow_gpu_binding_input_from_env(flow_gpu_binding_input_t *in)
{
	in->cuda_visible_devices = getenv("CUDA_VISIBLE_DEVICES");
	in->slurm_step_gpus = getenv("SLURM_STEP_GPUS");
	in->slurm_job_gpus = getenv("SLURM_JOB_GPUS");
	in->cuda_device = getenv("FLOW_CUDA_DEVICE");
}

/* ---- CUDA_VISIBLE_DEVICES, for messages ----------------------------------- */

/* How many entries a comma list has. */
static size_t list_count(const char *list)
{
	size_t n = 1;
	for (const char *p = list; *p; p++)
		n += *p == ',';
	return n;
}

/* Entry i of list: its first character and length; false when the list
 * has fewer entries or that one is blank. */
static bool list_entry(const char *list, size_t i, const char **start,
		       size_t *len)
{
	const char *p = list;
	for (; i > 0; i--) {
		p = strchr(p, ',');
		if (!p)
			return false;
		p++;
	}
	const char *end = strchr(p, ',');
	if (!end)
		end = p + strlen(p);
	while (p < end && isspace((unsigned char)*p))
		p++;
	while (end > p && isspace((unsigned char)end[-1]))
		end--;
	if (p == end)
		return false;
	*start = p;
	*len = (size_t)(end - p);
	return true;
}

static bool all_digits(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (!isdigit((unsigned char)s[i]))
			return false;
	return true;
}

/* "device 1 of CUDA_VISIBLE_DEVICES=2,3 (physical 3)": an integer entry is
 * the node's numbering, anything else (GPU-<uuid>, MIG-<uuid>) is named as
 * it is written.  Nothing when the variable is unset. */
static void list_phrase(char *buf, size_t cap, const char *list, int device)
{
	buf[0] = '\0';
	if (!list)
		return;
	char entry[ENTRY_SHOW_MAX + 16] = "";
	const char *start;
	size_t len;
	if (list_entry(list, (size_t)device, &start, &len)) {
		int shown = len < ENTRY_SHOW_MAX ? (int)len : ENTRY_SHOW_MAX;
		snprintf(entry, sizeof entry, " (%s%.*s)",
			 all_digits(start, len) ? "physical " : "", shown,
			 start);
	}
	if (strlen(list) <= LIST_COPY_MAX)
		snprintf(buf, cap, "; device %d of CUDA_VISIBLE_DEVICES=%s%s",
			 device, list, entry);
	else
		snprintf(buf, cap,
			 "; device %d of the %zu entries of CUDA_VISIBLE_DEVICES%s",
			 device, list_count(list), entry);
}

/* " (CUDA_VISIBLE_DEVICES=0,1)" after a count of devices, so a refusal
 * shows what hid the others.  Nothing when the variable is unset. */
static void list_note(char *buf, size_t cap, const char *list)
{
	if (!list)
		buf[0] = '\0';
	else if (!*list)
		snprintf(buf, cap, " (CUDA_VISIBLE_DEVICES is empty)");
	else if (strlen(list) <= LIST_COPY_MAX)
		snprintf(buf, cap, " (CUDA_VISIBLE_DEVICES=%s)", list);
	else
		snprintf(buf, cap, " (CUDA_VISIBLE_DEVICES has %zu entries)",
			 list_count(list));
}

/* ---- the rule ----------------------------------------------------------------- */

/* Rule 3: Slurm gave this task a GPU of its own (flow/gpu_binding.h). */
static bool bound_by_slurm(const flow_gpu_binding_input_t *in)
{
	return in->visible_count == 1 && in->local_size > 1 &&
	       (is_set(in->slurm_step_gpus) || is_set(in->slurm_job_gpus) ||
		is_set(in->cuda_visible_devices));
}

/* FLOW_CUDA_DEVICE as an ordinal below visible_count (rule 2). */
static flow_err_t parse_override(const flow_gpu_binding_input_t *in,
				 const char *who, const char *note,
				 int *device_out, flow_diag_t *diag)
{
	int64_t v;
	int last = in->visible_count - 1;
	flow_err_t err = flow_parse_int(in->cuda_device, INT64_MIN, INT64_MAX,
					&v, NULL);
	if (err == FLOW_ERR_USAGE || (err == FLOW_OK && v < 0)) {
		if (last == 0)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: invalid FLOW_CUDA_DEVICE '%s': expected 0, the ordinal of the one CUDA device visible on node %s",
					     who, in->cuda_device, in->node);
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: invalid FLOW_CUDA_DEVICE '%s': expected a device ordinal from 0 to %d",
				     who, in->cuda_device, last);
	}
	if (err != FLOW_OK || v > last)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: FLOW_CUDA_DEVICE=%s is out of range: only %d CUDA %s visible on node %s%s",
				     who, in->cuda_device, in->visible_count,
				     in->visible_count == 1 ? "device is"
							    : "devices are",
				     in->node, note);
	*device_out = (int)v;
	return FLOW_OK;
}

flow_err_t flow_gpu_binding_pick(const flow_gpu_binding_input_t *in,
				 flow_gpu_binding_t *out, flow_diag_t *diag)
{
	if (in->local_size < 1 || in->local_rank < 0 ||
	    in->local_rank >= in->local_size || in->visible_count < 0 ||
	    !in->node)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "rank %d: invalid GPU binding input (local rank %d of %d, visible_count %d, node %s)",
				     in->rank, in->local_rank, in->local_size,
				     in->visible_count,
				     in->node ? in->node : "unnamed");

	/* Sized so that the description always fits: no truncation. */
	char who[64], note[LIST_COPY_MAX + 64], reason[96];
	snprintf(who, sizeof who, "rank %d (local rank %d of %d)", in->rank,
		 in->local_rank, in->local_size);
	list_note(note, sizeof note, in->cuda_visible_devices);
	if (in->visible_count == 0)
		return flow_diag_set(diag, FLOW_ERR_DEVICE,
				     "%s: no CUDA device is visible on node %s%s",
				     who, in->node, note);

	flow_gpu_binding_t b = { 0 };
	if (is_set(in->cuda_device)) {
		flow_err_t err = parse_override(in, who, note, &b.device, diag);
		if (err != FLOW_OK)
			return err;
		b.how = FLOW_GPU_BINDING_OVERRIDE;
		snprintf(reason, sizeof reason,
			 "local rank %d of %d, FLOW_CUDA_DEVICE=%d",
			 in->local_rank, in->local_size, b.device);
	} else if (bound_by_slurm(in)) {
		b.device = 0;
		b.how = FLOW_GPU_BINDING_SLURM;
		snprintf(reason, sizeof reason,
			 "local rank %d of %d, bound by Slurm", in->local_rank,
			 in->local_size);
	} else if (in->local_size <= in->visible_count) {
		b.device = in->local_rank;
		b.how = FLOW_GPU_BINDING_LOCAL_RANK;
		snprintf(reason, sizeof reason, "local rank %d of %d",
			 in->local_rank, in->local_size);
	} else if (in->shared_ok) {
		b.device = in->local_rank % in->visible_count;
		b.how = FLOW_GPU_BINDING_SHARED;
		snprintf(reason, sizeof reason,
			 "local rank %d of %d, %d ranks share %d %s",
			 in->local_rank, in->local_size, in->local_size,
			 in->visible_count,
			 in->visible_count == 1 ? "device" : "devices");
	} else {
		bool one = in->visible_count == 1;
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: only %d CUDA %s visible on node %s%s; two ranks would share a GPU (pass --comm cpu to allow it, or launch at most %d %s per node)",
				     who, in->visible_count,
				     one ? "device is" : "devices are",
				     in->node, note, in->visible_count,
				     one ? "rank" : "ranks");
	}

	char phrase[LIST_COPY_MAX + ENTRY_SHOW_MAX + 64];
	list_phrase(phrase, sizeof phrase, in->cuda_visible_devices, b.device);
	snprintf(b.desc, sizeof b.desc, "rank %d: cuda:%d (%s)%s", in->rank,
		 b.device, reason, phrase);
	*out = b;
	return FLOW_OK;
}
