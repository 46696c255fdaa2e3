# FLOW_CHECK_PMIX: --with-pmix[=DIR] (default: check), pkg-config first.
# Sets PMIX_CPPFLAGS, PMIX_LDFLAGS, PMIX_LIBS, HAVE_PMIX.
AC_DEFUN([FLOW_CHECK_PMIX], [
	AC_ARG_WITH([pmix],
		[AS_HELP_STRING([--with-pmix@<:@=DIR@:>@], [use PMIx (default: check)])],
		[], [with_pmix=check])
	have_pmix=no
	flow_pmix_summary=no
	PMIX_CPPFLAGS= PMIX_LDFLAGS= PMIX_LIBS=
	AS_IF([test "x$with_pmix" != xno], [
		AS_CASE([$with_pmix],
			[yes|check], [PKG_CHECK_MODULES([PMIX], [pmix],
				[have_pmix=yes PMIX_CPPFLAGS=$PMIX_CFLAGS], [:])])
		AS_IF([test "x$have_pmix" = xno], [
			AS_CASE([$with_pmix],
				[yes|check], [flow_pmix_dir=/usr/lib/x86_64-linux-gnu/pmix2],
				[flow_pmix_dir=$with_pmix])
			flow_save_CPPFLAGS=$CPPFLAGS flow_save_LDFLAGS=$LDFLAGS flow_save_LIBS=$LIBS
			PMIX_CPPFLAGS="-I$flow_pmix_dir/include"
			PMIX_LDFLAGS="-L$flow_pmix_dir/lib -Wl,-rpath,$flow_pmix_dir/lib"
			CPPFLAGS="$CPPFLAGS $PMIX_CPPFLAGS"
			LDFLAGS="$LDFLAGS $PMIX_LDFLAGS"
			have_pmix=yes
			AC_CHECK_HEADER([pmix.h], [], [have_pmix=no])
			AS_IF([test "x$have_pmix" = xyes],
				[AC_CHECK_LIB([pmix], [PMIx_Init], [PMIX_LIBS=-lpmix], [have_pmix=no])])
			CPPFLAGS=$flow_save_CPPFLAGS LDFLAGS=$flow_save_LDFLAGS LIBS=$flow_save_LIBS
		])
		AS_IF([test "x$have_pmix" = xyes], [
			flow_pmix_summary=yes
			AC_DEFINE([HAVE_PMIX], [1], [Define if PMIx is available])
		], [
			PMIX_CPPFLAGS= PMIX_LDFLAGS= PMIX_LIBS=
			AS_IF([test "x$with_pmix" = xcheck],
				[AC_MSG_WARN([PMIx not found: multi-rank launch disabled; install libpmix-dev])],
				[AC_MSG_ERROR([PMIx requested but not found; install libpmix-dev])])
		])
	])
	AC_SUBST([PMIX_CPPFLAGS])
	AC_SUBST([PMIX_LDFLAGS])
	AC_SUBST([PMIX_LIBS])
	AM_CONDITIONAL([HAVE_PMIX], [test "x$have_pmix" = xyes])
])
