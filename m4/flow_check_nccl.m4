# FLOW_CHECK_NCCL: --with-nccl[=DIR] (default: check); only with CUDA.
# Sets NCCL_CPPFLAGS, NCCL_LDFLAGS, NCCL_LIBS, HAVE_NCCL.
AC_DEFUN([FLOW_CHECK_NCCL], [
	AC_ARG_WITH([nccl],
		[AS_HELP_STRING([--with-nccl@<:@=DIR@:>@], [use NCCL (default: check)])],
		[], [with_nccl=check])
	have_nccl=no
	flow_nccl_summary=no
	NCCL_CPPFLAGS= NCCL_LDFLAGS= NCCL_LIBS=
	AS_IF([test "x$with_nccl" != xno], [
		AS_IF([test "x$have_cuda" != xyes], [
			AS_IF([test "x$with_nccl" != xcheck],
				[AC_MSG_ERROR([NCCL requested but CUDA is not available])])
		], [
			AS_CASE([$with_nccl],
				[yes|check], [NCCL_CPPFLAGS="$CUDA_CPPFLAGS" NCCL_LDFLAGS="$CUDA_LDFLAGS"],
				[NCCL_CPPFLAGS="-I$with_nccl/include" NCCL_LDFLAGS="-L$with_nccl/lib -Wl,-rpath,$with_nccl/lib"])
			flow_save_CPPFLAGS=$CPPFLAGS flow_save_LDFLAGS=$LDFLAGS flow_save_LIBS=$LIBS
			CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS $NCCL_CPPFLAGS"
			LDFLAGS="$LDFLAGS $CUDA_LDFLAGS $NCCL_LDFLAGS"
			have_nccl=yes
			AC_CHECK_HEADER([nccl.h], [], [have_nccl=no])
			AS_IF([test "x$have_nccl" = xyes],
				[AC_CHECK_LIB([nccl], [ncclCommInitRank], [], [have_nccl=no], [-lcudart])])
			CPPFLAGS=$flow_save_CPPFLAGS LDFLAGS=$flow_save_LDFLAGS LIBS=$flow_save_LIBS
			AS_IF([test "x$have_nccl" = xyes], [
				NCCL_LIBS=-lnccl
				flow_nccl_summary=yes
				AC_DEFINE([HAVE_NCCL], [1], [Define if NCCL is available])
			], [
				NCCL_CPPFLAGS= NCCL_LDFLAGS=
				AS_IF([test "x$with_nccl" = xcheck],
					[AC_MSG_WARN([NCCL not found: multi-GPU collectives disabled; install libnccl-dev])],
					[AC_MSG_ERROR([NCCL requested but not found; install libnccl-dev])])
			])
		])
	])
	AC_SUBST([NCCL_CPPFLAGS])
	AC_SUBST([NCCL_LDFLAGS])
	AC_SUBST([NCCL_LIBS])
	AM_CONDITIONAL([HAVE_NCCL], [test "x$have_nccl" = xyes])
])
