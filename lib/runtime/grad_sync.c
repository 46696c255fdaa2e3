/* Overlapped data-parallel gradient sums (flow/grad_sync.h): the
 * executor's op hook releases buckets in order as their launch ops run (on
 * a device, after recording an event behind the kernels enqueued so far);
 * a communication thread all-reduces the released ones, each bucket's
 * gradients as one grouped collective (flow_all_reduce_group: one NCCL
 * launch; on a device once the bucket's event has happened), while the
 * executor goes on.  Two counters under one lock say
 * where each side is: released (buckets the pass has completed) and done
 * (buckets summed); the thread sleeps while they are equal. */
#include <config.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <flow/device.h>
#include <flow/grad_sync.h>

struct flow_grad_sync {
	flow_exec_t *exec;
	const flow_exec_storage_t *storage;
	flow_comm_t *comm;
	void **events;          /* [nbuckets] on a device: each bucket's
				 * gradients are written once its event is */
	flow_grad_buckets_t *buckets;
	int *launched_after;    /* [nbuckets]: the op that released each */
	void **bufs;            /* [largest bucket's count]: the thread's */
	size_t *counts;         /* arguments to flow_all_reduce_group */
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t work;    /* released grew, or stop */
	pthread_cond_t idle;    /* done grew */
	size_t released, done;  /* of the armed pass, under lock */
	bool armed, stop;
	flow_err_t err;         /* the first failure of the pass */
	flow_diag_t diag;
};

/* Sum bucket b's gradients over the group, as one collective. */
static flow_err_t sum_bucket(flow_grad_sync_t *s, size_t b, flow_diag_t *diag)
{
	const flow_grad_buckets_t *g = s->buckets;
	const flow_grad_bucket_t *k = &g->buckets[b];
	for (size_t i = 0; i < k->count; i++) {
		const flow_grad_bucket_member_t *mb = &g->members[k->first + i];
		s->bufs[i] = flow_exec_tensor(s->exec, mb->grad);
		s->counts[i] = mb->bytes / sizeof(float);
	}
	return flow_all_reduce_group(s->comm, s->bufs, s->counts, k->count,
				     FLOW_DTYPE_F32, diag);
}

static void *sync_thread(void *arg)
{
	flow_grad_sync_t *s = arg;
	if (s->events) {
		/* NCCL calls run on the communicator's device; a failure to
		 * select it is the first collective's to report. */
		flow_diag_t ignored = FLOW_DIAG_INIT;
		flow_err_t selected = flow_cuda_select(flow_comm_device(s->comm),
						       &ignored);
		(void)selected;
	}
	pthread_mutex_lock(&s->lock);
	for (;;) {
		while (!s->stop && s->done == s->released)
			pthread_cond_wait(&s->work, &s->lock);
		if (s->done == s->released) /* and stop */
			break;
		size_t b = s->done;
		bool skip = s->err != FLOW_OK;
		pthread_mutex_unlock(&s->lock);
		flow_diag_t diag = FLOW_DIAG_INIT;
		if (s->events && !skip) /* the backward pass has written it */
			s->storage->event_wait(s->events[b]);
		flow_err_t err = skip ? FLOW_OK : sum_bucket(s, b, &diag);
		pthread_mutex_lock(&s->lock);
		if (err != FLOW_OK && s->err == FLOW_OK) {
			s->err = err;
			s->diag = diag;
		}
		s->done++;
		pthread_cond_broadcast(&s->idle);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* Give back the events made so far; s->events becomes NULL. */
static void free_events(flow_grad_sync_t *s)
{
	for (size_t b = 0; s->events && b < s->buckets->nbuckets; b++)
		if (s->events[b])
			s->storage->event_free(s->events[b]);
	free(s->events);
	s->events = NULL;
}

/* Free s and what it holds (not its thread nor its lock). */
static void free_state(flow_grad_sync_t *s)
{
	free_events(s);
	free(s->counts);
	free(s->bufs);
	free(s->launched_after);
	flow_grad_buckets_free(s->buckets);
	free(s);
}

/* Release the buckets whose launch op is op: on a device, after an event
 * that marks the work enqueued so far, which the thread waits for. */
static void release_after(flow_grad_sync_t *s, int op)
{
	size_t first, count;
	flow_grad_buckets_after_op(s->buckets, op, &first, &count);
	if (count == 0)
		return;
	for (size_t b = first; s->events && b < first + count; b++)
		s->storage->event_record(s->events[b]);
	pthread_mutex_lock(&s->lock);
	for (size_t b = first; b < first + count; b++)
		s->launched_after[b] = op;
	s->released = first + count;
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->lock);
}

static void op_hook(void *ctx, int op)
{
	flow_grad_sync_t *s = ctx;
	if (s->armed)
		release_after(s, op);
}

flow_err_t flow_grad_sync_new(flow_exec_t *exec, flow_comm_t *comm,
			      size_t capacity, flow_grad_sync_t **sync_out,
			      flow_diag_t *diag)
{
	const flow_exec_storage_t *st = flow_exec_storage(exec);
	bool host = st->host_addressable &&
		    flow_comm_backend(comm) == FLOW_COMM_CPU;
	bool device = !st->host_addressable && st->event_new &&
		      flow_comm_backend(comm) == FLOW_COMM_NCCL;
	if (!host && !device)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "overlapped gradient sums need host "
				     "memory and a CPU communicator, or a "
				     "device's memory and NCCL");
	flow_grad_sync_t *s = calloc(1, sizeof *s);
	if (!s)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	s->exec = exec;
	s->storage = st;
	s->comm = comm;
	flow_err_t err = flow_grad_buckets_new(flow_exec_graph(exec), capacity,
					       NULL, &s->buckets, diag);
	if (err != FLOW_OK) {
		free(s);
		return err;
	}
	size_t n = s->buckets->nbuckets ? s->buckets->nbuckets : 1, most = 1;
	for (size_t b = 0; b < s->buckets->nbuckets; b++)
		if (s->buckets->buckets[b].count > most)
			most = s->buckets->buckets[b].count;
	s->launched_after = calloc(n, sizeof *s->launched_after);
	s->bufs = calloc(most, sizeof *s->bufs);
	s->counts = calloc(most, sizeof *s->counts);
	if (device && (s->events = calloc(n, sizeof *s->events)))
		for (size_t b = 0; b < s->buckets->nbuckets && s->events; b++)
			if (!(s->events[b] = st->event_new()))
				free_events(s);
	if (!s->launched_after || !s->bufs || !s->counts ||
	    (device && !s->events)) {
		free_state(s);
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory for the gradient buckets' "
				     "bookkeeping");
	}
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->idle, NULL);
	int rc = pthread_create(&s->thread, NULL, sync_thread, s);
	if (rc != 0) {
		pthread_cond_destroy(&s->idle);
		pthread_cond_destroy(&s->work);
		pthread_mutex_destroy(&s->lock);
		free_state(s);
		return flow_diag_errno(diag, FLOW_ERR_IO, rc,
				       "cannot start the gradient-sum thread");
	}
	flow_exec_set_op_hook(exec, op_hook, s);
	*sync_out = s;
	return FLOW_OK;
}

void flow_grad_sync_free(flow_grad_sync_t *s)
{
	if (!s)
		return;
	flow_exec_set_op_hook(s->exec, NULL, NULL);
	pthread_mutex_lock(&s->lock);
	s->stop = true;
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->lock);
	pthread_join(s->thread, NULL);
	pthread_cond_destroy(&s->idle);
	pthread_cond_destroy(&s->work);
	pthread_mutex_destroy(&s->lock);
	free_state(s);
}

void flow_grad_sync_arm(flow_grad_sync_t *s)
{
	pthread_mutex_lock(&s->lock);
	s->released = s->done = 0;
	s->err = FLOW_OK;
	s->diag = (flow_diag_t)FLOW_DIAG_INIT;
	for (size_t b = 0; b < s->buckets->nbuckets; b++)
		s->launched_after[b] = 0;
	pthread_mutex_unlock(&s->lock);
	s->armed = true;
	release_after(s, -1); /* gradients no op writes */
}

flow_err_t flow_grad_sync_wait(flow_grad_sync_t *s, flow_diag_t *diag)
{
	s->armed = false;
	pthread_mutex_lock(&s->lock);
	while (s->done < s->released)
		pthread_cond_wait(&s->idle, &s->lock);
	flow_err_t err = s->err;
	if (err == FLOW_OK && s->released < s->buckets->nbuckets)
		err = flow_diag_set(&s->diag, FLOW_ERR_USAGE,
				    "the backward pass released %zu of %zu "
				    "gradient buckets",
				    s->released, s->buckets->nbuckets);
	if (err != FLOW_OK)
		flow_diag_set(diag, err, "%s", flow_diag_message(&s->diag));
	pthread_mutex_unlock(&s->lock);
	return err;
}

const flow_grad_buckets_t *flow_grad_sync_buckets(const flow_grad_sync_t *s)
{
	return s->buckets;
}

size_t flow_grad_sync_launched(const flow_grad_sync_t *s,
			       const int **launched_after_out)
{
	*launched_after_out = s->launched_after;
	return s->released;
}
