/* Version and build features, for --version and benchmark preambles. */
#include <config.h>

#include <flow/version.h>

const char *flow_version(void)
{
	return PACKAGE_VERSION;
}

#ifdef HAVE_CUDA
#define FEATURE_CUDA "cuda: yes (" FLOW_CUDA_ARCH ")"
#else
#define FEATURE_CUDA "cuda: no"
#endif
#ifdef HAVE_NCCL
#define FEATURE_NCCL "nccl: yes"
#else
#define FEATURE_NCCL "nccl: no"
#endif
#ifdef HAVE_CUDNN
#define FEATURE_CUDNN "cudnn: yes"
#else
#define FEATURE_CUDNN "cudnn: no"
#endif
#ifdef HAVE_PMIX
#define FEATURE_PMIX "pmix: yes"
#else
#define FEATURE_PMIX "pmix: no"
#endif
#ifdef HAVE_OPENBLAS
#define FEATURE_BLAS "blas: openblas"
#else
#define FEATURE_BLAS "blas: cblas"
#endif
#ifdef _OPENMP
#define FEATURE_OPENMP "openmp: yes"
#else
#define FEATURE_OPENMP "openmp: no"
#endif

const char *flow_features(void)
{
	return FEATURE_CUDA ", " FEATURE_NCCL ", " FEATURE_CUDNN ", "
		FEATURE_PMIX ", " FEATURE_BLAS ", " FEATURE_OPENMP;
}

bool flow_have_cuda(void)
{
#ifdef HAVE_CUDA
	return true;
#else
	return false;
#endif
}
