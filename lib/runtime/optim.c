/* AdamW over a graph's parameters, gradient clipping and the learning-rate
 * schedule (flow/optim.h). */
#include <config.h>

#include <math.h>
#include <stdlib.h>

#include <flow/mem.h>
#include <flow/optim.h>

struct flow_adamw {
	flow_exec_t *exec;
	flow_adamw_params_t hp;
	size_t nparams;
	int *params;       /* graph tensor indices */
	float **m, **v;    /* per parameter, numel floats each */
	float **grads;     /* per parameter: its gradient (shard) in exec */
	size_t *begins;    /* per parameter: first element updated */
	size_t *counts;    /* per parameter: elements updated */
	float **updated;   /* per parameter: its first element updated */
	bool *decays;      /* per parameter: weight decay applies */
};

float flow_lr_at(const flow_lr_schedule_t *s, uint64_t step)
{
	if (s->warmup > 0 && step <= s->warmup)
		return (float)(s->lr * (double)step / (double)s->warmup);
	if (s->total <= s->warmup)
		return (float)s->lr;
	double r = (double)(step - s->warmup) / (double)(s->total - s->warmup);
	if (r > 1.0)
		r = 1.0;
	return (float)(s->min_lr +
		       (s->lr - s->min_lr) * (1.0 + cos(M_PI * r)) / 2.0);
}

void flow_adamw_free(flow_adamw_t *opt)
{
	if (!opt)
		return;
	const flow_exec_storage_t *st = flow_exec_storage(opt->exec);
	for (size_t i = 0; i < opt->nparams; i++) {
		if (opt->m)
			st->free(opt->m[i]);
		if (opt->v)
			st->free(opt->v[i]);
	}
	free(opt->m);
	free(opt->v);
	free(opt->grads);
	free(opt->begins);
	free(opt->counts);
	free(opt->updated);
	free(opt->decays);
	free(opt->params);
	free(opt);
}

flow_err_t flow_adamw_new(flow_exec_t *exec, const flow_adamw_params_t *hp,
			  flow_adamw_t **opt_out, flow_diag_t *diag)
{
	return flow_adamw_new_sharded(exec, hp, NULL, NULL, opt_out, diag);
}

flow_err_t flow_adamw_new_sharded(flow_exec_t *exec,
				  const flow_adamw_params_t *hp,
				  const size_t *begin, const size_t *count,
				  flow_adamw_t **opt_out, flow_diag_t *diag)
{
	const flow_graph_t *g = flow_exec_graph(exec);
	const flow_exec_storage_t *st = flow_exec_storage(exec);
	flow_adamw_t *opt = calloc(1, sizeof *opt);
	if (!opt)
		goto out_nomem;
	opt->exec = exec;
	opt->hp = *hp;
	for (size_t t = 0; t < g->ntensors; t++)
		opt->nparams += g->tensors[t].role == FLOW_ROLE_PARAM;
	size_t n = opt->nparams ? opt->nparams : 1;
	opt->params = calloc(n, sizeof *opt->params);
	opt->m = calloc(n, sizeof *opt->m);
	opt->v = calloc(n, sizeof *opt->v);
	opt->grads = calloc(n, sizeof *opt->grads);
	opt->begins = calloc(n, sizeof *opt->begins);
	opt->counts = calloc(n, sizeof *opt->counts);
	opt->updated = calloc(n, sizeof *opt->updated);
	opt->decays = calloc(n, sizeof *opt->decays);
	if (!opt->params || !opt->m || !opt->v || !opt->grads ||
	    !opt->begins || !opt->counts || !opt->updated || !opt->decays)
		goto out_free;
	size_t i = 0;
	for (size_t t = 0; t < g->ntensors; t++) {
		const flow_graph_tensor_t *p = &g->tensors[t];
		if (p->role != FLOW_ROLE_PARAM)
			continue;
		size_t numel = count ? count[i]
				     : flow_graph_tensor_numel(g, (int)t);
		opt->params[i] = (int)t;
		opt->begins[i] = begin ? begin[i] : 0;
		opt->counts[i] = numel;
		opt->grads[i] = p->grad >= 0 ? flow_exec_tensor(exec, p->grad)
					     : NULL;
		/* The moments live where the parameters do, zeroed. */
		opt->m[i] = st->alloc(numel * sizeof(float));
		opt->v[i] = st->alloc(numel * sizeof(float));
		if (!opt->m[i] || !opt->v[i] || !opt->grads[i])
			goto out_free;
		opt->grads[i] += opt->begins[i];
		opt->updated[i] = (float *)flow_exec_tensor(exec, (int)t) +
				  opt->begins[i];
		opt->decays[i] = p->decay;
		i++;
	}
	*opt_out = opt;
	return FLOW_OK;
out_free:
	flow_adamw_free(opt);
out_nomem:
	return flow_diag_set(diag, FLOW_ERR_NOMEM,
			     "out of memory for the optimizer state (or a "
			     "parameter without a gradient: graph not "
			     "differentiated)");
}

void flow_adamw_step(flow_adamw_t *opt, uint64_t t, float lr)
{
	const flow_kernels_t *k = flow_exec_kernels(opt->exec);
	flow_adamw_params_t hp = opt->hp;
	hp.lr = lr;
	if (k->adamw_update_all) { /* one launch for all */
		k->adamw_update_all(opt->updated, (const float *const *)opt->grads,
				    opt->m, opt->v, opt->counts, opt->decays,
				    opt->nparams, &hp, t);
		return;
	}
	for (size_t i = 0; i < opt->nparams; i++)
		k->adamw_update(opt->updated[i], opt->grads[i], opt->m[i],
				opt->v[i], opt->counts[i], &hp, t,
				opt->decays[i]);
}

static ptrdiff_t adamw_slot(const flow_adamw_t *opt, int param)
{
	for (size_t i = 0; i < opt->nparams; i++)
		if (opt->params[i] == param)
			return (ptrdiff_t)i;
	return -1;
}

float *flow_adamw_m(flow_adamw_t *opt, int param)
{
	ptrdiff_t i = adamw_slot(opt, param);
	return i < 0 ? NULL : opt->m[i];
}

float *flow_adamw_v(flow_adamw_t *opt, int param)
{
	ptrdiff_t i = adamw_slot(opt, param);
	return i < 0 ? NULL : opt->v[i];
}

float flow_adamw_clip_grad_norm(flow_adamw_t *opt, float max_norm)
{
	return flow_exec_kernels(opt->exec)->clip_grad_norm(
		opt->grads, opt->counts, opt->nparams, max_norm);
}

void flow_adamw_clip_to_norm(flow_adamw_t *opt, float norm, float max_norm)
{
	const flow_kernels_t *k = flow_exec_kernels(opt->exec);
	float coef = flow_clip_coef(norm, max_norm);
	if (coef < 1.0f)
		for (size_t i = 0; i < opt->nparams; i++)
			k->scale(opt->grads[i], opt->counts[i], coef);
}

size_t flow_adamw_params(const flow_adamw_t *opt, const int **params_out)
{
	*params_out = opt->params;
	return opt->nparams;
}
