/* <pmix.h> for the files that talk to libpmix (world.c, launch.c).
 *
 * pmix_common.h's inline helpers call atoi, which lib/core/banned.h turns into a
 * compile error; the ban is lifted for the foreign headers only and stays
 * in force for flow's own code. */
#ifndef FLOW_PMIX_INTERNAL_H
#define FLOW_PMIX_INTERNAL_H

#ifdef HAVE_PMIX
#pragma push_macro("atoi")
#undef atoi
#include <pmix.h>
#include <pmix_server.h>
#pragma pop_macro("atoi")
#endif

#endif
