/* Reference kernels (flow/kernels_ref.h): the textbook formula of each op,
 * one output element at a time, summed in double and rounded to float once.
 * Nothing here is shared with lib/kernels/cpu/: the point of this file is
 * to be a second, independent implementation that is easy to read. */
#include <math.h>

#include <flow/kernels_ref.h>
#include <flow/tensor.h>

#include "kernels/host_bf16_internal.h"

/* ---- matmul ---------------------------------------------------------------- */

void flow_ref_matmul_forward(float *out, const float *inp, const float *weight,
			     const float *bias, size_t n, size_t in_dim,
			     size_t out_dim)
{
	for (size_t r = 0; r < n; r++) {
		for (size_t o = 0; o < out_dim; o++) {
			double acc = bias ? (double)bias[o] : 0.0;
			for (size_t i = 0; i < in_dim; i++)
				acc += (double)inp[r * in_dim + i] *
				       (double)weight[o * in_dim + i];
			out[r * out_dim + o] = (float)acc;
		}
	}
}

void flow_ref_matmul_backward(float *dinp, float *dweight, float *dbias,
			      const float *dout, const float *inp,
			      const float *weight, size_t n, size_t in_dim,
			      size_t out_dim)
{
	if (dinp) {
		for (size_t r = 0; r < n; r++) {
			for (size_t i = 0; i < in_dim; i++) {
				double acc = 0.0;
				for (size_t o = 0; o < out_dim; o++)
					acc += (double)dout[r * out_dim + o] *
					       (double)weight[o * in_dim + i];
				dinp[r * in_dim + i] =
					(float)((double)dinp[r * in_dim + i] +
						acc);
			}
		}
	}
	if (dweight) {
		for (size_t o = 0; o < out_dim; o++) {
			for (size_t i = 0; i < in_dim; i++) {
				double acc = 0.0;
				for (size_t r = 0; r < n; r++)
					acc += (double)dout[r * out_dim + o] *
					       (double)inp[r * in_dim + i];
				dweight[o * in_dim + i] =
					(float)((double)dweight[o * in_dim + i] +
						acc);
			}
		}
	}
	if (dbias) {
		for (size_t o = 0; o < out_dim; o++) {
			double acc = 0.0;
			for (size_t r = 0; r < n; r++)
				acc += (double)dout[r * out_dim + o];
			dbias[o] = (float)((double)dbias[o] + acc);
		}
	}
}

/* ---- embedding --------------------------------------------------------------- */

/* bf16 matmul: the reference matmul on operands rounded to bf16
 * (kernels/host_bf16.c), so its sums are exact but for one rounding. */
FLOW_HOST_BF16_MATMULS(flow_ref)

void flow_ref_embedding_forward(float *out, const int32_t *tokens,
				const float *wte, const float *wpe,
				int64_t row0, size_t rows, size_t B, size_t T,
				size_t C)
{
	for (size_t b = 0; b < B; b++) {
		for (size_t t = 0; t < T; t++) {
			int64_t v = flow_embedding_row(tokens[b * T + t], row0,
						       rows);
			for (size_t c = 0; c < C; c++)
				out[(b * T + t) * C + c] = (float)(
					(v >= 0 ? (double)wte[(size_t)v * C + c] :
						  0.0) +
					(double)wpe[t * C + c]);
		}
	}
}

void flow_ref_embedding_backward(float *dwte, float *dwpe, const float *dout,
				 const int32_t *tokens, int64_t row0,
				 size_t rows, size_t B, size_t T, size_t C)
{
	size_t npos = B * T;

	if (dwte) {
		/* Each distinct token is handled at its first position, where
		 * all positions holding it are summed in double, so a row of
		 * dwte receives exactly one rounding however often its token
		 * occurs. */
		for (size_t p = 0; p < npos; p++) {
			bool seen = false;
			for (size_t q = 0; q < p && !seen; q++)
				seen = tokens[q] == tokens[p];
			int64_t row = flow_embedding_row(tokens[p], row0, rows);
			if (seen || row < 0)
				continue;
			size_t v = (size_t)row;
			for (size_t c = 0; c < C; c++) {
				double acc = 0.0;
				for (size_t q = p; q < npos; q++)
					if (tokens[q] == tokens[p])
						acc += (double)dout[q * C + c];
				dwte[v * C + c] =
					(float)((double)dwte[v * C + c] + acc);
			}
		}
	}
	if (dwpe) {
		for (size_t t = 0; t < T; t++) {
			for (size_t c = 0; c < C; c++) {
				double acc = 0.0;
				for (size_t b = 0; b < B; b++)
					acc += (double)dout[(b * T + t) * C + c];
				dwpe[t * C + c] =
					(float)((double)dwpe[t * C + c] + acc);
			}
		}
	}
}

/* ---- layernorm ------------------------------------------------------------------ */

void flow_ref_layernorm_forward(float *out, float *mean, float *rstd,
				const float *inp, const float *weight,
				const float *bias, size_t n, size_t C)
{
	for (size_t r = 0; r < n; r++) {
		const float *x = inp + r * C;
		double mu = 0.0, var = 0.0;
		for (size_t c = 0; c < C; c++)
			mu += (double)x[c];
		mu /= (double)C;
		for (size_t c = 0; c < C; c++)
			var += ((double)x[c] - mu) * ((double)x[c] - mu);
		var /= (double)C;
		double rs = 1.0 / sqrt(var + (double)FLOW_LAYERNORM_EPS);
		for (size_t c = 0; c < C; c++)
			out[r * C + c] = (float)(((double)x[c] - mu) * rs *
							 (double)weight[c] +
						 (double)bias[c]);
		mean[r] = (float)mu;
		rstd[r] = (float)rs;
	}
}

void flow_ref_layernorm_backward(float *dinp, float *dweight, float *dbias,
				 const float *dout, const float *inp,
				 const float *weight, const float *mean,
				 const float *rstd, size_t n, size_t C)
{
	if (dinp) {
		for (size_t r = 0; r < n; r++) {
			double mu = mean[r], rs = rstd[r];
			double mean_g = 0.0, mean_gx = 0.0;
			for (size_t c = 0; c < C; c++) {
				double xhat = ((double)inp[r * C + c] - mu) * rs;
				double g = (double)dout[r * C + c] *
					   (double)weight[c];
				mean_g += g;
				mean_gx += g * xhat;
			}
			mean_g /= (double)C;
			mean_gx /= (double)C;
			for (size_t c = 0; c < C; c++) {
				double xhat = ((double)inp[r * C + c] - mu) * rs;
				double g = (double)dout[r * C + c] *
					   (double)weight[c];
				double d = rs * (g - mean_g - xhat * mean_gx);
				dinp[r * C + c] =
					(float)((double)dinp[r * C + c] + d);
			}
		}
	}
	for (size_t c = 0; c < C && (dweight || dbias); c++) {
		double dw = 0.0, db = 0.0;
		for (size_t r = 0; r < n; r++) {
			double xhat = ((double)inp[r * C + c] - (double)mean[r]) *
				      (double)rstd[r];
			dw += (double)dout[r * C + c] * xhat;
			db += (double)dout[r * C + c];
		}
		if (dweight)
			dweight[c] = (float)((double)dweight[c] + dw);
		if (dbias)
			dbias[c] = (float)((double)dbias[c] + db);
	}
}

/* ---- GELU (tanh approximation) ---------------------------------------------------- */

#define REF_GELU_K 0.7978845608028654 /* sqrt(2/pi) */
#define REF_GELU_A 0.044715

void flow_ref_gelu_forward(float *out, const float *inp, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		double x = inp[i];
		double u = REF_GELU_K * (x + REF_GELU_A * x * x * x);
		out[i] = (float)(0.5 * x * (1.0 + tanh(u)));
	}
}

void flow_ref_gelu_backward(float *dinp, const float *inp, const float *dout,
			    size_t n)
{
	for (size_t i = 0; i < n; i++) {
		double x = inp[i];
		double u = REF_GELU_K * (x + REF_GELU_A * x * x * x);
		double th = tanh(u);
		double du = REF_GELU_K * (1.0 + 3.0 * REF_GELU_A * x * x);
		double grad = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
		dinp[i] = (float)((double)dinp[i] + grad * (double)dout[i]);
	}
}

/* ---- causal self-attention -------------------------------------------------------- */

/* Element d of the q (part 0), k (1) or v (2) vector of head h at (b, t). */
static double qkv_at(const float *qkv, size_t b, size_t t, size_t part,
		     size_t h, size_t d, size_t T, size_t C, size_t hs)
{
	return (double)qkv[(b * T + t) * 3 * C + part * C + h * hs + d];
}

/* scale q(t) . k(s) of head h in batch row b. */
static double attention_score(const float *qkv, size_t b, size_t h, size_t t,
			      size_t s, size_t T, size_t C, size_t hs)
{
	double sc = 0.0;

	for (size_t d = 0; d < hs; d++)
		sc += qkv_at(qkv, b, t, 0, h, d, T, C, hs) *
		      qkv_at(qkv, b, s, 1, h, d, T, C, hs);
	return sc / sqrt((double)hs);
}

/* One head's probabilities from lse, as the contract defines them:
 * p[t*T + s] = exp(score - lse[t]) for s <= t.  The scores are recomputed,
 * in double, where they are needed rather than kept. */
static void attention_probs(double *p, const float *qkv, const float *lse,
			    size_t b, size_t h, size_t T, size_t C, size_t hs)
{
	for (size_t t = 0; t < T; t++)
		for (size_t s = 0; s <= t; s++)
			p[t * T + s] = exp(attention_score(qkv, b, h, t, s, T,
							   C, hs) -
					   (double)lse[t]);
}

/* A probability or a score gradient as a product sees it: in bf16, rounded
 * to bf16 from float. */
static double attention_operand(double x, bool bf16)
{
	return bf16 ? (double)flow_round_bf16((float)x) : x;
}

void flow_ref_attention_forward(float *out, float *lse, void *scratch,
				bool bf16, const float *qkv_in, size_t B,
				size_t T, size_t C, size_t NH)
{
	size_t hs = C / NH;
	double *p = scratch; /* p[t*T + s], s <= t, of one head */
	const float *qkv = flow_host_bf16_operand(qkv_in, B * T * 3 * C, bf16,
						  (float *)(p + 2 * T * T));

	for (size_t b = 0; b < B; b++) {
		for (size_t h = 0; h < NH; h++) {
			float *l = lse + (b * NH + h) * T;
			for (size_t t = 0; t < T; t++) {
				double mx = -INFINITY, sum = 0.0, sc;
				for (size_t s = 0; s <= t; s++) {
					sc = attention_score(qkv, b, h, t, s, T,
							     C, hs);
					mx = fmax(mx, sc);
				}
				for (size_t s = 0; s <= t; s++) {
					sc = attention_score(qkv, b, h, t, s, T,
							     C, hs);
					sum += exp(sc - mx);
				}
				l[t] = (float)(mx + log(sum));
			}
			/* out weighs v with the probabilities of the rounded
			 * lse, the ones the backward pass sees. */
			attention_probs(p, qkv, l, b, h, T, C, hs);
			for (size_t t = 0; t < T; t++)
				for (size_t d = 0; d < hs; d++) {
					double acc = 0.0;
					for (size_t s = 0; s <= t; s++)
						acc += attention_operand(p[t * T + s], bf16) *
						       qkv_at(qkv, b, s, 2, h, d, T, C, hs);
					out[(b * T + t) * C + h * hs + d] = (float)acc;
				}
		}
	}
}

size_t flow_ref_attention_scratch_bound(size_t B, size_t T, size_t C,
					size_t NH, bool bf16)
{
	(void)NH;
	/* Two T x T matrices of doubles, then for bf16 the rounded qkv and
	 * dout. */
	return 2 * T * T * sizeof(double) +
	       (bf16 ? 4 * B * T * C * sizeof(float) : 0);
}

void flow_ref_attention_backward(float *dqkv, void *scratch, bool bf16,
				 const float *dout_in, const float *qkv_in,
				 const float *lse, const float *out, size_t B,
				 size_t T, size_t C, size_t NH)
{
	size_t hs = C / NH;
	double scale = 1.0 / sqrt((double)hs);
	double *a = scratch;	      /* probabilities of one head */
	double *dpre = a + T * T; /* dpre[t*T + s], s <= t, of one head */
	float *room = (float *)(dpre + T * T);
	const float *qkv =
		flow_host_bf16_operand(qkv_in, B * T * 3 * C, bf16, room);
	const float *dout = flow_host_bf16_operand(
		dout_in, B * T * C, bf16, bf16 ? room + B * T * 3 * C : NULL);

	(void)out; /* the definition: rowsum(P dP) from the probabilities */
	for (size_t b = 0; b < B; b++) {
		for (size_t h = 0; h < NH; h++) {
			attention_probs(a, qkv, lse + (b * NH + h) * T, b, h, T,
					C, hs);
			for (size_t t = 0; t < T; t++) {
				double dot = 0.0;
				for (size_t s = 0; s <= t; s++) {
					double datt = 0.0;
					for (size_t d = 0; d < hs; d++)
						datt += (double)dout[(b * T + t) * C + h * hs + d] *
							qkv_at(qkv, b, s, 2, h, d, T, C, hs);
					dpre[t * T + s] = datt;
					dot += a[t * T + s] * datt;
				}
				for (size_t s = 0; s <= t; s++)
					dpre[t * T + s] = attention_operand(
						scale * a[t * T + s] *
							(dpre[t * T + s] - dot),
						bf16);
			}
			for (size_t t = 0; t < T; t++) {
				for (size_t d = 0; d < hs; d++) {
					double dq = 0.0, dk = 0.0, dv = 0.0;
					/* dq of position t: its row of dpre. */
					for (size_t s = 0; s <= t; s++)
						dq += dpre[t * T + s] *
						      qkv_at(qkv, b, s, 1, h, d, T, C, hs);
					/* dk, dv of position t (as a key):
					 * its column, rows u >= t. */
					for (size_t u = t; u < T; u++) {
						dk += dpre[u * T + t] *
						      qkv_at(qkv, b, u, 0, h, d, T, C, hs);
						dv += attention_operand(a[u * T + t], bf16) *
						      (double)dout[(b * T + u) * C + h * hs + d];
					}
					float *g = dqkv + (b * T + t) * 3 * C + h * hs + d;
					g[0] = (float)((double)g[0] + dq);
					g[C] = (float)((double)g[C] + dk);
					g[2 * C] = (float)((double)g[2 * C] + dv);
				}
			}
		}
	}
}

/* ---- residual ------------------------------------------------------------------------ */

void flow_ref_residual_forward(float *out, const float *a, const float *b,
			       size_t n)
{
	for (size_t i = 0; i < n; i++)
		out[i] = (float)((double)a[i] + (double)b[i]);
}

void flow_ref_residual_backward(float *da, float *db, const float *dout,
				size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (da)
			da[i] = (float)((double)da[i] + (double)dout[i]);
		if (db)
			db[i] = (float)((double)db[i] + (double)dout[i]);
	}
}

/* The residual add and then the layernorm of its output, and their
 * backward, as two kernels each: the reference needs no fused pass. */
void flow_ref_residual_layernorm_forward(float *res, float *out, float *mean,
					 float *rstd, const float *a,
					 const float *b, const float *weight,
					 const float *bias, size_t n, size_t C)
{
	flow_ref_residual_forward(res, a, b, n * C);
	flow_ref_layernorm_forward(out, mean, rstd, res, weight, bias, n, C);
}

void flow_ref_layernorm_residual_backward(float *dres, float *da, float *db,
					  float *dweight, float *dbias,
					  const float *dout, const float *res,
					  const float *weight,
					  const float *mean, const float *rstd,
					  size_t n, size_t C)
{
	flow_ref_layernorm_backward(dres, dweight, dbias, dout, res, weight,
				    mean, rstd, n, C);
	flow_ref_residual_backward(da, db, dres, n * C);
}

/* ---- softmax cross-entropy ---------------------------------------------------------- */

void flow_ref_cross_entropy_forward_backward(float *losses, float *logits,
					     const int32_t *targets, size_t n,
					     size_t V, size_t Vp, float dloss)
{
	for (size_t r = 0; r < n; r++) {
		float *row = logits + r * Vp;
		if (targets[r] < 0) {
			losses[r] = 0.0f;
			for (size_t j = 0; j < Vp; j++)
				row[j] = 0.0f;
			continue;
		}
		size_t tgt = (size_t)targets[r];
		double mx = -INFINITY, sum = 0.0;
		for (size_t j = 0; j < V; j++)
			mx = fmax(mx, (double)row[j]);
		for (size_t j = 0; j < V; j++)
			sum += exp((double)row[j] - mx);
		losses[r] = (float)(mx + log(sum) - (double)row[tgt]);
		for (size_t j = 0; j < V; j++) {
			double p = exp((double)row[j] - mx) / sum;
			row[j] = (float)((double)dloss *
					 (p - (j == tgt ? 1.0 : 0.0)));
		}
		for (size_t j = V; j < Vp; j++)
			row[j] = 0.0f;
	}
}

/* ---- AdamW ---------------------------------------------------------------------------- */

void flow_ref_adamw_update(float *param, const float *grad, float *m,
			   float *v, size_t n, const flow_adamw_params_t *hp,
			   uint64_t t, bool decay)
{
	double lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps;
	double bc1 = 1.0 - pow(b1, (double)t);
	double bc2 = 1.0 - pow(b2, (double)t);

	for (size_t i = 0; i < n; i++) {
		double p = param[i], g = grad[i];
		if (decay)
			p *= 1.0 - lr * (double)hp->weight_decay;
		double mi = b1 * (double)m[i] + (1.0 - b1) * g;
		double vi = b2 * (double)v[i] + (1.0 - b2) * g * g;
		p -= lr / bc1 * mi / (sqrt(vi) / sqrt(bc2) + eps);
		m[i] = (float)mi;
		v[i] = (float)vi;
		param[i] = (float)p;
	}
}

/* ---- gradient-norm clipping --------------------------------------------------------- */

double flow_ref_sum_squares(const float *x, size_t n)
{
	double acc = 0.0;
	for (size_t i = 0; i < n; i++)
		acc += (double)x[i] * (double)x[i];
	return acc;
}

void flow_ref_scale(float *x, size_t n, float s)
{
	for (size_t i = 0; i < n; i++)
		x[i] = (float)((double)x[i] * (double)s);
}

float flow_ref_clip_grad_norm(float *const *grads, const size_t *counts,
			      size_t ntensors, float max_norm)
{
	double sumsq = 0.0;
	for (size_t k = 0; k < ntensors; k++)
		sumsq += flow_ref_sum_squares(grads[k], counts[k]);
	double norm = sqrt(sumsq);
	if (max_norm > 0.0f && norm > (double)max_norm) {
		double s = (double)max_norm / (norm + 1e-6);
		for (size_t k = 0; k < ntensors; k++)
			for (size_t i = 0; i < counts[k]; i++)
				grads[k][i] = (float)((double)grads[k][i] * s);
	}
	return (float)norm;
}
