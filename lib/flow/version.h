/* The library's version and the features this build has. */
#ifndef FLOW_VERSION_H
#define FLOW_VERSION_H

#include <flow/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "0.1.0"; static. */
FLOW_EXPORT const char *flow_version(void);
/* One line such as "cuda: yes (sm_90), nccl: yes, cudnn: no, pmix: yes,
 * blas: openblas, openmp: yes"; static. */
FLOW_EXPORT const char *flow_features(void);
FLOW_EXPORT bool flow_have_cuda(void);

#ifdef __cplusplus
}
#endif

#endif
