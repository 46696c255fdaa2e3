/* Causal attention through cuDNN's fused scaled-dot-product attention: the
 * forward and backward graphs of cuDNN's backend API, the plans built for
 * them (once per thread, device and size), and their execution.
 * attention_cudnn.h says when it runs and when it declines.
 *
 * The graphs are the pattern cuDNN's fused flash-attention engines match,
 * as NVIDIA's C++ frontend (1.10 and later) builds it for a causal,
 * top-left aligned SDPA with stats and no bias or dropout:
 *
 *   forward:  S = Q K^T; S *= scale; S = causal ? S : -inf (row >= col);
 *             M = max S; E = exp(S - M); Z = sum E; stats = M + log Z;
 *             P = E / Z (bf16); O = P V
 *   backward: D = sum(dO * O) * 1 (rowsum, kept in softmax_sum);
 *             S = scale Q K^T - stats, masked as forward; P = exp(S);
 *             dV = P^T dO; dS = scale P (dO V^T - D); dK = dS^T Q;
 *             dQ = dS K
 *
 * Determinism: on Hopper and Ampere it comes from the backward graph's
 * form, the one without a fp32 dQ accumulator (which engines fill with
 * atomic adds), the frontend's deterministic algorithm.  Engine configs
 * whose numerical notes say NONDETERMINISTIC would be skipped too (no
 * SDPA engine of cuDNN 9.19 carries that note).  From compute capability
 * 10.0 the deterministic backward needs engine knobs set by hand, so the
 * backward pass declines there.  K^T and V^T are K and V with the last
 * two strides swapped, read in place from the (B,T,3C) layout.  Every
 * descriptor of a plan is kept until the plan goes. */
#include <config.h>

#include <flow/kernels_cuda.h>

#include "attention_cudnn.h"

#ifndef HAVE_CUDNN

bool flow_cuda__cudnn_built(void)
{
	return false;
}

flow_cudnn_plan_t *flow_cuda__cudnn_attention_plan(bool backward, size_t B,
						  size_t T, size_t C,
						  size_t NH)
{
	(void)backward, (void)B, (void)T, (void)C, (void)NH;
	return NULL;
}

static flow_err_t not_built(flow_diag_t *diag, const char *func)
{
	return flow_diag_set(diag, FLOW_ERR_NOTSUP,
			     "%s: this build has no cuDNN", func);
}

flow_err_t flow_cuda__cudnn_attention_forward(flow_cudnn_plan_t *plan,
					      void *o, float *lse,
					      const void *qkv,
					      flow_diag_t *diag,
					      cudaStream_t stream)
{
	(void)plan, (void)o, (void)lse, (void)qkv, (void)stream;
	return not_built(diag, __func__);
}

flow_err_t flow_cuda__cudnn_attention_backward(
	flow_cudnn_plan_t *plan, void *dqkv, float *softmax_sum,
	const void *qkv, const void *o, const void *dout, const float *lse,
	flow_diag_t *diag, cudaStream_t stream)
{
	(void)plan, (void)dqkv, (void)softmax_sum, (void)qkv, (void)o;
	(void)dout, (void)lse, (void)stream;
	return not_built(diag, __func__);
}

void flow_cuda__cudnn_release_thread(void)
{
}

const char *flow_cuda__cudnn_declined_why(void)
{
	return "this build has no cuDNN (configure did not find cudnn.h)";
}

flow_err_t flow_cuda_attention_cudnn_check(size_t B, size_t T, size_t C,
					   size_t NH, const char *device_json,
					   flow_diag_t *diag)
{
	(void)B, (void)T, (void)C, (void)NH, (void)device_json;
	return not_built(diag, __func__);
}

#else

#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn_graph.h>

#define STR2(x) #x
#define STR(x) STR2(x)

bool flow_cuda__cudnn_built(void)
{
	return true;
}

/* ---- the library, opened on first use ------------------------------------ */

static struct {
	void *lib;
	void *nvrtc; /* NVRTC, for cuDNN's plans (nvrtc_open) */
	size_t version;
	size_t (*get_version)(void);
	const char *(*error_string)(cudnnStatus_t);
	void (*last_error)(char *, size_t);
	cudnnStatus_t (*create)(cudnnHandle_t *);
	cudnnStatus_t (*destroy)(cudnnHandle_t);
	cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
	cudnnStatus_t (*create_desc)(cudnnBackendDescriptorType_t,
				     cudnnBackendDescriptor_t *);
	cudnnStatus_t (*destroy_desc)(cudnnBackendDescriptor_t);
	cudnnStatus_t (*set_attr)(cudnnBackendDescriptor_t,
				  cudnnBackendAttributeName_t,
				  cudnnBackendAttributeType_t, int64_t,
				  const void *);
	cudnnStatus_t (*get_attr)(cudnnBackendDescriptor_t const,
				  cudnnBackendAttributeName_t,
				  cudnnBackendAttributeType_t, int64_t,
				  int64_t *, void *);
	cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
	cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t,
				 cudnnBackendDescriptor_t);
} cudnn;

/* Why cuDNN is not there, when it is not, and "9.19.0" for the loaded
 * library's 91900: written once, by cudnn_open. */
static char cudnn_absent[256];
static char cudnn_version[32];
static pthread_once_t cudnn_once = PTHREAD_ONCE_INIT;

/* The major version this file was written against names the library:
 * cuDNN keeps its API within a major version. */
#define CUDNN_SONAME "libcudnn.so." STR(CUDNN_MAJOR)

static void *cudnn_sym(const char *name)
{
	void *f = dlsym(cudnn.lib, name);

	if (!f && !cudnn_absent[0])
		snprintf(cudnn_absent, sizeof(cudnn_absent),
			 "%s has no %s", CUDNN_SONAME, name);
	return f;
}

/* cuDNN's runtime-compiled engines, its fused attention among them, open
 * NVRTC by soname when a plan is built, from their own folder or the
 * loader's path.  Opened here first, through this module's run path (the
 * CUDA it was built against), it is found wherever that CUDA is, also when
 * cuDNN came from elsewhere (a wheel's folder, through links).  Kept open;
 * where it is not found cuDNN may still find it, or says so. */
static void nvrtc_open(void)
{
	char soname[32];

	snprintf(soname, sizeof(soname), "libnvrtc.so.%d",
		 CUDART_VERSION / 1000);
	cudnn.nvrtc = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
}

static void cudnn_open(void)
{
	const char *env = getenv("FLOW_CUDNN");

	if (env && strcmp(env, "0") == 0) {
		snprintf(cudnn_absent, sizeof(cudnn_absent),
			 "turned off by FLOW_CUDNN=0");
		return;
	}
	nvrtc_open();
	cudnn.lib = dlopen(CUDNN_SONAME, RTLD_NOW | RTLD_LOCAL);
	if (!cudnn.lib) {
		snprintf(cudnn_absent, sizeof(cudnn_absent), "%s", dlerror());
		return;
	}
#define SYM(field, name) \
	(*(void **)&cudnn.field = cudnn_sym(name), cudnn.field != NULL)
	if (!(SYM(get_version, "cudnnGetVersion") &&
	      SYM(error_string, "cudnnGetErrorString") &&
	      SYM(last_error, "cudnnGetLastErrorString") &&
	      SYM(create, "cudnnCreate") && SYM(destroy, "cudnnDestroy") &&
	      SYM(set_stream, "cudnnSetStream") &&
	      SYM(create_desc, "cudnnBackendCreateDescriptor") &&
	      SYM(destroy_desc, "cudnnBackendDestroyDescriptor") &&
	      SYM(set_attr, "cudnnBackendSetAttribute") &&
	      SYM(get_attr, "cudnnBackendGetAttribute") &&
	      SYM(finalize, "cudnnBackendFinalize") &&
	      SYM(execute, "cudnnBackendExecute")))
		goto fail;
#undef SYM
	cudnn.version = cudnn.get_version();
	snprintf(cudnn_version, sizeof(cudnn_version), "%zu.%zu.%zu",
		 cudnn.version / 10000, cudnn.version / 100 % 100,
		 cudnn.version % 100);
	/* 9.0 and later: the fused backward without a dQ accumulator, and
	 * the major version this file was built for. */
	if (cudnn.version / 10000 != CUDNN_MAJOR || cudnn.version < 90000) {
		snprintf(cudnn_absent, sizeof(cudnn_absent),
			 "%s is version %zu, not %d.x (9.0 or later)",
			 CUDNN_SONAME, cudnn.version, CUDNN_MAJOR);
		goto fail;
	}
	return;
fail:
	dlclose(cudnn.lib);
	cudnn.lib = NULL;
}

/* The library, or NULL with cudnn_absent saying why. */
static bool cudnn_loaded(void)
{
	pthread_once(&cudnn_once, cudnn_open);
	return cudnn.lib != NULL;
}

/* ---- plans, per thread --------------------------------------------------- */

/* Non-virtual tensors by role; virtual ones are numbered from UID_VIRTUAL. */
enum {
	UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK,
	UID_DV, UID_SOFTMAX_SUM, UID_SCALE, UID_ONE, UID_NEG_INF,
	UID_VIRTUAL = 100
};

#define PLAN_DESCS 192 /* the backward graph's 65, its plan's up to 50 */
#define PLAN_OPS 40
#define PLANS 16       /* sizes a run takes: one or two per pass */
/* Larger plans decline: the deterministic backward's workspace grows as
 * B NH T^2 (by NVIDIA's frontend's formula, B NH T^2 2 bytes, 1.6 GB for
 * GPT-2 124M at batch 64, T 1024; not measured). */
#define CUDNN_WORKSPACE_MAX ((int64_t)4 << 30)

struct flow_cudnn_plan {
	int device;
	bool backward;
	size_t B, T, C, NH;
	bool built;       /* false: cuDNN declined, why says so */
	char why[512];
	cudnnHandle_t handle;
	cudnnBackendDescriptor_t exec_plan;
	int64_t workspace;
	cudnnBackendDescriptor_t descs[PLAN_DESCS];
	int ndescs;
};

static _Thread_local struct flow_cudnn_plan plans[PLANS];
static _Thread_local int nplans;
static _Thread_local cudnnHandle_t handles[64];
/* The last reason cuDNN declined, for the GPU test's report. */
static _Thread_local char declined_why[544];

const char *flow_cuda__cudnn_declined_why(void)
{
	if (!cudnn_loaded())
		return cudnn_absent;
	return declined_why;
}

static void plan_free(struct flow_cudnn_plan *p)
{
	for (int i = p->ndescs - 1; i >= 0; i--)
		(void)cudnn.destroy_desc(p->descs[i]);
	memset(p, 0, sizeof(*p));
}

void flow_cuda__cudnn_release_thread(void)
{
	int saved = -1;
	bool have_saved = cudaGetDevice(&saved) == cudaSuccess;

	for (int i = 0; i < nplans; i++)
		plan_free(&plans[i]);
	nplans = 0;
	for (int dev = 0; dev < 64; dev++) {
		if (!handles[dev])
			continue;
		if (cudaSetDevice(dev) == cudaSuccess)
			(void)cudnn.destroy(handles[dev]);
		handles[dev] = NULL;
	}
	if (have_saved)
		(void)cudaSetDevice(saved);
}

/* ---- building a graph ---------------------------------------------------- */

/* Records the first failure and turns every later step into a no-op, so a
 * graph reads as a list of ops. */
struct builder {
	struct flow_cudnn_plan *p;
	cudnnStatus_t status;
	char failed[320];
	int64_t next_uid;
	cudnnBackendDescriptor_t ops[PLAN_OPS];
	int nops;
};

static void fail(struct builder *b, cudnnStatus_t s, const char *what)
{
	char detail[256] = "";

	if (b->status != CUDNN_STATUS_SUCCESS)
		return;
	/* A refusal cuDNN did not report (no engine config came back) is
	 * still one; its last error would be about something else. */
	if (s == CUDNN_STATUS_SUCCESS)
		s = CUDNN_STATUS_NOT_SUPPORTED;
	else
		cudnn.last_error(detail, sizeof(detail));
	b->status = s;
	snprintf(b->failed, sizeof(b->failed), "%s: %s%s%s", what,
		 cudnn.error_string(s), detail[0] ? ": " : "", detail);
}

static bool ok(const struct builder *b)
{
	return b->status == CUDNN_STATUS_SUCCESS;
}

static cudnnBackendDescriptor_t make(struct builder *b,
				     cudnnBackendDescriptorType_t type,
				     const char *what)
{
	cudnnBackendDescriptor_t d = NULL;
	cudnnStatus_t s;

	if (!ok(b))
		return NULL;
	if (b->p->ndescs == PLAN_DESCS) {
		fail(b, CUDNN_STATUS_INTERNAL_ERROR, "too many descriptors");
		return NULL;
	}
	if ((s = cudnn.create_desc(type, &d)) != CUDNN_STATUS_SUCCESS) {
		fail(b, s, what);
		return NULL;
	}
	b->p->descs[b->p->ndescs++] = d;
	return d;
}

static void set(struct builder *b, cudnnBackendDescriptor_t d,
		cudnnBackendAttributeName_t name,
		cudnnBackendAttributeType_t type, int64_t n, const void *v,
		const char *what)
{
	cudnnStatus_t s;

	if (ok(b) && (s = cudnn.set_attr(d, name, type, n, v)) !=
			     CUDNN_STATUS_SUCCESS)
		fail(b, s, what);
}

static void set_desc(struct builder *b, cudnnBackendDescriptor_t d,
		     cudnnBackendAttributeName_t name,
		     cudnnBackendDescriptor_t v, const char *what)
{
	set(b, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

static void finish(struct builder *b, cudnnBackendDescriptor_t d,
		   const char *what)
{
	cudnnStatus_t s;

	if (ok(b) && (s = cudnn.finalize(d)) != CUDNN_STATUS_SUCCESS)
		fail(b, s, what);
}

static void add_op(struct builder *b, cudnnBackendDescriptor_t op)
{
	if (!ok(b))
		return;
	if (b->nops == PLAN_OPS) {
		fail(b, CUDNN_STATUS_INTERNAL_ERROR, "too many operations");
		return;
	}
	b->ops[b->nops++] = op;
}

/* A 4-D tensor; uid 0 makes it virtual (an intermediate cuDNN keeps to
 * itself) with the next free uid; by_value, a scalar the variant pack
 * points at in host memory. */
static cudnnBackendDescriptor_t tensor_of(struct builder *b, int64_t uid,
					  cudnnDataType_t type,
					  const int64_t dims[4],
					  const int64_t strides[4],
					  bool by_value)
{
	cudnnBackendDescriptor_t t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR,
					  "tensor descriptor");
	bool is_virtual = uid == 0;
	int64_t align = 16;

	if (is_virtual)
		uid = b->next_uid++;
	set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type,
	    "tensor data type");
	set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims,
	    "tensor dimensions");
	set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides,
	    "tensor strides");
	set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid,
	    "tensor uid");
	set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1,
	    &align, "tensor alignment");
	set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1,
	    &is_virtual, "tensor virtual flag");
	if (by_value)
		set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1,
		    &by_value, "tensor by-value flag");
	finish(b, t, "tensor");
	return t;
}

static cudnnBackendDescriptor_t tensor(struct builder *b, int64_t uid,
				       cudnnDataType_t type,
				       const int64_t dims[4],
				       const int64_t strides[4])
{
	return tensor_of(b, uid, type, dims, strides, false);
}

/* A float passed by value at execution. */
static cudnnBackendDescriptor_t scalar(struct builder *b, int64_t uid)
{
	static const int64_t one[4] = { 1, 1, 1, 1 };

	return tensor_of(b, uid, CUDNN_DATA_FLOAT, one, one, true);
}

/* y = mode(x[, b2[, t]]) computed in prec; axis only for GEN_INDEX. */
static void pointwise(struct builder *b, cudnnPointwiseMode_t mode,
		      cudnnDataType_t prec, cudnnBackendDescriptor_t x,
		      cudnnBackendDescriptor_t b2, cudnnBackendDescriptor_t t,
		      cudnnBackendDescriptor_t y, int64_t axis)
{
	cudnnBackendDescriptor_t pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR,
					   "pointwise descriptor");
	cudnnBackendDescriptor_t op;
	float alpha = 1.0f;

	set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1,
	    &mode, "pointwise mode");
	set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1,
	    &prec, "pointwise precision");
	if (mode == CUDNN_POINTWISE_GEN_INDEX)
		set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1,
		    &axis, "index axis");
	finish(b, pw, "pointwise descriptor");
	op = make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
		  "pointwise operation");
	set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw,
		 "pointwise operation's descriptor");
	set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x,
		 "pointwise input");
	if (b2)
		set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b2,
			 "pointwise second input");
	if (t)
		set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t,
			 "pointwise condition");
	set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y,
		 "pointwise output");
	set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1,
	    &alpha, "pointwise alpha1");
	set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1,
	    &alpha, "pointwise alpha2");
	finish(b, op, "pointwise operation");
	add_op(b, op);
}

/* y (last dimension 1) = the max or sum of x along its last dimension. */
static void reduction(struct builder *b, cudnnReduceTensorOp_t how,
		      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
	cudnnBackendDescriptor_t r = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR,
					  "reduction descriptor");
	cudnnBackendDescriptor_t op;
	cudnnDataType_t prec = CUDNN_DATA_FLOAT;

	set(b, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
	    &prec, "reduction precision");
	set(b, r, CUDNN_ATTR_REDUCTION_OPERATOR,
	    CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, "reduction operator");
	finish(b, r, "reduction descriptor");
	op = make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
		  "reduction operation");
	set_desc(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r,
		 "reduction operation's descriptor");
	set_desc(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x,
		 "reduction input");
	set_desc(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y,
		 "reduction output");
	finish(b, op, "reduction operation");
	add_op(b, op);
}

/* c = a . b over the last two dimensions, batched over the first two,
 * summed in fp32. */
static void matmul(struct builder *b, cudnnBackendDescriptor_t a,
		   cudnnBackendDescriptor_t b2, cudnnBackendDescriptor_t c)
{
	cudnnBackendDescriptor_t mm = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR,
					   "matmul descriptor");
	cudnnBackendDescriptor_t op;
	cudnnDataType_t prec = CUDNN_DATA_FLOAT;

	set(b, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
	    &prec, "matmul precision");
	finish(b, mm, "matmul descriptor");
	op = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
		  "matmul operation");
	set_desc(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul A");
	set_desc(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b2, "matmul B");
	set_desc(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul C");
	set_desc(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm,
		 "matmul operation's descriptor");
	finish(b, op, "matmul operation");
	add_op(b, op);
}

/* y: x's elements under other strides (a transposed view). */
static void reshape(struct builder *b, cudnnBackendDescriptor_t x,
		    cudnnBackendDescriptor_t y)
{
	cudnnBackendDescriptor_t op =
		make(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
		     "reshape operation");

	set_desc(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x,
		 "reshape input");
	set_desc(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y,
		 "reshape output");
	finish(b, op, "reshape operation");
	add_op(b, op);
}

/* ---- the two graphs ------------------------------------------------------ */

/* Shapes and strides of one graph's tensors, in elements. */
struct shapes {
	int64_t bhsd[4], bhds[4], bhss[4], bhs1[4];
	int64_t qkv[4];      /* q, k, v (and dq, dk, dv) in (B,T,3C) */
	int64_t qkv_t[4];    /* k^T, v^T: the last two swapped */
	int64_t btc[4];      /* o, dout in (B,T,C) */
	int64_t scores[4];   /* (B,NH,T,T) row-major */
	int64_t scores_t[4]; /* the same elements, transposed */
	int64_t rows[4];     /* (B,NH,T,1) */
	int64_t do_o[4];     /* dout * o, as the fused pattern lays it out */
};

static struct shapes shapes_of(size_t B, size_t T, size_t C, size_t NH)
{
	const int64_t b = (int64_t)B, t = (int64_t)T, c = (int64_t)C,
		      h = (int64_t)NH, d = c / h;
	struct shapes s = {
		.bhsd = { b, h, t, d },
		.bhds = { b, h, d, t },
		.bhss = { b, h, t, t },
		.bhs1 = { b, h, t, 1 },
		.qkv = { t * 3 * c, d, 3 * c, 1 },
		.qkv_t = { t * 3 * c, d, 1, 3 * c },
		.btc = { t * c, d, c, 1 },
		.scores = { h * t * t, t * t, t, 1 },
		.scores_t = { h * t * t, t * t, 1, t },
		.rows = { h * t, t, 1, 1 },
		.do_o = { h * t * d, t * d, h * d, 1 },
	};
	return s;
}

/* S = scale Q K^T. */
static cudnnBackendDescriptor_t scores(struct builder *b,
				       const struct shapes *s,
				       cudnnBackendDescriptor_t q,
				       cudnnBackendDescriptor_t kt,
				       cudnnBackendDescriptor_t scale)
{
	const cudnnDataType_t F = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t raw = tensor(b, 0, F, s->bhss, s->scores);
	cudnnBackendDescriptor_t scaled = tensor(b, 0, F, s->bhss, s->scores);

	matmul(b, q, kt, raw);
	pointwise(b, CUDNN_POINTWISE_MUL, F, raw, scale, NULL, scaled, 0);
	return scaled;
}

/* x with the causal mask: columns past the row (col > row) are -inf. */
static cudnnBackendDescriptor_t causal(struct builder *b,
				       const struct shapes *s,
				       cudnnBackendDescriptor_t x,
				       cudnnBackendDescriptor_t neg_inf)
{
	const cudnnDataType_t F = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t row =
		tensor(b, 0, CUDNN_DATA_INT32, s->bhss, s->scores);
	cudnnBackendDescriptor_t col =
		tensor(b, 0, CUDNN_DATA_INT32, s->bhss, s->scores);
	cudnnBackendDescriptor_t keep =
		tensor(b, 0, CUDNN_DATA_BOOLEAN, s->bhss, s->scores);
	cudnnBackendDescriptor_t masked = tensor(b, 0, F, s->bhss, s->scores);

	pointwise(b, CUDNN_POINTWISE_GEN_INDEX, F, x, NULL, NULL, row, 2);
	pointwise(b, CUDNN_POINTWISE_GEN_INDEX, F, x, NULL, NULL, col, 3);
	pointwise(b, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL,
		  keep, 0);
	pointwise(b, CUDNN_POINTWISE_BINARY_SELECT, F, x, neg_inf, keep, masked,
		  0);
	return masked;
}

static void forward_graph(struct builder *b, const struct shapes *s)
{
	const cudnnDataType_t F = CUDNN_DATA_FLOAT, H = CUDNN_DATA_BFLOAT16;
	cudnnBackendDescriptor_t q = tensor(b, UID_Q, H, s->bhsd, s->qkv);
	cudnnBackendDescriptor_t kt = tensor(b, UID_K, H, s->bhds, s->qkv_t);
	cudnnBackendDescriptor_t v = tensor(b, UID_V, H, s->bhsd, s->qkv);
	cudnnBackendDescriptor_t o = tensor(b, UID_O, H, s->bhsd, s->btc);
	cudnnBackendDescriptor_t stats =
		tensor(b, UID_STATS, F, s->bhs1, s->rows);
	cudnnBackendDescriptor_t scale = scalar(b, UID_SCALE);
	cudnnBackendDescriptor_t neg_inf = scalar(b, UID_NEG_INF);
	cudnnBackendDescriptor_t sc =
		causal(b, s, scores(b, s, q, kt, scale), neg_inf);
	cudnnBackendDescriptor_t mx = tensor(b, 0, F, s->bhs1, s->rows);
	cudnnBackendDescriptor_t centred = tensor(b, 0, F, s->bhss, s->scores);
	cudnnBackendDescriptor_t e = tensor(b, 0, F, s->bhss, s->scores);
	cudnnBackendDescriptor_t z = tensor(b, 0, F, s->bhs1, s->rows);
	cudnnBackendDescriptor_t log_z = tensor(b, 0, F, s->bhs1, s->rows);
	cudnnBackendDescriptor_t p = tensor(b, 0, H, s->bhss, s->scores);

	reduction(b, CUDNN_REDUCE_TENSOR_MAX, sc, mx);
	pointwise(b, CUDNN_POINTWISE_SUB, F, sc, mx, NULL, centred, 0);
	pointwise(b, CUDNN_POINTWISE_EXP, F, centred, NULL, NULL, e, 0);
	reduction(b, CUDNN_REDUCE_TENSOR_ADD, e, z);
	pointwise(b, CUDNN_POINTWISE_LOG, F, z, NULL, NULL, log_z, 0);
	pointwise(b, CUDNN_POINTWISE_ADD, F, mx, log_z, NULL, stats, 0);
	pointwise(b, CUDNN_POINTWISE_DIV, F, e, z, NULL, p, 0);
	matmul(b, p, v, o);
}

static void backward_graph(struct builder *b, const struct shapes *s)
{
	const cudnnDataType_t F = CUDNN_DATA_FLOAT, H = CUDNN_DATA_BFLOAT16;
	cudnnBackendDescriptor_t q = tensor(b, UID_Q, H, s->bhsd, s->qkv);
	cudnnBackendDescriptor_t kt = tensor(b, UID_K, H, s->bhds, s->qkv_t);
	cudnnBackendDescriptor_t vt = tensor(b, UID_V, H, s->bhds, s->qkv_t);
	cudnnBackendDescriptor_t o = tensor(b, UID_O, H, s->bhsd, s->btc);
	cudnnBackendDescriptor_t dout = tensor(b, UID_DO, H, s->bhsd, s->btc);
	cudnnBackendDescriptor_t stats =
		tensor(b, UID_STATS, F, s->bhs1, s->rows);
	cudnnBackendDescriptor_t dq = tensor(b, UID_DQ, H, s->bhsd, s->qkv);
	cudnnBackendDescriptor_t dk = tensor(b, UID_DK, H, s->bhsd, s->qkv);
	cudnnBackendDescriptor_t dv = tensor(b, UID_DV, H, s->bhsd, s->qkv);
	cudnnBackendDescriptor_t rowsum =
		tensor(b, UID_SOFTMAX_SUM, F, s->bhs1, s->rows);
	cudnnBackendDescriptor_t scale = scalar(b, UID_SCALE);
	cudnnBackendDescriptor_t one = scalar(b, UID_ONE);
	cudnnBackendDescriptor_t neg_inf = scalar(b, UID_NEG_INF);
	cudnnBackendDescriptor_t do_o = tensor(b, 0, F, s->bhsd, s->do_o);
	cudnnBackendDescriptor_t do_o_sum = tensor(b, 0, F, s->bhs1, s->rows);

	/* D = rowsum(dout * o), times the (absent) dropout's 1. */
	pointwise(b, CUDNN_POINTWISE_MUL, F, dout, o, NULL, do_o, 0);
	reduction(b, CUDNN_REDUCE_TENSOR_ADD, do_o, do_o_sum);
	pointwise(b, CUDNN_POINTWISE_MUL, F, do_o_sum, one, NULL, rowsum, 0);

	/* P = exp(causal(S - stats)); dV = P^T dout. */
	cudnnBackendDescriptor_t sc = scores(b, s, q, kt, scale);
	cudnnBackendDescriptor_t centred = tensor(b, 0, F, s->bhss, s->scores);
	cudnnBackendDescriptor_t p = tensor(b, 0, F, s->bhss, s->scores);
	cudnnBackendDescriptor_t pt = tensor(b, 0, H, s->bhss, s->scores_t);

	pointwise(b, CUDNN_POINTWISE_SUB, F, sc, stats, NULL, centred, 0);
	pointwise(b, CUDNN_POINTWISE_EXP, F, causal(b, s, centred, neg_inf),
		  NULL, NULL, p, 0);
	reshape(b, p, pt);
	matmul(b, pt, dout, dv);

	/* dS = scale P (dout V^T - D); dK = dS^T Q; dQ = dS K. */
	cudnnBackendDescriptor_t dp = tensor(b, 0, F, s->bhss, s->scores);
	cudnnBackendDescriptor_t dp_d = tensor(b, 0, F, s->bhss, s->scores);
	cudnnBackendDescriptor_t ds_raw = tensor(b, 0, F, s->bhss, s->scores);
	cudnnBackendDescriptor_t ds = tensor(b, 0, F, s->bhss, s->scores);
	cudnnBackendDescriptor_t dst = tensor(b, 0, H, s->bhss, s->scores_t);
	cudnnBackendDescriptor_t k = tensor(b, 0, H, s->bhsd, s->qkv);

	matmul(b, dout, vt, dp);
	pointwise(b, CUDNN_POINTWISE_SUB, F, dp, rowsum, NULL, dp_d, 0);
	pointwise(b, CUDNN_POINTWISE_MUL, F, dp_d, p, NULL, ds_raw, 0);
	pointwise(b, CUDNN_POINTWISE_MUL, F, ds_raw, scale, NULL, ds, 0);
	reshape(b, ds, dst);
	matmul(b, dst, q, dk);
	reshape(b, kt, k);
	matmul(b, ds, k, dq);
}

/* Whether the engine of cfg promises the same bits every run. */
static bool deterministic(struct builder *b, cudnnBackendDescriptor_t cfg)
{
	cudnnBackendDescriptor_t engine =
		make(b, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine descriptor");
	cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
	int64_t n = 0;

	if (!ok(b) ||
	    cudnn.get_attr(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
			   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
			   &engine) != CUDNN_STATUS_SUCCESS ||
	    cudnn.get_attr(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
			   CUDNN_TYPE_NUMERICAL_NOTE,
			   CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n,
			   notes) != CUDNN_STATUS_SUCCESS)
		return false;
	for (int64_t i = 0; i < n; i++)
		if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)
			return false;
	return true;
}

#define HEUR_CONFIGS 16

/* The operation graph of b's ops and cuDNN's heuristics for it: for the
 * handle's device, or, without a handle, for the device devprop
 * describes. */
static cudnnBackendDescriptor_t heuristics(struct builder *b,
					   cudnnHandle_t handle,
					   cudnnBackendDescriptor_t devprop)
{
	cudnnBackendDescriptor_t graph =
		make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
	cudnnBackendDescriptor_t heur;
	cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;

	if (handle)
		set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
		    CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
	set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
	    CUDNN_TYPE_BACKEND_DESCRIPTOR, b->nops, b->ops, "graph ops");
	finish(b, graph, "operation graph");
	heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
	set_desc(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph,
		 "heuristics' graph");
	set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1,
	    &mode, "heuristics mode");
	if (devprop)
		set_desc(b, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, devprop,
			 "heuristics' device");
	finish(b, heur, "heuristics");
	return heur;
}

/* The engine configs the heuristics offer for b's graph on the handle's
 * device, best first, into cfgs.  Returns how many (0 with b failed when
 * none). */
static int64_t engine_configs(struct builder *b, cudnnHandle_t handle,
			      cudnnBackendDescriptor_t cfgs[HEUR_CONFIGS])
{
	cudnnBackendDescriptor_t heur = heuristics(b, handle, NULL);
	int64_t ncfgs = 0;
	cudnnStatus_t s;

	for (int i = 0; i < HEUR_CONFIGS; i++)
		cfgs[i] = make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
			       "engine config");
	if (!ok(b))
		return 0;
	s = cudnn.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
			   CUDNN_TYPE_BACKEND_DESCRIPTOR, HEUR_CONFIGS, &ncfgs,
			   cfgs);
	if (s != CUDNN_STATUS_SUCCESS || ncfgs <= 0) {
		fail(b, s, "the heuristics offered no engine config");
		return 0;
	}
	return ncfgs < HEUR_CONFIGS ? ncfgs : HEUR_CONFIGS;
}

/* The first deterministic engine config the heuristics offer that builds
 * a plan for the graph of b's ops; declined, the plan is left NULL and b
 * failed. */
static void plan_graph(struct builder *b, cudnnHandle_t handle)
{
	cudnnBackendDescriptor_t cfgs[HEUR_CONFIGS];
	int64_t ncfgs = engine_configs(b, handle, cfgs);
	cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;

	for (int64_t i = 0; i < ncfgs && ok(b); i++) {
		cudnnBackendDescriptor_t plan;
		int64_t got = 0;

		if (!deterministic(b, cfgs[i]))
			continue;
		plan = make(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
			    "execution plan");
		set(b, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
		    CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
		set_desc(b, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
			 cfgs[i], "plan's engine config");
		if (!ok(b))
			return;
		last = cudnn.finalize(plan);
		if (last != CUDNN_STATUS_SUCCESS)
			continue; /* the next config may build */
		if ((last = cudnn.get_attr(
			     plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
			     CUDNN_TYPE_INT64, 1, &got,
			     &b->p->workspace)) != CUDNN_STATUS_SUCCESS) {
			fail(b, last, "plan's workspace size");
			return;
		}
		if (b->p->workspace > CUDNN_WORKSPACE_MAX) {
			fail(b, CUDNN_STATUS_NOT_SUPPORTED,
			     "the plan wants more than 4 GiB of workspace");
			return;
		}
		b->p->exec_plan = plan;
		return;
	}
	if (ok(b))
		fail(b, last, "no deterministic engine config built a plan");
}

/* The calling thread's cuDNN handle for its current device. */
static cudnnHandle_t handle_of(int device, char *why, size_t cap)
{
	cudnnStatus_t s;

	if (device < 0 || device >= 64) {
		snprintf(why, cap, "device %d is beyond 64", device);
		return NULL;
	}
	if (!handles[device] &&
	    (s = cudnn.create(&handles[device])) != CUDNN_STATUS_SUCCESS) {
		snprintf(why, cap, "cudnnCreate: %s", cudnn.error_string(s));
		handles[device] = NULL;
	}
	return handles[device];
}

/* Whether the device's compute capability suits the fused engines: 8.0
 * or later, and for the backward pass before 10.0, where cuDNN's
 * deterministic backward takes engine knobs its heuristics do not pick
 * (NVIDIA's frontend sets them by hand) and this file does not set. */
static bool device_takes(int device, bool backward, char *why, size_t cap)
{
	int major = 0, minor = 0;

	if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
				   device) != cudaSuccess ||
	    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
				   device) != cudaSuccess) {
		(void)cudaGetLastError();
		snprintf(why, cap, "no compute capability for device %d",
			 device);
		return false;
	}
	if (major < 8 || (backward && major >= 10)) {
		snprintf(why, cap,
			 "cuDNN's fused %s attention is not used on compute "
			 "capability %d.%d (%s)",
			 backward ? "backward" : "forward", major, minor,
			 major < 8 ? "8.0 or later"
				   : "deterministic only before 10.0 here");
		return false;
	}
	return true;
}

/* The plan for these sizes, built (or declined) on first use. */
static struct flow_cudnn_plan *plan_for(bool backward, size_t B, size_t T, size_t C,
			     size_t NH)
{
	struct flow_cudnn_plan *p;
	struct builder b = { .status = CUDNN_STATUS_SUCCESS,
			     .next_uid = UID_VIRTUAL };
	struct shapes s;
	int device = -1;

	if (cudaGetDevice(&device) != cudaSuccess) {
		(void)cudaGetLastError();
		return NULL;
	}
	for (int i = 0; i < nplans; i++) {
		p = &plans[i];
		if (p->device == device && p->backward == backward &&
		    p->B == B && p->T == T && p->C == C && p->NH == NH)
			return p;
	}
	if (nplans == PLANS) /* a run of many sizes: start again */
		flow_cuda__cudnn_release_thread();
	p = &plans[nplans++];
	*p = (struct flow_cudnn_plan){ .device = device, .backward = backward, .B = B,
			    .T = T, .C = C, .NH = NH };
	if (!device_takes(device, backward, p->why, sizeof(p->why)))
		return p;
	p->handle = handle_of(device, p->why, sizeof(p->why));
	if (!p->handle)
		return p;
	b.p = p;
	s = shapes_of(B, T, C, NH);
	if (backward)
		backward_graph(&b, &s);
	else
		forward_graph(&b, &s);
	plan_graph(&b, p->handle);
	if (ok(&b) && p->exec_plan) {
		p->built = true;
	} else {
		snprintf(p->why, sizeof(p->why),
			 "cuDNN %s declined the %s graph (B=%zu T=%zu C=%zu "
			 "NH=%zu): %s",
			 cudnn_version, backward ? "backward" : "forward", B, T,
			 C, NH, b.failed);
		/* Only the reason is kept. */
		for (int i = p->ndescs - 1; i >= 0; i--)
			(void)cudnn.destroy_desc(p->descs[i]);
		p->ndescs = 0;
	}
	return p;
}

/* ---- the graphs without a device ------------------------------------------ */

/* The device a JSON text describes (cuDNN's device properties), for the
 * heuristics of a machine without it. */
static cudnnBackendDescriptor_t described_device(struct builder *b,
						 const char *json)
{
	cudnnBackendDescriptor_t d = make(b, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR,
					  "device properties");

	set(b, d, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
	    (int64_t)strlen(json), json, "device description");
	finish(b, d, "device properties");
	return d;
}

/* b failed unless the operation graph of b's ops finalizes and the
 * heuristics count an engine config for it on the described device.
 * Without a driver they count the configs but hand none back (a config
 * compiles its kernel), so the count is what a machine without a GPU can
 * check. */
static void heuristics_match(struct builder *b, const char *json)
{
	cudnnBackendDescriptor_t heur =
		heuristics(b, NULL, described_device(b, json));
	int64_t n = 0;
	cudnnStatus_t s;

	if (!ok(b))
		return;
	s = cudnn.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
			   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL);
	if (s != CUDNN_STATUS_SUCCESS || n <= 0)
		fail(b, s, "the heuristics count no engine config for the "
			   "described device");
}

flow_err_t flow_cuda_attention_cudnn_check(size_t B, size_t T, size_t C,
					   size_t NH, const char *device_json,
					   flow_diag_t *diag)
{
	if (B == 0 || T == 0 || NH == 0 || C % NH != 0 || C == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: B=%zu T=%zu C=%zu NH=%zu is no "
				     "attention (C a positive multiple of NH)",
				     __func__, B, T, C, NH);
	if (!cudnn_loaded())
		return flow_diag_set(diag, FLOW_ERR_NOTSUP, "%s: %s", __func__,
				     cudnn_absent);
	for (int backward = 0; backward < 2; backward++) {
		struct flow_cudnn_plan p = { .B = B };
		struct builder b = { .p = &p, .status = CUDNN_STATUS_SUCCESS,
				     .next_uid = UID_VIRTUAL };
		const struct shapes s = shapes_of(B, T, C, NH);
		flow_err_t err = FLOW_OK;

		if (backward)
			backward_graph(&b, &s);
		else
			forward_graph(&b, &s);
		if (device_json)
			heuristics_match(&b, device_json);
		if (!ok(&b))
			err = flow_diag_set(diag, FLOW_ERR_DEVICE,
					    "cuDNN %s: the %s graph (B=%zu "
					    "T=%zu C=%zu NH=%zu): %s",
					    cudnn_version,
					    backward ? "backward" : "forward",
					    B, T, C, NH, b.failed);
		plan_free(&p);
		if (err != FLOW_OK)
			return err;
	}
	return FLOW_OK;
}

/* ---- execution ----------------------------------------------------------- */

flow_cudnn_plan_t *flow_cuda__cudnn_attention_plan(bool backward, size_t B,
						  size_t T, size_t C,
						  size_t NH)
{
	struct flow_cudnn_plan *p;

	if (!cudnn_loaded()) {
		snprintf(declined_why, sizeof(declined_why), "%s",
			 cudnn_absent);
		return NULL;
	}
	/* cuDNN's fused kernels want head sizes a multiple of 8, at most 128
	 * on every architecture they run on, and 32-bit sequence indices. */
	if (NH == 0 || C % NH != 0 || (C / NH) % 8 != 0 || C / NH > 128 ||
	    T > INT32_MAX || B > INT32_MAX) {
		snprintf(declined_why, sizeof(declined_why),
			 "head size %zu (C=%zu, NH=%zu) or T=%zu is outside "
			 "cuDNN's fused attention (a multiple of 8, at most "
			 "128)",
			 NH ? C / NH : 0, C, NH, T);
		return NULL;
	}
	p = plan_for(backward, B, T, C, NH);
	if (!p || !p->built) {
		snprintf(declined_why, sizeof(declined_why), "%s",
			 p ? p->why : "no current CUDA device");
		return NULL;
	}
	return p;
}

static flow_err_t run_plan(struct flow_cudnn_plan *p, int n, const int64_t *uids,
			   void *const *ptrs, const char *func,
			   flow_diag_t *diag, cudaStream_t stream)
{
	struct builder b = { .p = p, .status = CUDNN_STATUS_SUCCESS };
	cudnnBackendDescriptor_t pack = NULL;
	void *workspace = NULL;
	cudnnStatus_t s;
	cudaError_t e;
	flow_err_t err = FLOW_OK;
	int keep = p->ndescs;

	/* The workspace comes from the stream-ordered pool, as the other
	 * kernels' temporaries: it is known only once the plan is built. */
	if (p->workspace > 0 &&
	    (e = cudaMallocAsync(&workspace, (size_t)p->workspace, stream)) !=
		    cudaSuccess)
		return flow_diag_set(diag, FLOW_ERR_DEVICE,
				     "%s: %lld bytes of cuDNN workspace: %s",
				     func, (long long)p->workspace,
				     cudaGetErrorString(e));
	if ((s = cudnn.set_stream(p->handle, stream)) != CUDNN_STATUS_SUCCESS) {
		fail(&b, s, "cudnnSetStream");
		goto out;
	}
	pack = make(&b, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
	set(&b, pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
	    uids, "variant pack uids");
	set(&b, pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
	    n, ptrs, "variant pack pointers");
	set(&b, pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
	    &workspace, "variant pack workspace");
	finish(&b, pack, "variant pack");
	if (ok(&b) && (s = cudnn.execute(p->handle, p->exec_plan, pack)) !=
			      CUDNN_STATUS_SUCCESS)
		fail(&b, s, "cudnnBackendExecute");
out:
	/* The pack is per call: it names this call's pointers. */
	while (p->ndescs > keep)
		(void)cudnn.destroy_desc(p->descs[--p->ndescs]);
	if (workspace)
		(void)cudaFreeAsync(workspace, stream);
	if (!ok(&b))
		err = flow_diag_set(diag, FLOW_ERR_DEVICE,
				    "cuDNN call failed in '%s': %s", func,
				    b.failed);
	return err;
}

/* What masked scores become: -inf from cuDNN 9.10 on, the lowest float
 * before (as NVIDIA's frontend passes them). */
static float masked_value(void)
{
	return cudnn.version < 91000 ? -FLT_MAX : -INFINITY;
}

/* The elements of (B,T,3C) head-interleaved q, k and v. */
static const char *at(const void *base, size_t elems)
{
	return (const char *)base + elems * 2; /* bf16 */
}

/* 1/sqrt(head size), the scores' scale. */
static float scale_of(const struct flow_cudnn_plan *p)
{
	return 1.0f / sqrtf((float)(p->C / p->NH));
}

flow_err_t flow_cuda__cudnn_attention_forward(flow_cudnn_plan_t *p, void *o,
					      float *lse, const void *qkv,
					      flow_diag_t *diag,
					      cudaStream_t stream)
{
	const size_t C = p->C;
	float scale = scale_of(p), neg_inf = masked_value();

	{
		const int64_t uids[] = { UID_Q, UID_K, UID_V, UID_O, UID_STATS,
					 UID_SCALE, UID_NEG_INF };
		void *const ptrs[] = { (void *)qkv, (void *)at(qkv, C),
				       (void *)at(qkv, 2 * C), o, lse, &scale,
				       &neg_inf };
		return run_plan(p, 7, uids, ptrs, __func__, diag, stream);
	}
}

flow_err_t flow_cuda__cudnn_attention_backward(
	flow_cudnn_plan_t *p, void *dqkv, float *softmax_sum, const void *qkv,
	const void *o, const void *dout, const float *lse, flow_diag_t *diag,
	cudaStream_t stream)
{
	const size_t C = p->C;
	float scale = scale_of(p), one = 1.0f, neg_inf = masked_value();

	{
		const int64_t uids[] = { UID_Q,  UID_K,	 UID_V,
					 UID_O,  UID_DO, UID_STATS,
					 UID_DQ, UID_DK, UID_DV,
					 UID_SOFTMAX_SUM, UID_SCALE,
					 UID_ONE, UID_NEG_INF };
		void *const ptrs[] = {
			(void *)qkv,	      (void *)at(qkv, C),
			(void *)at(qkv, 2 * C), (void *)o,
			(void *)dout,	      (void *)lse,
			dqkv,		      (void *)at(dqkv, C),
			(void *)at(dqkv, 2 * C), softmax_sum,
			&scale,		      &one,
			&neg_inf
		};
		return run_plan(p, 13, uids, ptrs, __func__, diag, stream);
	}
}

#endif
