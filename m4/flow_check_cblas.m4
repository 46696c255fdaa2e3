# FLOW_CHECK_CBLAS: a CBLAS is required; OpenBLAS through pkg-config first.
# Sets CBLAS_CFLAGS, CBLAS_LIBS and flow_cblas_name.
AC_DEFUN([FLOW_CHECK_CBLAS], [
	flow_cblas_name=
	PKG_CHECK_MODULES([CBLAS], [openblas], [flow_cblas_name=openblas], [:])
	AS_IF([test -z "$flow_cblas_name"], [
		flow_save_LIBS=$LIBS
		AC_SEARCH_LIBS([cblas_sgemm], [openblas cblas blas],
			[flow_cblas_name=cblas
			 AS_IF([test "x$ac_cv_search_cblas_sgemm" != "xnone required"],
				[CBLAS_LIBS=$ac_cv_search_cblas_sgemm])],
			[AC_MSG_ERROR([a CBLAS is required: install libopenblas-dev])])
		LIBS=$flow_save_LIBS
	])
	flow_save_CPPFLAGS=$CPPFLAGS
	CPPFLAGS="$CPPFLAGS $CBLAS_CFLAGS"
	AC_CHECK_HEADER([cblas.h], [],
		[AC_MSG_ERROR([cblas.h not found: install libopenblas-dev])])
	CPPFLAGS=$flow_save_CPPFLAGS
	AS_IF([test "x$flow_cblas_name" = xopenblas],
		[AC_DEFINE([HAVE_OPENBLAS], [1], [Define if the CBLAS is OpenBLAS])])
	AC_SUBST([CBLAS_CFLAGS])
	AC_SUBST([CBLAS_LIBS])
])
