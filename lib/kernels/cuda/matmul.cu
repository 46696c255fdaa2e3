/* matmul on the GPU: out[n,o] = inp[n,i] . weight[o,i]^T + bias[o] through
 * cuBLASLt with the bias (and, fused with the next op, the GELU) added in
 * the GEMM's epilogue (cuBLAS sgemm and separate passes where cuBLASLt
 * has no algorithm), its backward through cuBLAS
 * with beta = 1 (accumulating), and a deterministic column reduction for
 * dbias.  Mirrors cpu/matmul.c.
 *
 * cuBLAS is column-major: a row-major (r x c) matrix with row stride ld is the
 * column-major (c x r) matrix with leading dimension ld, its transpose.  So
 * every row-major product P = X . Y is issued as P^T = Y^T . X^T.
 *
 * The bf16 twins (mixed precision) run the same products on the bf16
 * activations in place, with the weight rounded to bf16 into the
 * executor's scratch once per call: see the end. */
#include <config.h>

#include "cuda_internal.h"

/* out[r, c] += bias[c] over n rows of out_dim columns. */
static __global__ void add_bias_kernel(float *__restrict__ out,
				       const float *__restrict__ bias,
				       size_t n, size_t out_dim)
{
	const size_t total = n * out_dim;
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += stride)
		out[i] += bias[i % out_dim];
}

static flow_err_t add_bias(float *out, const float *bias, size_t n,
			   size_t out_dim, flow_diag_t *diag,
			   cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;

	add_bias_kernel<<<flow_cuda__grid(n * out_dim, 256 * 4), 256, 0,
			  stream>>>(out, bias, n, out_dim);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

/* ---- the bias in the GEMM's epilogue (cuBLASLt) ---------------------------- */

/* The largest power of two, at most 256, that divides every address:
 * what cuBLASLt may assume of the buffers (it assumes 256 unless told,
 * and the arena's tensors and a panel's rows are only 64- or 4-byte
 * aligned). */
static uint32_t common_alignment(const void *a, const void *b, const void *c,
				 const void *d)
{
	uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c |
			 (uintptr_t)d | 256u;
	return (uint32_t)(bits & (~bits + 1u));
}

/* cuBLASLt's pick for one form of the forward GEMM, kept per thread: the
 * heuristic costs host time, and would otherwise run for every matmul of
 * every step.  The pick depends only on the key, so reusing it changes
 * no bits. */
struct lt_pick {
	cublasLtHandle_t lt; /* per device */
	cudaDataType_t type, out_type;
	size_t m, n, k;
	uint32_t align;      /* of a, b, d and the pre-activation */
	uint32_t bias_align; /* which the heuristic reads off the pointer */
	cublasLtEpilogue_t epilogue;
	bool found; /* false: cuBLASLt has no algorithm for it */
	cublasLtMatmulAlgo_t algo;
};

#define LT_PICKS 64 /* forms a GPT's matmuls take: a dozen */
static thread_local lt_pick lt_picks[LT_PICKS];
static thread_local int lt_npicks;

void flow_cuda__lt_picks_forget(void)
{
	lt_npicks = 0;
}

/* Forward GEMMs with a bias or a GELU, by the way they ran; and whether
 * they may fuse them (flow_cuda_matmul_use_epilogue). */
static thread_local uint64_t lt_fused, lt_two_pass;
static thread_local bool lt_epilogue = true;

void flow_cuda_matmul_epilogue_counts(uint64_t *fused, uint64_t *two_pass)
{
	*fused = lt_fused;
	*two_pass = lt_two_pass;
}

void flow_cuda_matmul_use_epilogue(bool on)
{
	lt_epilogue = on;
}

static lt_pick *lt_pick_find(const lt_pick *key)
{
	for (int i = 0; i < lt_npicks; i++) {
		lt_pick *p = &lt_picks[i];
		if (p->lt == key->lt && p->type == key->type &&
		    p->out_type == key->out_type && p->m == key->m &&
		    p->n == key->n && p->k == key->k && p->align == key->align &&
		    p->bias_align == key->bias_align &&
		    p->epilogue == key->epilogue)
			return p;
	}
	return NULL;
}

/* The forward GEMM, column-major: D (m x n) = A^T . B with A stored k x m
 * and B k x n (out^T = W^T . inp^T of a row-major matmul), + bias[m] on
 * every column when bias; with pre, that sum goes to pre (the
 * pre-activation) and its GELU to D.  In one pass through cuBLASLt's
 * epilogue (BIAS, GELU_AUX or GELU_AUX_BIAS), which applies them to the
 * fp32 sums as each tile is written; A and B are of type (fp32 or bf16),
 * D, pre and the bias of out_type (fp32, or bf16: D and pre rounded once
 * from the fp32 sum; a bias of D's type is what cublasLt.h documents)
 * (CUBLAS_COMPUTE_32F: true fp32 for fp32 operands, no TF32).  *done is
 * false, and nothing written, when cuBLASLt
 * has no algorithm for the types, the shape and the buffers' alignment,
 * or the bias is under-aligned: the caller then runs the GEMM and the
 * passes after it. */
static flow_err_t gemm_lt(cudaDataType_t type, cudaDataType_t out_type,
			  size_t m, size_t n, size_t k, const void *a,
			  const void *b, const void *bias, void *d, void *pre,
			  bool *done, flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasLtHandle_t lt = NULL;
	void *ws = NULL;
	cublasLtMatmulDesc_t op = NULL;
	cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
	cublasLtMatmulPreference_t pref = NULL;
	cublasLtMatmulHeuristicResult_t found;
	lt_pick key, *pick = NULL;
	const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
	cublasLtEpilogue_t epilogue = !pre ? CUBLASLT_EPILOGUE_BIAS :
				      bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS :
					     CUBLASLT_EPILOGUE_GELU_AUX;
	const size_t ws_bytes = FLOW_CUDA_LT_WORKSPACE;
	const int64_t aux_ld = (int64_t)m;
	/* D and the pre-activation are laid out alike: one alignment. */
	const uint32_t align = common_alignment(a, b, d, pre ? pre : d);
	/* A bf16 D's split-K parts summed in fp32, never in D's type (in
	 * place or in the workspace): D is rounded once. */
	const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE |
				 CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
	int count = 0;
	const float one = 1.0f, zero = 0.0f;
	cublasStatus_t ran;

	*done = false;
	/* Nor may it be told the bias's alignment, and its epilogues load
	 * the bias 16 bytes at a time: a bias off that (a slice of a
	 * larger vector) takes the two-pass way; so does a pre-activation
	 * whose leading dimension is not a multiple of 8, as GELU_AUX
	 * requires. */
	if (!lt_epilogue || (uintptr_t)bias % 16 != 0 || (pre && m % 8 != 0))
		return FLOW_OK;
	FLOW_TRY(flow_cuda__cublaslt(&lt, &ws, stream, diag), out);
	FLOW_CUBLAS_TRY(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F,
						 CUDA_R_32F),
			out);
	FLOW_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
				op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
			out);
	FLOW_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
				op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
			out);
	FLOW_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
				op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
				sizeof epilogue),
			out);
	if (bias)
		FLOW_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
					op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
					&bias, sizeof bias),
				out);
	if (pre) {
		FLOW_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
					op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
					&pre, sizeof pre),
				out);
		FLOW_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
					op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
					&aux_ld, sizeof aux_ld),
				out);
	}
	/* As stored, column-major: A k x m (op T), B k x n, D m x n. */
	FLOW_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&la, type, k, m, (int64_t)k),
			out);
	FLOW_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&lb, type, k, n, (int64_t)k),
			out);
	FLOW_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&ld, out_type, m, n,
						   (int64_t)m),
			out);
	key = lt_pick{ lt, type, out_type, m, n, k, align,
		       bias ? common_alignment(bias, bias, bias, bias) : 0u,
		       epilogue, false, {} };
	pick = lt_pick_find(&key);
	if (pick && !pick->found)
		goto out; /* asked before: no algorithm */
	if (pick)
		goto run;
	FLOW_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref), out);
	FLOW_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
				pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
				&ws_bytes, sizeof ws_bytes),
			out);
	if (out_type != CUDA_R_32F)
		FLOW_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
					pref,
					CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
					&schemes, sizeof schemes),
				out);
	for (cublasLtMatmulPreferenceAttributes_t attr :
	     { CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
	       CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
	       CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
	       CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES })
		FLOW_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
					pref, attr, &align, sizeof align),
				out);
	/* No algorithm is not a failure: the caller has the two-pass way. */
	key.found = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref,
						   1, &found, &count) ==
			    CUBLAS_STATUS_SUCCESS &&
		    count > 0;
	if (key.found)
		key.algo = found.algo;
	pick = &key;
	if (lt_npicks < LT_PICKS) {
		lt_picks[lt_npicks] = key;
		pick = &lt_picks[lt_npicks++];
	}
	if (!pick->found)
		goto out;
run:
	ran = cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, d, ld, d, ld,
			     &pick->algo, ws, ws_bytes, stream);
	if (ran == CUBLAS_STATUS_NOT_SUPPORTED) {
		/* Offered by the heuristic, refused when run: no algorithm
		 * after all, nothing ran. */
		pick->found = false;
		goto out;
	}
	FLOW_CUBLAS_TRY(ran, out);
	FLOW_TRY(flow_cuda__cublaslt_used(stream, diag), out);
	*done = true;
out:
	if (pref)
		(void)cublasLtMatmulPreferenceDestroy(pref);
	if (ld)
		(void)cublasLtMatrixLayoutDestroy(ld);
	if (lb)
		(void)cublasLtMatrixLayoutDestroy(lb);
	if (la)
		(void)cublasLtMatrixLayoutDestroy(la);
	if (op)
		(void)cublasLtMatmulDescDestroy(op);
	return err;
}

/* The fp32 forward GEMM of gemm_lt, with its bias and, with pre, its
 * GELU: through cuBLASLt where it can, else cublasSgemm, the bias pass
 * and the GELU kernel. */
static flow_err_t gemm_forward(size_t m, size_t n, size_t k, const float *a,
			       const float *b, const float *bias, float *d,
			       float *pre, flow_diag_t *diag,
			       cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	const float one = 1.0f, zero = 0.0f;
	float *sum = pre ? pre : d;
	bool done = false;

	if (bias || pre) {
		FLOW_TRY(gemm_lt(CUDA_R_32F, CUDA_R_32F, m, n, k, a, b, bias,
				 d, pre, &done, diag, stream),
			 out);
		++*(done ? &lt_fused : &lt_two_pass);
	}
	if (done)
		return FLOW_OK;
	FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	FLOW_CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n,
				    (int)k, &one, a, (int)k, b, (int)k, &zero,
				    sum, (int)m),
			out);
	if (bias)
		FLOW_TRY(add_bias(sum, bias, n, m, diag, stream), out);
	if (pre)
		FLOW_TRY(flow_cuda_gelu_forward(d, pre, n * m, diag, stream),
			 out);
out:
	return err;
}

/* Rows of each block column pass in dbias_kernel: block (32, ROWS). */
#define DBIAS_ROWS 32

/* dbias[c] += sum over r of dout[r, c], dout fp32 or bf16.  Block (32,
 * DBIAS_ROWS) owns 32 consecutive columns (one per lane, so each warp
 * reads a contiguous segment of a row); thread y sums rows y,
 * y + DBIAS_ROWS, ... in increasing order, then the DBIAS_ROWS partial sums
 * are added in y order.  The partition depends only on n, so the result is
 * deterministic. */
template <typename T>
static __global__ void column_sum_kernel(float *__restrict__ dbias,
					 const T *__restrict__ dout, size_t n,
					 size_t out_dim)
{
	__shared__ float part[DBIAS_ROWS][33];
	const size_t c = (size_t)blockIdx.x * 32 + threadIdx.x;
	float acc = 0.0f;
	if (c < out_dim)
		for (size_t r = threadIdx.y; r < n; r += DBIAS_ROWS)
			acc += flow_load(&dout[r * out_dim + c]);
	part[threadIdx.y][threadIdx.x] = acc;
	__syncthreads();
	if (threadIdx.y == 0 && c < out_dim) {
		float sum = 0.0f;
		for (int y = 0; y < DBIAS_ROWS; y++)
			sum += part[y][threadIdx.x];
		dbias[c] += sum;
	}
}

template <typename T>
static flow_err_t column_sum(float *dbias, const T *dout, size_t n,
			     size_t out_dim, flow_diag_t *diag,
			     cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	const dim3 block(32, DBIAS_ROWS);

	column_sum_kernel<<<(unsigned)flow_cuda__ceil_div(out_dim, 32), block,
			    0, stream>>>(dbias, dout, n, out_dim);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

/* Every size must fit the int that cublasSgemm takes; func names the caller
 * in diag. */
static flow_err_t matmul_check(size_t n, size_t in_dim, size_t out_dim,
			       const char *func, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;

	FLOW_TRY(flow_cuda__check_size(diag, func, "n", n, INT_MAX), out);
	FLOW_TRY(flow_cuda__check_size(diag, func, "in_dim", in_dim, INT_MAX),
		 out);
	FLOW_TRY(flow_cuda__check_size(diag, func, "out_dim", out_dim, INT_MAX),
		 out);
out:
	return err;
}

/* out (and with pre, the pre-activation) of the fp32 matmul. */
static flow_err_t fp32_forward(float *out, float *pre, const float *inp,
			       const float *weight, const float *bias, size_t n,
			       size_t in_dim, size_t out_dim, const char *func,
			       flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	float *sum = pre ? pre : out;

	if (n == 0 || out_dim == 0)
		return FLOW_OK;
	FLOW_TRY(matmul_check(n, in_dim, out_dim, func, diag), out);
	if (in_dim == 0) {
		/* An empty sum: out = 0 (+ bias, then the GELU). */
		FLOW_CUDA_TRY(cudaMemsetAsync(sum, 0, n * out_dim * sizeof(float),
					      stream),
			      out);
		if (bias)
			FLOW_TRY(add_bias(sum, bias, n, out_dim, diag, stream),
				 out);
		if (pre)
			FLOW_TRY(flow_cuda_gelu_forward(out, pre, n * out_dim,
							diag, stream),
				 out);
	} else {
		/* out^T (o x n) = W (o x i, stored as i x o) ^T . inp^T (i x n) */
		FLOW_TRY(gemm_forward(out_dim, n, in_dim, weight, inp, bias,
				      out, pre, diag, stream),
			 out);
	}
out:
	return err;
}

flow_err_t flow_cuda_matmul_forward(float *out, const float *inp,
				    const float *weight, const float *bias,
				    size_t n, size_t in_dim, size_t out_dim,
				    flow_diag_t *diag, cudaStream_t stream)
{
	return fp32_forward(out, NULL, inp, weight, bias, n, in_dim, out_dim,
			    __func__, diag, stream);
}

flow_err_t flow_cuda_matmul_gelu_forward(float *pre, float *out,
					 const float *inp, const float *weight,
					 const float *bias, size_t n,
					 size_t in_dim, size_t out_dim,
					 flow_diag_t *diag, cudaStream_t stream)
{
	return fp32_forward(out, pre, inp, weight, bias, n, in_dim, out_dim,
			    __func__, diag, stream);
}

flow_err_t flow_cuda_matmul_backward(float *dinp, float *dweight, float *dbias,
				     const float *dout, const float *inp,
				     const float *weight, size_t n,
				     size_t in_dim, size_t out_dim,
				     flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	const float one = 1.0f;

	/* Every gradient is a sum over n rows or over out_dim columns: with
	 * either empty, nothing is added.  in_dim == 0 leaves dinp and dweight
	 * empty but dbias still gets its sums. */
	if (n == 0 || out_dim == 0)
		return FLOW_OK;
	FLOW_TRY(matmul_check(n, in_dim, out_dim, __func__, diag), out);
	if (in_dim > 0 && (dinp || dweight))
		FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	if (in_dim > 0 && dinp) {
		/* dinp^T (i x n) += W^T (stored i x o) . dout^T (o x n) */
		FLOW_CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N,
					    (int)in_dim, (int)n, (int)out_dim,
					    &one, weight, (int)in_dim, dout,
					    (int)out_dim, &one, dinp,
					    (int)in_dim),
				out);
	}
	if (in_dim > 0 && dweight) {
		/* dW^T (i x o) += inp^T (i x n) . (dout^T (o x n))^T */
		FLOW_CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T,
					    (int)in_dim, (int)out_dim, (int)n,
					    &one, inp, (int)in_dim, dout,
					    (int)out_dim, &one, dweight,
					    (int)in_dim),
				out);
	}
	if (dbias)
		FLOW_TRY(column_sum(dbias, dout, n, out_dim, diag, stream),
			 out);
out:
	return err;
}

flow_err_t flow_cuda_gemm(bool trans_a, bool trans_b, size_t m, size_t n,
			  size_t k, const float *a, const float *b, float beta,
			  float *c, flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	const float one = 1.0f;

	if (m == 0 || n == 0)
		return FLOW_OK;
	FLOW_TRY(matmul_check(m, k, n, __func__, diag), out);
	FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	/* Row-major C = op(A) . op(B) is column-major C^T = op(B)^T . op(A)^T;
	 * a row-major X is the column-major X^T with its row length as ld. */
	/* cuBLAS wants every leading dimension >= 1, even of an empty
	 * operand (k = 0: C = beta C). */
	FLOW_CUBLAS_TRY(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
				    trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n,
				    (int)m, (int)k, &one, b,
				    (int)(trans_b ? (k ? k : 1) : n), a,
				    (int)(trans_a ? m : (k ? k : 1)), &beta, c,
				    (int)n),
			out);
out:
	return err;
}

/* ---- bf16 twins --------------------------------------------------------- */
/* The activations are read and written in bf16 where they lie; the weight
 * and the bias are rounded to bf16 into scratch once per call (round to
 * nearest even, as the CPU's flow_bf16_narrow); every product is summed
 * in fp32 (CUBLAS_COMPUTE_32F: the tensor cores).  Forward, the bias and
 * the GELU go in cuBLASLt's epilogue, on the fp32 sums, rounded once to
 * bf16; where cuBLASLt has no algorithm for that, the GEMM writes fp32
 * sums into a panel of scratch, FLOW_CUDA_BF16_PANEL elements of rows at
 * a time (flow_matmul_bf16_panel_rows), and one pass adds the bias,
 * takes the GELU and rounds: the same arithmetic.  Backward, dinp
 * accumulates in bf16 through the GEMM's beta = 1 (its fp32 sum rounded
 * once), dweight in fp32, and dbias is the column sums of the bf16 dout. */

/* Elements of the fallback's fp32 panel (64 MiB): the rows of one panel
 * take at most this many elements of each of inp and dout (the panel rule
 * of flow/kernels.h). */
#define FLOW_CUDA_BF16_PANEL ((size_t)1 << 24)

static __global__ void round_bf16_kernel(__nv_bfloat16 *__restrict__ out,
					 const float *__restrict__ in, size_t n)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		flow_store(&out[i], in[i]);
}

/* n elements of a weight or bias rounded to bf16 into w. */
static flow_err_t round_weight(__nv_bfloat16 *w, const float *weight,
			       size_t n, flow_diag_t *diag,
			       cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;

	round_bf16_kernel<<<flow_cuda__grid(n, 256 * 4), 256, 0, stream>>>(
		w, weight, n);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

/* What the GELU_AUX(_BIAS) and BIAS epilogues write, from fp32 sums:
 * s = sum + bias[col] over rows x cols (sum NULL: an empty sum, 0; bias
 * optional); out = bf16(s), or with pre, pre = bf16(s) and
 * out = bf16(gelu(s)). */
static __global__ void bf16_epilogue_kernel(__nv_bfloat16 *__restrict__ out,
					    __nv_bfloat16 *__restrict__ pre,
					    const float *__restrict__ sum,
					    const __nv_bfloat16 *__restrict__ bias,
					    size_t rows, size_t cols)
{
	const size_t total = rows * cols;
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < total; i += stride) {
		float s = sum ? sum[i] : 0.0f;
		if (bias)
			s += __bfloat162float(bias[i % cols]);
		if (pre) {
			flow_store(&pre[i], s);
			s = flow_gelu(s);
		}
		flow_store(&out[i], s);
	}
}

static flow_err_t bf16_epilogue(__nv_bfloat16 *out, __nv_bfloat16 *pre,
				const float *sum, const __nv_bfloat16 *bias,
				size_t rows, size_t cols, flow_diag_t *diag,
				cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;

	bf16_epilogue_kernel<<<flow_cuda__grid(rows * cols, 256 * 4), 256, 0,
			       stream>>>(out, pre, sum, bias, rows, cols);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

/* Column-major C (m x n, ldc) = op(A) . op(B) + beta C on bf16 A and B,
 * C of type ct, summed in fp32 (CUBLAS_COMPUTE_32F: the tensor cores); a
 * bf16 C is read, added to and rounded once. */
static flow_err_t gemm_bf16(cublasHandle_t h, cublasOperation_t opa,
			    cublasOperation_t opb, size_t m, size_t n,
			    size_t k, const __nv_bfloat16 *a, size_t lda,
			    const __nv_bfloat16 *b, size_t ldb, float beta,
			    void *c, cudaDataType_t ct, size_t ldc,
			    flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	const float one = 1.0f;

	FLOW_CUBLAS_TRY(cublasGemmEx(h, opa, opb, (int)m, (int)n, (int)k, &one,
				     a, CUDA_R_16BF, (int)lda, b, CUDA_R_16BF,
				     (int)ldb, &beta, c, ct, (int)ldc,
				     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
			out);
out:
	return err;
}

/* Where a bf16 call keeps things in scratch: the rounded weight and
 * bias, then the fallback's fp32 panel of rows rows. */
struct bf16_scratch {
	__nv_bfloat16 *w, *b;
	float *panel;
	size_t rows;
};

static bf16_scratch bf16_carve(void *scratch, size_t n, size_t in_dim,
			       size_t out_dim)
{
	bf16_scratch s;
	char *p = (char *)scratch;

	s.rows = flow_matmul_bf16_panel_rows(n, in_dim, out_dim,
					     FLOW_CUDA_BF16_PANEL);
	s.w = (__nv_bfloat16 *)p;
	p += flow_cuda__scratch_align(out_dim * in_dim * sizeof(__nv_bfloat16));
	s.b = (__nv_bfloat16 *)p;
	p += flow_cuda__scratch_align(out_dim * sizeof(__nv_bfloat16));
	s.panel = (float *)p;
	return s;
}

size_t flow_cuda_matmul_bf16_scratch_bound(size_t n, size_t in_dim,
					   size_t out_dim)
{
	size_t rows = flow_matmul_bf16_panel_rows(n, in_dim, out_dim,
						  FLOW_CUDA_BF16_PANEL);
	return flow_cuda__scratch_align(out_dim * in_dim *
					sizeof(__nv_bfloat16)) +
	       flow_cuda__scratch_align(out_dim * sizeof(__nv_bfloat16)) +
	       flow_cuda__scratch_align(rows * out_dim * sizeof(float));
}

/* out (and with pre, the pre-activation and out its GELU) of the bf16
 * matmul. */
static flow_err_t bf16_forward(__nv_bfloat16 *out, __nv_bfloat16 *pre,
			       void *scratch, const __nv_bfloat16 *inp,
			       const float *weight, const float *bias,
			       size_t n, size_t in_dim, size_t out_dim,
			       const char *func, flow_diag_t *diag,
			       cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	const bf16_scratch s = bf16_carve(scratch, n, in_dim, out_dim);
	const __nv_bfloat16 *b = bias ? s.b : NULL;
	bool done = false;

	if (n == 0 || out_dim == 0)
		return FLOW_OK;
	FLOW_TRY(matmul_check(n, in_dim, out_dim, func, diag), out);
	if (bias)
		FLOW_TRY(round_weight(s.b, bias, out_dim, diag, stream), out);
	if (in_dim == 0) /* an empty sum: the bias or zeros, then the GELU */
		return bf16_epilogue(out, pre, NULL, b, n, out_dim, diag,
				     stream);
	FLOW_TRY(round_weight(s.w, weight, out_dim * in_dim, diag, stream),
		 out);
	FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	if (!bias && !pre) {
		/* out^T (o x n) = W (o x i, stored as i x o) ^T . inp^T */
		FLOW_TRY(gemm_bf16(h, CUBLAS_OP_T, CUBLAS_OP_N, out_dim, n,
				   in_dim, s.w, in_dim, inp, in_dim, 0.0f, out,
				   CUDA_R_16BF, out_dim, diag),
			 out);
		return FLOW_OK;
	}
	FLOW_TRY(gemm_lt(CUDA_R_16BF, CUDA_R_16BF, out_dim, n, in_dim, s.w,
			 inp, b, out, pre, &done, diag, stream),
		 out);
	++*(done ? &lt_fused : &lt_two_pass);
	for (size_t r0 = 0; !done && r0 < n; r0 += s.rows) {
		size_t m = n - r0 < s.rows ? n - r0 : s.rows;
		FLOW_TRY(gemm_bf16(h, CUBLAS_OP_T, CUBLAS_OP_N, out_dim, m,
				   in_dim, s.w, in_dim, inp + r0 * in_dim,
				   in_dim, 0.0f, s.panel, CUDA_R_32F, out_dim,
				   diag),
			 out);
		FLOW_TRY(bf16_epilogue(out + r0 * out_dim,
				       pre ? pre + r0 * out_dim : NULL,
				       s.panel, b, m, out_dim, diag, stream),
			 out);
	}
out:
	return err;
}

flow_err_t flow_cuda_matmul_bf16_forward(flow_bf16_t *out, void *scratch,
					 const flow_bf16_t *inp,
					 const float *weight, const float *bias,
					 size_t n, size_t in_dim,
					 size_t out_dim, flow_diag_t *diag,
					 cudaStream_t stream)
{
	return bf16_forward(flow_cuda__bf16(out), NULL, scratch,
			    flow_cuda__bf16(inp), weight, bias, n, in_dim,
			    out_dim, __func__, diag, stream);
}

flow_err_t flow_cuda_matmul_gelu_bf16_forward(
	flow_bf16_t *pre, flow_bf16_t *out, void *scratch,
	const flow_bf16_t *inp, const float *weight, const float *bias,
	size_t n, size_t in_dim, size_t out_dim, flow_diag_t *diag,
	cudaStream_t stream)
{
	return bf16_forward(flow_cuda__bf16(out), flow_cuda__bf16(pre), scratch,
			    flow_cuda__bf16(inp), weight, bias, n, in_dim,
			    out_dim, __func__, diag, stream);
}

flow_err_t flow_cuda_matmul_bf16_backward(flow_bf16_t *dinp, float *dweight,
					  float *dbias, void *scratch,
					  const flow_bf16_t *dout,
					  const flow_bf16_t *inp,
					  const float *weight, size_t n,
					  size_t in_dim, size_t out_dim,
					  flow_diag_t *diag,
					  cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	const bf16_scratch s = bf16_carve(scratch, n, in_dim, out_dim);
	const __nv_bfloat16 *g = flow_cuda__bf16(dout);

	/* As the fp32 kernel: with n or out_dim empty nothing is added;
	 * in_dim == 0 leaves dinp and dweight empty, dbias still summed. */
	if (n == 0 || out_dim == 0)
		return FLOW_OK;
	FLOW_TRY(matmul_check(n, in_dim, out_dim, __func__, diag), out);
	if (dbias)
		FLOW_TRY(column_sum(dbias, g, n, out_dim, diag, stream), out);
	if (in_dim == 0 || (!dinp && !dweight))
		return FLOW_OK;
	FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	if (dinp) {
		FLOW_TRY(round_weight(s.w, weight, out_dim * in_dim, diag,
				      stream),
			 out);
		/* dinp^T (i x n) += W^T (stored i x o) . dout^T (o x n) */
		FLOW_TRY(gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_N, in_dim, n,
				   out_dim, s.w, in_dim, g, out_dim, 1.0f,
				   dinp, CUDA_R_16BF, in_dim, diag),
			 out);
	}
	if (dweight) /* dW^T (i x o) += inp^T (i x n) . (dout^T (o x n))^T */
		FLOW_TRY(gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_T, in_dim, out_dim,
				   n, flow_cuda__bf16(inp), in_dim, g, out_dim,
				   1.0f, dweight, CUDA_R_32F, in_dim, diag),
			 out);
out:
	return err;
}
