/* The BLAS behind the CPU matmul: what it is, which kernels it runs, and
 * which kernels this CPU could run.
 *
 * OpenBLAS picks its kernels once, when it is loaded, from the CPU model it
 * recognises or from OPENBLAS_CORETYPE.  A CPU newer than the OpenBLAS build
 * (Debian bookworm's 0.3.21 does not know Emerald Rapids, for instance) falls
 * back to generic SSE3 kernels that run sgemm 5-10x slower than the AVX-512
 * ones the CPU supports.  The programs use flow_blas_preferred_coretype() to
 * correct that before OpenBLAS is loaded again (see flow_tool_init). */
#ifndef FLOW_BLAS_H
#define FLOW_BLAS_H

#include <flow/common.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flow_blas_info {
	char name[32];    /* "openblas" or "cblas" */
	char config[160]; /* openblas_get_config(), or "" */
	char core[32];    /* kernels in use, openblas_get_corename(); "unknown" */
	int threads;      /* the BLAS's thread count, 0 when unknown */
	char best_core[32]; /* the best kernels for this CPU, "" when unknown */
} flow_blas_info_t;

/* Describe the linked BLAS and this CPU. */
FLOW_EXPORT void flow_blas_get_info(flow_blas_info_t *info_out);

/* The OPENBLAS_CORETYPE value that would give this CPU faster kernels than
 * the ones in use ("SkylakeX" for AVX-512, "Haswell" for AVX2 with FMA), or
 * NULL when the kernels in use are already the best this build offers or the
 * BLAS is not OpenBLAS.  The string is static. */
FLOW_EXPORT const char *flow_blas_preferred_coretype(void);

#ifdef __cplusplus
}
#endif

#endif
