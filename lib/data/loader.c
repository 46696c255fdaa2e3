/* The data loader: maps a split's shards, computes which sample fills each
 * slot of each global batch (the keyed permutation of loader_internal.h),
 * and reads this rank's windows, optionally one batch ahead on a thread.
 *
 * Threading: with prefetch, one worker thread does every flow_shard_read
 * (flow_shard_read allows one thread per shard at a time); the caller's
 * thread only copies finished batches out.  Without prefetch the caller's
 * thread reads.  The mutex guards the request/ready hand-off and the batch
 * buffer while a finished batch waits to be copied. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/json.h>
#include <flow/loader.h>

#include "loader_internal.h"

struct flow_loader {
	char *dir;                 /* as given, for messages */
	flow_manifest_t manifest;
	bool have_manifest;
	flow_split_t split;
	uint32_t seq_len;
	uint64_t global_batch;
	uint64_t seed;
	uint32_t dp_rank;
	uint32_t dp_size;
	uint64_t local_batch;
	uint64_t samples;          /* N */

	/* The split's shards that hold at least one sample, in manifest
	 * order: their manifest index, their first sample number (with
	 * first_sample[nshards] = N) and their mapping. */
	size_t nshards;
	size_t *manifest_index;
	uint64_t *first_sample;
	flow_shard_t **shards;
	/* Whose checksum has been verified (by the reading thread, before
	 * its first token is used); all true when unchecked. */
	bool *verified;

	/* Reading: one window and one batch, used by the reading thread. */
	size_t batch_elems;        /* local_batch * seq_len */
	uint32_t *window;          /* seq_len + 1 tokens */
	int32_t *batch_inputs;
	int32_t *batch_targets;

	uint64_t next_step;        /* first global batch not yet returned */

	/* Prefetch.  Under lock: stop, requested, request_step, busy, ready,
	 * ready_err, ready_diag, and batch_* while ready. */
	bool prefetch;
	bool unchecked;
	bool sync_inited;
	bool thread_started;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;
	bool requested;            /* request_step waits for the worker */
	uint64_t request_step;
	bool busy;                 /* the worker is reading */
	bool ready;                /* batch_* hold next_step's batch */
	flow_err_t ready_err;      /* or the error reading it */
	flow_diag_t ready_diag;
};

/* dir/file, without doubling a trailing '/'.  NULL when out of memory.
 * Owned by the caller: free(). */
static char *join_path(const char *dir, const char *file)
{
	size_t dlen = strlen(dir), flen = strlen(file), len;
	bool slash = dlen > 0 && dir[dlen - 1] != '/';
	if (!flow_add_size(dlen, flen, &len) ||
	    !flow_add_size(len, (size_t)slash + 1, &len))
		return NULL;
	char *path = malloc(len);
	if (!path)
		return NULL;
	memcpy(path, dir, dlen);
	if (slash)
		path[dlen] = '/';
	memcpy(path + dlen + slash, file, flen + 1);
	return path;
}

uint64_t flow_loader_samples_per_epoch(const flow_loader_t *loader)
{
	return loader->samples;
}

uint64_t flow_loader_local_batch(const flow_loader_t *loader)
{
	return loader->local_batch;
}

/* The mapped shard (index into loader->shards) that holds sample: the last
 * one whose first sample is <= sample. */
static size_t shard_of(const flow_loader_t *loader, uint64_t sample)
{
	size_t lo = 0, hi = loader->nshards;
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (loader->first_sample[mid] <= sample)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* flow_loader_sample_at, also giving the mapped shard's index. */
static void locate(const flow_loader_t *loader, uint64_t step, uint64_t slot,
		   flow_sample_ref_t *ref_out, size_t *mapped_out)
{
	/* Positions are taken modulo 2^64; flow_loader_next refuses to go
	 * that far, 2^64 samples being beyond any run. */
	uint64_t position = step * loader->global_batch + slot;
	uint64_t epoch = position / loader->samples;
	uint64_t index = position % loader->samples;
	flow_loader_perm_t perm;
	flow_loader_perm_init(&perm, loader->samples, loader->manifest.checksum,
			      loader->seed, epoch);
	uint64_t sample = flow_loader_perm_apply(&perm, index);
	size_t k = shard_of(loader, sample);
	ref_out->position = position;
	ref_out->epoch = epoch;
	ref_out->sample = sample;
	ref_out->shard = loader->manifest_index[k];
	ref_out->offset = (sample - loader->first_sample[k]) * loader->seq_len;
	*mapped_out = k;
}

void flow_loader_sample_at(const flow_loader_t *loader, uint64_t step,
			   uint64_t slot, flow_sample_ref_t *ref_out)
{
	size_t mapped;
	locate(loader, step, slot, ref_out, &mapped);
}

/* Read this rank's rows of global batch step into batch_inputs and
 * batch_targets.  Called by one thread at a time. */
static flow_err_t read_batch(flow_loader_t *loader, uint64_t step,
			     flow_diag_t *diag)
{
	const uint64_t first_slot = (uint64_t)loader->dp_rank *
				    loader->local_batch;
	const size_t t = loader->seq_len;
	for (uint64_t row = 0; row < loader->local_batch; row++) {
		flow_sample_ref_t ref;
		size_t mapped;
		locate(loader, step, first_slot + row, &ref, &mapped);
		if (!loader->verified[mapped]) {
			flow_err_t err = flow_shard_verify_checksum(
				loader->shards[mapped], diag);
			if (err != FLOW_OK)
				return err;
			loader->verified[mapped] = true;
		}
		flow_err_t err = flow_shard_read(loader->shards[mapped],
						 ref.offset,
						 t + 1, loader->window, diag);
		if (err != FLOW_OK)
			return err;
		int32_t *in = loader->batch_inputs + row * t;
		int32_t *tg = loader->batch_targets + row * t;
		/* flow_shard_read checked the tokens against the shard's
		 * vocabulary, which is the manifest's (map_shards), which
		 * fits int32 (flow_loader_open). */
		for (size_t j = 0; j < t; j++) {
			in[j] = (int32_t)loader->window[j];
			tg[j] = (int32_t)loader->window[j + 1];
		}
	}
	return FLOW_OK;
}

/* The prefetch thread: reads each requested batch into batch_*, then
 * waits until the caller has copied it out and asks for the next. */
static void *prefetch_main(void *arg)
{
	flow_loader_t *loader = arg;
	pthread_mutex_lock(&loader->lock);
	for (;;) {
		while (!loader->stop && !loader->requested)
			pthread_cond_wait(&loader->cond, &loader->lock);
		if (loader->stop)
			break;
		uint64_t step = loader->request_step;
		loader->requested = false;
		loader->busy = true;
		pthread_mutex_unlock(&loader->lock);

		/* Unlocked: nobody else touches the shards, the window or
		 * batch_* while busy is set. */
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_err_t err = read_batch(loader, step, &diag);

		pthread_mutex_lock(&loader->lock);
		loader->busy = false;
		loader->ready = true;
		loader->ready_err = err;
		loader->ready_diag = diag;
		pthread_cond_broadcast(&loader->cond);
	}
	pthread_mutex_unlock(&loader->lock);
	return NULL;
}

void flow_loader_free(flow_loader_t *loader)
{
	if (!loader)
		return;
	if (loader->thread_started) {
		pthread_mutex_lock(&loader->lock);
		loader->stop = true;
		pthread_cond_broadcast(&loader->cond);
		pthread_mutex_unlock(&loader->lock);
		pthread_join(loader->thread, NULL);
	}
	if (loader->sync_inited) {
		pthread_cond_destroy(&loader->cond);
		pthread_mutex_destroy(&loader->lock);
	}
	if (loader->shards)
		for (size_t i = 0; i < loader->nshards; i++)
			flow_shard_close(loader->shards[i]);
	free(loader->shards);
	free(loader->verified);
	free(loader->first_sample);
	free(loader->manifest_index);
	free(loader->window);
	free(loader->batch_inputs);
	free(loader->batch_targets);
	if (loader->have_manifest)
		flow_manifest_release(&loader->manifest);
	free(loader->dir);
	free(loader);
}

/* Check the options that do not need the dataset. */
static flow_err_t check_options(const flow_loader_options_t *o,
				flow_diag_t *diag)
{
	if (!o->dir)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "no dataset directory given");
	if (o->split != FLOW_SPLIT_TRAIN && o->split != FLOW_SPLIT_VAL)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: unknown split %d", o->dir,
				     (int)o->split);
	if (o->seq_len < 1)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: sequence length must be at least 1",
				     o->dir);
	if (o->global_batch < 1)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: global batch size must be at least 1",
				     o->dir);
	if (o->dp_size < 1)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: data-parallel size must be at least 1",
				     o->dir);
	if (o->dp_rank >= o->dp_size)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: data-parallel rank %" PRIu32
				     " is not below the data-parallel size %"
				     PRIu32, o->dir, o->dp_rank, o->dp_size);
	if (o->global_batch % o->dp_size != 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: data-parallel size %" PRIu32
				     " does not divide the global batch size %"
				     PRIu64, o->dir, o->dp_size,
				     o->global_batch);
	return FLOW_OK;
}

/* The samples shard s holds: they are seq_len + 1 tokens long and start
 * every seq_len tokens, so n tokens hold (n - 1) / seq_len of them.  None
 * when s belongs to the other split. */
static uint64_t shard_samples(const flow_loader_t *loader,
			      const flow_manifest_shard_t *s)
{
	if (s->split != loader->split || s->info.tokens == 0)
		return 0;
	return (s->info.tokens - 1) / loader->seq_len;
}

/* Count the split's samples and map the shards that hold any. */
static flow_err_t map_shards(flow_loader_t *loader, flow_diag_t *diag)
{
	const flow_manifest_t *m = &loader->manifest;
	flow_err_t err;
	size_t count = 0;
	uint64_t total = 0;
	for (size_t i = 0; i < m->nshards; i++) {
		const flow_manifest_shard_t *s = &m->shards[i];
		uint64_t n = shard_samples(loader, s);
		if (n == 0)
			continue;
		if (__builtin_add_overflow(total, n, &total))
			return flow_diag_set(diag, FLOW_ERR_RANGE,
					     "%s: more than 2^64 samples",
					     loader->dir);
		count++;
	}
	if (total == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: split '%s' has no sample of %" PRIu64
				     " tokens", loader->dir,
				     flow_split_name(loader->split),
				     (uint64_t)loader->seq_len + 1);

	size_t bytes;
	if (!flow_add_size(count, 1, &bytes) ||
	    !flow_mul_size(bytes, sizeof(uint64_t), &bytes))
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "%s: too many shards", loader->dir);
	loader->first_sample = malloc(bytes);
	loader->manifest_index = calloc(count, sizeof(size_t));
	loader->shards = calloc(count, sizeof(flow_shard_t *));
	loader->verified = calloc(count, sizeof(bool));
	if (!loader->first_sample || !loader->manifest_index ||
	    !loader->shards || !loader->verified)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "%s: out of memory for %zu shards",
				     loader->dir, count);

	uint64_t first = 0;
	for (size_t i = 0; i < m->nshards; i++) {
		const flow_manifest_shard_t *s = &m->shards[i];
		uint64_t n = shard_samples(loader, s);
		if (n == 0)
			continue;
		char *path = join_path(loader->dir, s->file);
		if (!path)
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "%s: out of memory", loader->dir);
		size_t k = loader->nshards;
		err = flow_shard_open(path, &loader->shards[k], diag);
		if (err == FLOW_OK) {
			loader->nshards++;
			/* Size, tokens, vocabulary and trailer as the manifest
			 * says, now; the payload's checksum before first use
			 * (read_batch). */
			err = flow_shard_check(loader->shards[k], &s->info,
					       m->vocab, diag);
			loader->verified[k] = loader->unchecked;
			if (loader->unchecked)
				flow_shard_skip_checks(loader->shards[k]);
		}
		free(path);
		if (err != FLOW_OK)
			return err;
		loader->manifest_index[k] = i;
		loader->first_sample[k] = first;
		first += n;
	}
	loader->first_sample[loader->nshards] = first;
	loader->samples = first;
	return FLOW_OK;
}

flow_err_t flow_loader_open(const flow_loader_options_t *options,
			    flow_loader_t **loader_out, flow_diag_t *diag)
{
	flow_err_t err = check_options(options, diag);
	if (err != FLOW_OK)
		return err;

	flow_loader_t *loader = calloc(1, sizeof(*loader));
	if (!loader)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "%s: out of memory", options->dir);
	loader->split = options->split;
	loader->seq_len = options->seq_len;
	loader->global_batch = options->global_batch;
	loader->seed = options->seed;
	loader->dp_rank = options->dp_rank;
	loader->dp_size = options->dp_size;
	loader->local_batch = options->global_batch / options->dp_size;
	loader->prefetch = options->prefetch;
	loader->unchecked = options->unchecked;
	loader->dir = strdup(options->dir);
	if (!loader->dir) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				    options->dir);
		goto out_free_loader;
	}

	err = flow_manifest_read(options->dir, &loader->manifest, diag);
	if (err != FLOW_OK)
		goto out_free_loader;
	loader->have_manifest = true;
	/* inputs and targets are int32: every id below the vocabulary must
	 * fit. */
	if (loader->manifest.vocab > (uint64_t)INT32_MAX + 1) {
		err = flow_diag_set(diag, FLOW_ERR_RANGE,
				    "%s: vocabulary size %" PRIu64
				    " does not fit int32 token ids",
				    loader->dir, loader->manifest.vocab);
		goto out_free_loader;
	}

	err = map_shards(loader, diag);
	if (err != FLOW_OK)
		goto out_free_loader;

	size_t window, elems, bytes;
	if (!flow_add_size(loader->seq_len, 1, &window) ||
	    !flow_mul_size(window, sizeof(uint32_t), &window) ||
	    loader->local_batch > SIZE_MAX ||
	    !flow_mul_size((size_t)loader->local_batch, loader->seq_len,
			   &elems) ||
	    !flow_mul_size(elems, sizeof(int32_t), &bytes)) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM,
				    "%s: a batch of %" PRIu64 " x %" PRIu32
				    " tokens does not fit in memory",
				    loader->dir, loader->local_batch,
				    loader->seq_len);
		goto out_free_loader;
	}
	loader->batch_elems = elems;
	loader->window = malloc(window);
	loader->batch_inputs = malloc(bytes);
	loader->batch_targets = malloc(bytes);
	if (!loader->window || !loader->batch_inputs ||
	    !loader->batch_targets) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM,
				    "%s: out of memory for a batch of %" PRIu64
				    " x %" PRIu32 " tokens", loader->dir,
				    loader->local_batch, loader->seq_len);
		goto out_free_loader;
	}

	if (loader->prefetch) {
		int rc = pthread_mutex_init(&loader->lock, NULL);
		if (rc == 0) {
			rc = pthread_cond_init(&loader->cond, NULL);
			if (rc != 0)
				pthread_mutex_destroy(&loader->lock);
		}
		if (rc != 0) {
			err = flow_diag_errno(diag, FLOW_ERR_NOMEM, rc,
					      "%s: cannot set up prefetching",
					      loader->dir);
			goto out_free_loader;
		}
		loader->sync_inited = true;
		rc = pthread_create(&loader->thread, NULL, prefetch_main,
				    loader);
		if (rc != 0) {
			err = flow_diag_errno(diag, FLOW_ERR_NOMEM, rc,
					      "%s: cannot start the prefetch "
					      "thread", loader->dir);
			goto out_free_loader;
		}
		loader->thread_started = true;
	}

	*loader_out = loader;
	return FLOW_OK;

out_free_loader:
	flow_loader_free(loader);
	return err;
}

/* Copy the batch buffers out to the caller. */
static void copy_batch(const flow_loader_t *loader, int32_t *inputs,
		       int32_t *targets)
{
	size_t bytes = loader->batch_elems * sizeof(int32_t);
	memcpy(inputs, loader->batch_inputs, bytes);
	memcpy(targets, loader->batch_targets, bytes);
}

int flow_loader_next(flow_loader_t *loader, int32_t *inputs,
		     int32_t *targets, flow_diag_t *diag)
{
	uint64_t end;
	if (__builtin_add_overflow(loader->next_step, 1, &end) ||
	    __builtin_mul_overflow(end, loader->global_batch, &end))
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "%s: stream position beyond 2^64",
				     loader->dir);

	if (!loader->prefetch) {
		flow_err_t err = read_batch(loader, loader->next_step, diag);
		if (err != FLOW_OK)
			return err;
		copy_batch(loader, inputs, targets);
		loader->next_step++;
		return 1;
	}

	int ret = 1;
	pthread_mutex_lock(&loader->lock);
	/* First call, or after seek or an error: nothing asked for yet. */
	if (!loader->ready && !loader->busy && !loader->requested) {
		loader->request_step = loader->next_step;
		loader->requested = true;
		pthread_cond_broadcast(&loader->cond);
	}
	while (!loader->ready)
		pthread_cond_wait(&loader->cond, &loader->lock);
	loader->ready = false;
	if (loader->ready_err != FLOW_OK) {
		/* The worker's message, once; the next call retries. */
		ret = flow_diag_set(diag, loader->ready_err, "%s",
				    flow_diag_message(&loader->ready_diag));
	} else {
		copy_batch(loader, inputs, targets);
		loader->next_step++;
		/* Read ahead while the caller trains on this one; past
		 * 2^64 positions the request is left for the check above. */
		uint64_t ahead;
		if (!__builtin_add_overflow(end, loader->global_batch,
					    &ahead)) {
			loader->request_step = loader->next_step;
			loader->requested = true;
			pthread_cond_broadcast(&loader->cond);
		}
	}
	pthread_mutex_unlock(&loader->lock);
	return ret;
}

flow_loader_state_t flow_loader_get_state(const flow_loader_t *loader)
{
	/* next_step * G cannot overflow: flow_loader_next and seek keep
	 * (next_step) * G below 2^64. */
	uint64_t position = loader->next_step * loader->global_batch;
	flow_loader_state_t state = { position / loader->samples,
				      position % loader->samples };
	return state;
}

flow_err_t flow_loader_seek(flow_loader_t *loader,
			    const flow_loader_state_t *state,
			    flow_diag_t *diag)
{
	uint64_t position;
	if (state->index >= loader->samples)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: loader state index %" PRIu64
				     " is not below the %" PRIu64
				     " samples of an epoch", loader->dir,
				     state->index, loader->samples);
	if (__builtin_mul_overflow(state->epoch, loader->samples, &position) ||
	    __builtin_add_overflow(position, state->index, &position))
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "%s: loader state (epoch %" PRIu64
				     ", index %" PRIu64
				     ") is beyond 2^64 samples",
				     loader->dir, state->epoch, state->index);
	if (position % loader->global_batch != 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: loader state (epoch %" PRIu64
				     ", index %" PRIu64 ") is sample %" PRIu64
				     " of the stream, not on a boundary of "
				     "global batches of %" PRIu64,
				     loader->dir, state->epoch, state->index,
				     position, loader->global_batch);
	if (loader->prefetch) {
		pthread_mutex_lock(&loader->lock);
		/* Let a read in flight finish, then drop what was read. */
		while (loader->busy)
			pthread_cond_wait(&loader->cond, &loader->lock);
		loader->requested = false;
		loader->ready = false;
		loader->next_step = position / loader->global_batch;
		pthread_mutex_unlock(&loader->lock);
	} else {
		loader->next_step = position / loader->global_batch;
	}
	return FLOW_OK;
}

flow_err_t flow_loader_print_order(const flow_loader_t *loader,
				   uint64_t first_step, uint64_t steps,
				   FILE *out, bool json, flow_diag_t *diag)
{
	uint64_t end;
	if (__builtin_add_overflow(first_step, steps, &end) ||
	    __builtin_mul_overflow(end, loader->global_batch, &end))
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "%s: steps %" PRIu64 " to %" PRIu64
				     " go beyond 2^64 samples", loader->dir,
				     first_step, first_step + steps);

	const uint64_t first_slot = (uint64_t)loader->dp_rank *
				    loader->local_batch;
	bool first_row = true;
	errno = 0;
	int rc = json ? fputc('[', out) == EOF ? -1 : 0
		      : fprintf(out, "step\trank\tslot\tposition\tepoch\t"
				"sample\tfile\toffset\n");
	for (uint64_t s = first_step; rc >= 0 && s < first_step + steps; s++) {
		for (uint64_t j = 0; rc >= 0 && j < loader->local_batch; j++) {
			flow_sample_ref_t ref;
			uint64_t slot = first_slot + j;
			flow_loader_sample_at(loader, s, slot, &ref);
			const char *file = loader->manifest.shards[ref.shard].file;
			if (!json) {
				rc = fprintf(out,
					     "%" PRIu64 "\t%" PRIu32 "\t%" PRIu64
					     "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64
					     "\t%s\t%" PRIu64 "\n",
					     s, loader->dp_rank, slot,
					     ref.position, ref.epoch, ref.sample,
					     file, ref.offset);
				continue;
			}
			rc = fprintf(out,
				     "%s\n{\"step\": %" PRIu64
				     ", \"rank\": %" PRIu32
				     ", \"slot\": %" PRIu64
				     ", \"position\": %" PRIu64
				     ", \"epoch\": %" PRIu64
				     ", \"sample\": %" PRIu64 ", \"file\": ",
				     first_row ? "" : ",", s, loader->dp_rank,
				     slot, ref.position, ref.epoch, ref.sample);
			if (rc >= 0)
				rc = flow_json_write_string(out, file) ? 0 : -1;
			if (rc >= 0)
				rc = fprintf(out, ", \"offset\": %" PRIu64 "}",
					     ref.offset);
			first_row = false;
		}
	}
	if (rc >= 0 && json)
		rc = fputs(first_row ? "]\n" : "\n]\n", out) == EOF ? -1 : 0;
	if (rc < 0)
		return flow_diag_errno(diag, FLOW_ERR_IO, errno ? errno : EIO,
				       "cannot write the sample order");
	return FLOW_OK;
}
