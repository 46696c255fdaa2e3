# FLOW_CHECK_CUDA: --with-cuda[=DIR] (default: check).  Finds cuda_runtime.h,
# libcudart, cuBLAS and cuBLASLt, and nvcc for the .cu sources.  Sets CUDA_CPPFLAGS,
# CUDA_LDFLAGS, CUDA_LIBS, NVCC, NVCC_GENCODE; HAVE_CUDA and HAVE_NVCC.
AC_DEFUN([FLOW_CHECK_CUDA], [
	AC_ARG_WITH([cuda],
		[AS_HELP_STRING([--with-cuda@<:@=DIR@:>@],
			[use CUDA from DIR (default: check /usr/local/cuda)])],
		[], [with_cuda=check])
	AC_ARG_WITH([nvcc-gencode],
		[AS_HELP_STRING([--with-nvcc-gencode=FLAGS],
			[nvcc -gencode flags (default: sm_90 code and compute_90 PTX)])],
		[NVCC_GENCODE=$withval],
		[NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90"])
	have_cuda=no
	flow_cuda_summary=no
	CUDA_CPPFLAGS= CUDA_LDFLAGS= CUDA_LIBS=
	AS_IF([test "x$with_cuda" != xno], [
		AS_CASE([$with_cuda],
			[yes|check], [flow_cuda_dir=/usr/local/cuda],
			[flow_cuda_dir=$with_cuda])
		flow_save_CPPFLAGS=$CPPFLAGS flow_save_LDFLAGS=$LDFLAGS flow_save_LIBS=$LIBS
		CUDA_CPPFLAGS="-I$flow_cuda_dir/include"
		CUDA_LDFLAGS="-L$flow_cuda_dir/lib64 -Wl,-rpath,$flow_cuda_dir/lib64"
		CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"
		LDFLAGS="$LDFLAGS $CUDA_LDFLAGS"
		have_cuda=yes
		AS_IF([test ! -d "$flow_cuda_dir/include"], [have_cuda=no])
		AS_IF([test "x$have_cuda" = xyes],
			[AC_CHECK_HEADERS([cuda_runtime.h cublas_v2.h cublasLt.h], [], [have_cuda=no])])
		AS_IF([test "x$have_cuda" = xyes],
			[AC_CHECK_LIB([cudart], [cudaMalloc], [], [have_cuda=no])])
		AS_IF([test "x$have_cuda" = xyes],
			[AC_CHECK_LIB([cublas], [cublasCreate_v2], [], [have_cuda=no])])
		AS_IF([test "x$have_cuda" = xyes],
			[AC_CHECK_LIB([cublasLt], [cublasLtCreate], [], [have_cuda=no])])
		AS_IF([test "x$have_cuda" = xyes], [
			AC_PATH_PROG([NVCC], [nvcc], [no], [$flow_cuda_dir/bin:$PATH])
			AS_IF([test "x$NVCC" = xno], [have_cuda=no])
		])
		CPPFLAGS=$flow_save_CPPFLAGS LDFLAGS=$flow_save_LDFLAGS LIBS=$flow_save_LIBS
		AS_IF([test "x$have_cuda" = xyes], [
			CUDA_LIBS="-lcublasLt -lcublas -lcudart -lstdc++"  # nvcc objects are C++
			flow_cuda_arch=`echo "$NVCC_GENCODE" | sed -n 's/.*code=\(sm_@<:@0-9a-z@:>@*\).*/\1/p'`
			flow_cuda_summary="yes ($flow_cuda_dir, ${flow_cuda_arch:-ptx})"
			AC_DEFINE([HAVE_CUDA], [1], [Define if CUDA is available])
			AC_DEFINE_UNQUOTED([FLOW_CUDA_ARCH], ["$flow_cuda_arch"], [CUDA architecture built for])
		], [
			CUDA_CPPFLAGS= CUDA_LDFLAGS=
			AS_IF([test "x$with_cuda" = xcheck],
				[AC_MSG_WARN([CUDA not found: building without GPU support; install nvidia-cuda-toolkit or pass --with-cuda=DIR])],
				[AC_MSG_ERROR([CUDA requested but not found in $flow_cuda_dir (need cuda_runtime.h, cublas_v2.h, cublasLt.h, libcudart, libcublas, libcublasLt and nvcc); install nvidia-cuda-toolkit])])
		])
	])
	AC_SUBST([CUDA_CPPFLAGS])
	AC_SUBST([CUDA_LDFLAGS])
	AC_SUBST([CUDA_LIBS])
	AC_SUBST([NVCC_GENCODE])
	AM_CONDITIONAL([HAVE_CUDA], [test "x$have_cuda" = xyes])
	AM_CONDITIONAL([HAVE_NVCC], [test "x$have_cuda" = xyes])
])
