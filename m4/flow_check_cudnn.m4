# FLOW_CHECK_CUDNN: --with-cudnn[=DIR] (default: check); only with CUDA.
# Sets CUDNN_CPPFLAGS, CUDNN_LDFLAGS, CUDNN_LIBS, HAVE_CUDNN.
AC_DEFUN([FLOW_CHECK_CUDNN], [
	AC_ARG_WITH([cudnn],
		[AS_HELP_STRING([--with-cudnn@<:@=DIR@:>@], [use cuDNN (default: check)])],
		[], [with_cudnn=check])
	have_cudnn=no
	flow_cudnn_summary=no
	CUDNN_CPPFLAGS= CUDNN_LDFLAGS= CUDNN_LIBS=
	AS_IF([test "x$with_cudnn" != xno], [
		AS_IF([test "x$have_cuda" != xyes], [
			AS_IF([test "x$with_cudnn" != xcheck],
				[AC_MSG_ERROR([cuDNN requested but CUDA is not available])])
		], [
			AS_CASE([$with_cudnn],
				[yes|check], [CUDNN_CPPFLAGS="$CUDA_CPPFLAGS" CUDNN_LDFLAGS="$CUDA_LDFLAGS"],
				[CUDNN_CPPFLAGS="-I$with_cudnn/include" CUDNN_LDFLAGS="-L$with_cudnn/lib -Wl,-rpath,$with_cudnn/lib"])
			flow_save_CPPFLAGS=$CPPFLAGS flow_save_LDFLAGS=$LDFLAGS flow_save_LIBS=$LIBS
			CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS $CUDNN_CPPFLAGS"
			LDFLAGS="$LDFLAGS $CUDA_LDFLAGS $CUDNN_LDFLAGS"
			have_cudnn=yes
			AC_CHECK_HEADER([cudnn.h], [], [have_cudnn=no])
			AS_IF([test "x$have_cudnn" = xyes],
				[AC_CHECK_LIB([cudnn], [cudnnCreate], [], [have_cudnn=no], [-lcudart])])
			CPPFLAGS=$flow_save_CPPFLAGS LDFLAGS=$flow_save_LDFLAGS LIBS=$flow_save_LIBS
			AS_IF([test "x$have_cudnn" = xyes], [
				CUDNN_LIBS=-lcudnn
				flow_cudnn_summary=yes
				AC_DEFINE([HAVE_CUDNN], [1], [Define if cuDNN is available])
			], [
				CUDNN_CPPFLAGS= CUDNN_LDFLAGS=
				AS_IF([test "x$with_cudnn" = xcheck],
					[AC_MSG_WARN([cuDNN not found: attention uses flow's own kernels; install nvidia-cudnn])],
					[AC_MSG_ERROR([cuDNN requested but not found; install nvidia-cudnn])])
			])
		])
	])
	AC_SUBST([CUDNN_CPPFLAGS])
	AC_SUBST([CUDNN_LDFLAGS])
	AC_SUBST([CUDNN_LIBS])
	AM_CONDITIONAL([HAVE_CUDNN], [test "x$have_cudnn" = xyes])
])
