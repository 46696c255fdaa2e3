/* Reference kernels (flow/kernels_ref.h): the textbook formula of each op,
 * one output element at a time, summed in double and rounded once, to
 * float or, for a bf16 activation, to bf16.  Nothing here is shared with
 * lib/kernels/cpu/: the point of this file is to be a second, independent
 * implementation that is easy to read. */
#include <math.h>
#include <string.h>

#include <flow/kernels_ref.h>
#include <flow/tensor.h>

/* ---- bf16 ---------------------------------------------------------------------- */

/* Rounding x to float and then to bf16 would round twice: x just above a
 * midpoint of two bf16 values can round to that midpoint as a float, and
 * then to the even neighbour, below x.  So x is first rounded to float by
 * round-to-odd (toward zero, and an inexact result gets its last bit
 * set), then to bf16 by flow_bf16_narrow.  That is one rounding.  The
 * points where rounding to bf16 decides, the bf16 values and the
 * midpoints between them, are all even floats (a float has 16 bits more
 * than a bf16 in every binade, subnormals included).  An inexact x lies
 * strictly between two neighbouring floats and round-to-odd picks the odd
 * one, so no even float is it or lies between it and x: it rounds to bf16
 * as x does, and never ties.  The float nearest x, f, is one of the two:
 * when inexact and even, the odd one is a step from f toward x (from an
 * infinite f, the largest float, which rounds to infinity as x does). */
flow_bf16_t flow_ref_bf16_narrow(double x)
{
	float f = (float)x;
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if (!isnan(x) && (double)f != x && !(u & 1u))
		u = fabs((double)f) > fabs(x) ? u - 1 : u + 1;
	memcpy(&f, &u, sizeof(f));
	return flow_bf16_narrow(f);
}

/* A kernel and its bf16 twin share one loop, written over these: an
 * activation's pointer and whether it holds floats or bf16 (flow/kernels.h,
 * "bf16 activations"). */
static double act_load(const void *x, size_t i, bool bf16)
{
	return bf16 ? (double)flow_bf16_widen(((const flow_bf16_t *)x)[i]) :
		      (double)((const float *)x)[i];
}

/* Element i of x = v, rounded once. */
static void act_store(void *x, size_t i, double v, bool bf16)
{
	if (bf16)
		((flow_bf16_t *)x)[i] = flow_ref_bf16_narrow(v);
	else
		((float *)x)[i] = (float)v;
}

/* Element i of x += v: the stored value plus v in double, rounded once. */
static void act_add(void *x, size_t i, double v, bool bf16)
{
	act_store(x, i, act_load(x, i, bf16) + v, bf16);
}

/* ---- matmul ---------------------------------------------------------------- */

/* Element i of a weight or bias as the GEMM reads it: a bf16 GEMM rounds
 * it to bf16, here where it is read, so no rounded copy is kept (the
 * scratch bound is 0). */
static double weight_at(const float *weight, size_t i, bool bf16)
{
	return bf16 ? (double)flow_round_bf16(weight[i]) : (double)weight[i];
}

static void matmul_forward(void *out, const void *inp, const float *weight,
			   const float *bias, size_t n, size_t in_dim,
			   size_t out_dim, bool bf16)
{
	for (size_t r = 0; r < n; r++) {
		for (size_t o = 0; o < out_dim; o++) {
			double acc = bias ? weight_at(bias, o, bf16) : 0.0;
			for (size_t i = 0; i < in_dim; i++)
				acc += act_load(inp, r * in_dim + i, bf16) *
				       weight_at(weight, o * in_dim + i, bf16);
			act_store(out, r * out_dim + o, acc, bf16);
		}
	}
}

static void matmul_backward(void *dinp, float *dweight, float *dbias,
			    const void *dout, const void *inp,
			    const float *weight, size_t n, size_t in_dim,
			    size_t out_dim, bool bf16)
{
	if (dinp) {
		for (size_t r = 0; r < n; r++) {
			for (size_t i = 0; i < in_dim; i++) {
				double acc = 0.0;
				for (size_t o = 0; o < out_dim; o++)
					acc += act_load(dout, r * out_dim + o,
							bf16) *
					       weight_at(weight,
							 o * in_dim + i, bf16);
				act_add(dinp, r * in_dim + i, acc, bf16);
			}
		}
	}
	if (dweight) {
		for (size_t o = 0; o < out_dim; o++) {
			for (size_t i = 0; i < in_dim; i++) {
				double acc = 0.0;
				for (size_t r = 0; r < n; r++)
					acc += act_load(dout, r * out_dim + o,
							bf16) *
					       act_load(inp, r * in_dim + i,
							bf16);
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
				acc += act_load(dout, r * out_dim + o, bf16);
			dbias[o] = (float)((double)dbias[o] + acc);
		}
	}
}

void flow_ref_matmul_forward(float *out, const float *inp, const float *weight,
			     const float *bias, size_t n, size_t in_dim,
			     size_t out_dim)
{
	matmul_forward(out, inp, weight, bias, n, in_dim, out_dim, false);
}

void flow_ref_matmul_backward(float *dinp, float *dweight, float *dbias,
			      const float *dout, const float *inp,
			      const float *weight, size_t n, size_t in_dim,
			      size_t out_dim)
{
	matmul_backward(dinp, dweight, dbias, dout, inp, weight, n, in_dim,
			out_dim, false);
}

size_t flow_ref_matmul_bf16_scratch_bound(size_t n, size_t in_dim,
					  size_t out_dim)
{
	return 0; /* see weight_at */
}

void flow_ref_matmul_bf16_forward(flow_bf16_t *out, void *scratch,
				  const flow_bf16_t *inp, const float *weight,
				  const float *bias, size_t n, size_t in_dim,
				  size_t out_dim)
{
	matmul_forward(out, inp, weight, bias, n, in_dim, out_dim, true);
}

void flow_ref_matmul_bf16_backward(flow_bf16_t *dinp, float *dweight,
				   float *dbias, void *scratch,
				   const flow_bf16_t *dout,
				   const flow_bf16_t *inp, const float *weight,
				   size_t n, size_t in_dim, size_t out_dim)
{
	matmul_backward(dinp, dweight, dbias, dout, inp, weight, n, in_dim,
			out_dim, true);
}

/* ---- embedding --------------------------------------------------------------- */

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

/* out is fp32, or bf16 in the twin; the statistics and inp (the residual
 * stream) are fp32 in both. */
static void layernorm_forward(void *out, float *mean, float *rstd,
			      const float *inp, const float *weight,
			      const float *bias, size_t n, size_t C, bool bf16)
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
			act_store(out, r * C + c,
				  ((double)x[c] - mu) * rs * (double)weight[c] +
					  (double)bias[c],
				  bf16);
		mean[r] = (float)mu;
		rstd[r] = (float)rs;
	}
}

/* dout is fp32, or bf16 in the twin; every gradient is fp32 in both. */
static void layernorm_backward(float *dinp, float *dweight, float *dbias,
			       const void *dout, const float *inp,
			       const float *weight, const float *mean,
			       const float *rstd, size_t n, size_t C, bool bf16)
{
	if (dinp) {
		for (size_t r = 0; r < n; r++) {
			double mu = mean[r], rs = rstd[r];
			double mean_g = 0.0, mean_gx = 0.0;
			for (size_t c = 0; c < C; c++) {
				double xhat = ((double)inp[r * C + c] - mu) * rs;
				double g = act_load(dout, r * C + c, bf16) *
					   (double)weight[c];
				mean_g += g;
				mean_gx += g * xhat;
			}
			mean_g /= (double)C;
			mean_gx /= (double)C;
			for (size_t c = 0; c < C; c++) {
				double xhat = ((double)inp[r * C + c] - mu) * rs;
				double g = act_load(dout, r * C + c, bf16) *
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
			double d = act_load(dout, r * C + c, bf16);
			dw += d * xhat;
			db += d;
		}
		if (dweight)
			dweight[c] = (float)((double)dweight[c] + dw);
		if (dbias)
			dbias[c] = (float)((double)dbias[c] + db);
	}
}

void flow_ref_layernorm_forward(float *out, float *mean, float *rstd,
				const float *inp, const float *weight,
				const float *bias, size_t n, size_t C)
{
	layernorm_forward(out, mean, rstd, inp, weight, bias, n, C, false);
}

void flow_ref_layernorm_backward(float *dinp, float *dweight, float *dbias,
				 const float *dout, const float *inp,
				 const float *weight, const float *mean,
				 const float *rstd, size_t n, size_t C)
{
	layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd,
			   n, C, false);
}

void flow_ref_layernorm_bf16_forward(flow_bf16_t *out, float *mean,
				     float *rstd, const float *inp,
				     const float *weight, const float *bias,
				     size_t n, size_t C)
{
	layernorm_forward(out, mean, rstd, inp, weight, bias, n, C, true);
}

void flow_ref_layernorm_bf16_backward(float *dinp, float *dweight,
				      float *dbias, const flow_bf16_t *dout,
				      const float *inp, const float *weight,
				      const float *mean, const float *rstd,
				      size_t n, size_t C)
{
	layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd,
			   n, C, true);
}

/* ---- GELU (tanh approximation) ---------------------------------------------------- */

#define REF_GELU_K 0.7978845608028654 /* sqrt(2/pi) */
#define REF_GELU_A 0.044715

static void gelu_forward(void *out, const void *inp, size_t n, bool bf16)
{
	for (size_t i = 0; i < n; i++) {
		double x = act_load(inp, i, bf16);
		double u = REF_GELU_K * (x + REF_GELU_A * x * x * x);
		act_store(out, i, 0.5 * x * (1.0 + tanh(u)), bf16);
	}
}

static void gelu_backward(void *dinp, const void *inp, const void *dout,
			  size_t n, bool bf16)
{
	for (size_t i = 0; i < n; i++) {
		double x = act_load(inp, i, bf16);
		double u = REF_GELU_K * (x + REF_GELU_A * x * x * x);
		double th = tanh(u);
		double du = REF_GELU_K * (1.0 + 3.0 * REF_GELU_A * x * x);
		double grad = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
		act_add(dinp, i, grad * act_load(dout, i, bf16), bf16);
	}
}

void flow_ref_gelu_forward(float *out, const float *inp, size_t n)
{
	gelu_forward(out, inp, n, false);
}

void flow_ref_gelu_backward(float *dinp, const float *inp, const float *dout,
			    size_t n)
{
	gelu_backward(dinp, inp, dout, n, false);
}

void flow_ref_gelu_bf16_forward(flow_bf16_t *out, const flow_bf16_t *inp,
				size_t n)
{
	gelu_forward(out, inp, n, true);
}

void flow_ref_gelu_bf16_backward(flow_bf16_t *dinp, const flow_bf16_t *inp,
				 const flow_bf16_t *dout, size_t n)
{
	gelu_backward(dinp, inp, dout, n, true);
}

/* The matmul, then the GELU of its stored output: the reference needs no
 * fused pass. */
void flow_ref_matmul_gelu_forward(float *pre, float *out, const float *inp,
				  const float *weight, const float *bias,
				  size_t n, size_t in_dim, size_t out_dim)
{
	flow_ref_matmul_forward(pre, inp, weight, bias, n, in_dim, out_dim);
	flow_ref_gelu_forward(out, pre, n * out_dim);
}

void flow_ref_matmul_gelu_bf16_forward(flow_bf16_t *pre, flow_bf16_t *out,
				       void *scratch, const flow_bf16_t *inp,
				       const float *weight, const float *bias,
				       size_t n, size_t in_dim, size_t out_dim)
{
	flow_ref_matmul_bf16_forward(pre, scratch, inp, weight, bias, n,
				     in_dim, out_dim);
	flow_ref_gelu_bf16_forward(out, pre, n * out_dim);
}

/* ---- causal self-attention -------------------------------------------------------- */

/* Head h of batch row b of qkv, which is fp32 or, in the twins, bf16. */
typedef struct {
	const void *qkv;
	bool bf16;
	size_t b, h, T, C, hs;
} head_t;

/* The index of element d of the q (part 0), k (1) or v (2) vector of the
 * head at t, in qkv or dqkv. */
static size_t qkv_index(const head_t *hd, size_t t, size_t part, size_t d)
{
	return (hd->b * hd->T + t) * 3 * hd->C + part * hd->C +
	       hd->h * hd->hs + d;
}

static double qkv_at(const head_t *hd, size_t t, size_t part, size_t d)
{
	return act_load(hd->qkv, qkv_index(hd, t, part, d), hd->bf16);
}

/* The index of element d of the head at t in out or dout, (B,T,C). */
static size_t out_index(const head_t *hd, size_t t, size_t d)
{
	return (hd->b * hd->T + t) * hd->C + hd->h * hd->hs + d;
}

/* scale q(t) . k(s) of the head. */
static double attention_score(const head_t *hd, size_t t, size_t s)
{
	double sc = 0.0;

	for (size_t d = 0; d < hd->hs; d++)
		sc += qkv_at(hd, t, 0, d) * qkv_at(hd, s, 1, d);
	return sc / sqrt((double)hd->hs);
}

/* The head's probabilities from its lse, as the contract defines them:
 * p[t*T + s] = exp(score - lse[t]) for s <= t.  The scores are
 * recomputed, in double, where they are needed rather than kept. */
static void attention_probs(double *p, const head_t *hd, const float *lse)
{
	for (size_t t = 0; t < hd->T; t++)
		for (size_t s = 0; s <= t; s++)
			p[t * hd->T + s] = exp(attention_score(hd, t, s) -
					       (double)lse[t]);
}

/* A probability or a score gradient as a product reads it: rounded to
 * bf16 in the twins (flow/kernels.h, their attention). */
static double attention_operand(double x, bool bf16)
{
	return bf16 ? (double)flow_bf16_widen(flow_ref_bf16_narrow(x)) : x;
}

/* One head's lse (T of them) and out, p room for its probabilities. */
static void attention_head_forward(void *out, float *lse, double *p,
				   const head_t *hd)
{
	size_t T = hd->T;

	for (size_t t = 0; t < T; t++) {
		double mx = -INFINITY, sum = 0.0;
		for (size_t s = 0; s <= t; s++)
			mx = fmax(mx, attention_score(hd, t, s));
		for (size_t s = 0; s <= t; s++)
			sum += exp(attention_score(hd, t, s) - mx);
		lse[t] = (float)(mx + log(sum));
	}
	/* out weighs v with the probabilities of the rounded lse, the ones
	 * the backward pass sees. */
	attention_probs(p, hd, lse);
	for (size_t t = 0; t < T; t++)
		for (size_t d = 0; d < hd->hs; d++) {
			double acc = 0.0;
			for (size_t s = 0; s <= t; s++)
				acc += attention_operand(p[t * T + s],
							 hd->bf16) *
				       qkv_at(hd, s, 2, d);
			act_store(out, out_index(hd, t, d), acc, hd->bf16);
		}
}

/* One head's gradients added into dqkv, from its lse; a and dpre room for
 * its probabilities and score gradients. */
static void attention_head_backward(void *dqkv, double *a, double *dpre,
				    const void *dout, const float *lse,
				    const head_t *hd)
{
	size_t T = hd->T, hs = hd->hs;
	double scale = 1.0 / sqrt((double)hs);
	bool bf16 = hd->bf16;

	attention_probs(a, hd, lse);
	for (size_t t = 0; t < T; t++) {
		double dot = 0.0;
		for (size_t s = 0; s <= t; s++) {
			double datt = 0.0;
			for (size_t d = 0; d < hs; d++)
				datt += act_load(dout, out_index(hd, t, d),
						 bf16) *
					qkv_at(hd, s, 2, d);
			dpre[t * T + s] = datt;
			dot += a[t * T + s] * datt;
		}
		for (size_t s = 0; s <= t; s++)
			dpre[t * T + s] = attention_operand(
				scale * a[t * T + s] * (dpre[t * T + s] - dot),
				bf16);
	}
	for (size_t t = 0; t < T; t++) {
		for (size_t d = 0; d < hs; d++) {
			double dq = 0.0, dk = 0.0, dv = 0.0;
			/* dq of position t: its row of dpre. */
			for (size_t s = 0; s <= t; s++)
				dq += dpre[t * T + s] * qkv_at(hd, s, 1, d);
			/* dk, dv of position t (as a key): its column, rows
			 * u >= t. */
			for (size_t u = t; u < T; u++) {
				dk += dpre[u * T + t] * qkv_at(hd, u, 0, d);
				dv += attention_operand(a[u * T + t], bf16) *
				      act_load(dout, out_index(hd, u, d), bf16);
			}
			act_add(dqkv, qkv_index(hd, t, 0, d), dq, bf16);
			act_add(dqkv, qkv_index(hd, t, 1, d), dk, bf16);
			act_add(dqkv, qkv_index(hd, t, 2, d), dv, bf16);
		}
	}
}

static void attention_forward(void *out, float *lse, double *p,
			      const void *qkv, size_t B, size_t T, size_t C,
			      size_t NH, bool bf16)
{
	for (size_t b = 0; b < B; b++)
		for (size_t h = 0; h < NH; h++) {
			head_t hd = { qkv, bf16, b, h, T, C, C / NH };
			attention_head_forward(out, lse + (b * NH + h) * T, p,
					       &hd);
		}
}

static void attention_backward(void *dqkv, double *a, const void *dout,
			       const void *qkv, const float *lse, size_t B,
			       size_t T, size_t C, size_t NH, bool bf16)
{
	for (size_t b = 0; b < B; b++)
		for (size_t h = 0; h < NH; h++) {
			head_t hd = { qkv, bf16, b, h, T, C, C / NH };
			attention_head_backward(dqkv, a, a + T * T, dout,
						lse + (b * NH + h) * T, &hd);
		}
}

void flow_ref_attention_forward(float *out, float *lse, void *scratch,
				const float *qkv, size_t B, size_t T, size_t C,
				size_t NH)
{
	attention_forward(out, lse, scratch, qkv, B, T, C, NH, false);
}

/* Two T x T matrices of doubles, whatever the dtype: a bf16 operand is
 * widened where it is read. */
size_t flow_ref_attention_scratch_bound(size_t B, size_t T, size_t C,
					size_t NH, bool bf16)
{
	return 2 * T * T * sizeof(double);
}

/* out is not read: rowsum(P dP) comes from the probabilities, as the
 * contract defines it. */
void flow_ref_attention_backward(float *dqkv, void *scratch, const float *dout,
				 const float *qkv, const float *lse,
				 const float *out, size_t B, size_t T, size_t C,
				 size_t NH)
{
	attention_backward(dqkv, scratch, dout, qkv, lse, B, T, C, NH, false);
}

void flow_ref_attention_bf16_forward(flow_bf16_t *out, float *lse,
				     void *scratch, const flow_bf16_t *qkv,
				     size_t B, size_t T, size_t C, size_t NH)
{
	attention_forward(out, lse, scratch, qkv, B, T, C, NH, true);
}

void flow_ref_attention_bf16_backward(flow_bf16_t *dqkv, void *scratch,
				      const flow_bf16_t *dout,
				      const flow_bf16_t *qkv, const float *lse,
				      const flow_bf16_t *out, size_t B,
				      size_t T, size_t C, size_t NH)
{
	attention_backward(dqkv, scratch, dout, qkv, lse, B, T, C, NH, true);
}

/* ---- residual ------------------------------------------------------------------------ */

/* a, out, da and dout are the residual stream, fp32; b and db are the
 * branch, bf16 in the twins. */
static void residual_forward(float *out, const float *a, const void *b,
			     size_t n, bool bf16)
{
	for (size_t i = 0; i < n; i++)
		out[i] = (float)((double)a[i] + act_load(b, i, bf16));
}

static void residual_backward(float *da, void *db, const float *dout,
			      size_t n, bool bf16)
{
	for (size_t i = 0; i < n; i++) {
		if (da)
			da[i] = (float)((double)da[i] + (double)dout[i]);
		if (db)
			act_add(db, i, (double)dout[i], bf16);
	}
}

void flow_ref_residual_forward(float *out, const float *a, const float *b,
			       size_t n)
{
	residual_forward(out, a, b, n, false);
}

void flow_ref_residual_backward(float *da, float *db, const float *dout,
				size_t n)
{
	residual_backward(da, db, dout, n, false);
}

void flow_ref_residual_bf16_forward(float *out, const float *a,
				    const flow_bf16_t *b, size_t n)
{
	residual_forward(out, a, b, n, true);
}

void flow_ref_residual_bf16_backward(float *da, flow_bf16_t *db,
				     const float *dout, size_t n)
{
	residual_backward(da, db, dout, n, true);
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

void flow_ref_residual_layernorm_bf16_forward(float *res, flow_bf16_t *out,
					      float *mean, float *rstd,
					      const float *a,
					      const flow_bf16_t *b,
					      const float *weight,
					      const float *bias, size_t n,
					      size_t C)
{
	flow_ref_residual_bf16_forward(res, a, b, n * C);
	flow_ref_layernorm_bf16_forward(out, mean, rstd, res, weight, bias, n,
					C);
}

void flow_ref_layernorm_residual_bf16_backward(
	float *dres, float *da, flow_bf16_t *db, float *dweight, float *dbias,
	const flow_bf16_t *dout, const float *res, const float *weight,
	const float *mean, const float *rstd, size_t n, size_t C)
{
	flow_ref_layernorm_bf16_backward(dres, dweight, dbias, dout, res,
					 weight, mean, rstd, n, C);
	flow_ref_residual_bf16_backward(da, db, dres, n * C);
}

/* ---- softmax cross-entropy ---------------------------------------------------------- */

/* The logits are fp32, or bf16 in the twins, and a row of them starts at
 * element row.  The whole-row kernels and the three bf16 split steps are
 * made of the same three pieces. */

/* The largest of the row's first n logits; -inf for none. */
static double ce_max(const void *logits, size_t row, size_t n, bool bf16)
{
	double mx = -INFINITY;

	for (size_t j = 0; j < n; j++)
		mx = fmax(mx, act_load(logits, row + j, bf16));
	return mx;
}

/* The sum of exp(logit - mx) over the row's first n logits. */
static double ce_sum(const void *logits, size_t row, size_t n, double mx,
		     bool bf16)
{
	double sum = 0.0;

	for (size_t j = 0; j < n; j++)
		sum += exp(act_load(logits, row + j, bf16) - mx);
	return sum;
}

/* The row's cols logits overwritten in place with the gradient of dloss
 * times its loss: dloss * (exp(logit - mx) / sum - onehot) on the first
 * valid columns (the target, when the row holds it, at column tgt; -1
 * when not), 0 on the rest, and 0 everywhere for a row not counted. */
static void ce_grad(void *logits, size_t row, size_t cols, size_t valid,
		    bool counted, int64_t tgt, double mx, double sum,
		    float dloss, bool bf16)
{
	for (size_t j = 0; j < cols; j++) {
		double g = 0.0;
		if (counted && j < valid) {
			double p = exp(act_load(logits, row + j, bf16) - mx) /
				   sum;
			double onehot = (int64_t)j == tgt ? 1.0 : 0.0;
			g = (double)dloss * (p - onehot);
		}
		act_store(logits, row + j, g, bf16);
	}
}

static void cross_entropy(float *losses, void *logits, const int32_t *targets,
			  size_t n, size_t V, size_t Vp, float dloss, bool bf16)
{
	for (size_t r = 0; r < n; r++) {
		size_t row = r * Vp;
		bool counted = targets[r] >= 0;
		double mx = 0.0, sum = 0.0;
		losses[r] = 0.0f;
		if (counted) {
			mx = ce_max(logits, row, V, bf16);
			sum = ce_sum(logits, row, V, mx, bf16);
			double xt = act_load(logits, row + (size_t)targets[r],
					     bf16);
			losses[r] = (float)(mx + log(sum) - xt);
		}
		ce_grad(logits, row, Vp, V, counted, targets[r], mx, sum, dloss,
			bf16);
	}
}

void flow_ref_cross_entropy_forward_backward(float *losses, float *logits,
					     const int32_t *targets, size_t n,
					     size_t V, size_t Vp, float dloss)
{
	cross_entropy(losses, logits, targets, n, V, Vp, dloss, false);
}

void flow_ref_cross_entropy_bf16_forward_backward(float *losses,
						  flow_bf16_t *logits,
						  const int32_t *targets,
						  size_t n, size_t V, size_t Vp,
						  float dloss)
{
	cross_entropy(losses, logits, targets, n, V, Vp, dloss, true);
}

/* The split steps of bf16 logits (the fp32 ones are the CPU set's, see
 * table.c). */
void flow_ref_cross_entropy_bf16_split_max(float *max,
					   const flow_bf16_t *logits,
					   const flow_logits_shard_t *s)
{
	for (size_t r = 0; r < s->n; r++)
		max[r] = (float)ce_max(logits, r * s->cols, s->valid, true);
}

void flow_ref_cross_entropy_bf16_split_sums(float *sums, float *max,
					    const float *gathered, size_t p,
					    const flow_bf16_t *logits,
					    const flow_logits_shard_t *s)
{
	for (size_t r = 0; r < s->n; r++) {
		float m = gathered[r];
		for (size_t q = 1; q < p; q++)
			m = fmaxf(m, gathered[q * s->n + r]);
		max[r] = m;
		sums[r] = (float)ce_sum(logits, r * s->cols, s->valid, m, true);
	}
}

void flow_ref_cross_entropy_bf16_split_finish(float *losses,
					      flow_bf16_t *logits,
					      const int32_t *targets,
					      const float *max,
					      const float *sums,
					      const flow_logits_shard_t *s,
					      float dloss)
{
	for (size_t r = 0; r < s->n; r++) {
		size_t row = r * s->cols;
		bool counted = targets[r] >= 0;
		int64_t t = targets[r] - s->c0;
		bool held = counted && t >= 0 && t < (int64_t)s->valid;
		double loss = s->first && counted ?
				      log((double)sums[r]) + (double)max[r] :
				      0.0;
		if (held)
			loss -= act_load(logits, row + (size_t)t, true);
		losses[r] = (float)loss;
		ce_grad(logits, row, s->cols, s->valid, counted, held ? t : -1,
			max[r], sums[r], dloss, true);
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
