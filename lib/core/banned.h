/* Foot-gun libc calls, turned into compile errors (after git's banned.h).
 * Included into every C file by the build (-include), after the system
 * headers that declare them, so only uses in flow's own code are caught.
 * Use snprintf, memcpy with a checked size, strtok_r-free parsing,
 * flow_parse_int and gmtime_r/localtime_r instead. */
#ifndef FLOW_BANNED_H
#define FLOW_BANNED_H

/* config.h first: the libc headers below must see its _GNU_SOURCE, or the
 * GNU calls they declare (pipe2, strchrnul, environ) stay hidden for the
 * whole file. */
#include <config.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FLOW_BANNED(func) sorry_##func##_is_a_banned_function

#undef strcpy
#define strcpy(x, y) FLOW_BANNED(strcpy)
#undef strcat
#define strcat(x, y) FLOW_BANNED(strcat)
#undef sprintf
#define sprintf(...) FLOW_BANNED(sprintf)
#undef vsprintf
#define vsprintf(...) FLOW_BANNED(vsprintf)
#undef strtok
#define strtok(x, y) FLOW_BANNED(strtok)
#undef atoi
#define atoi(x) FLOW_BANNED(atoi)
#undef atol
#define atol(x) FLOW_BANNED(atol)
#undef atoll
#define atoll(x) FLOW_BANNED(atoll)
#undef gmtime
#define gmtime(x) FLOW_BANNED(gmtime)
#undef localtime
#define localtime(x) FLOW_BANNED(localtime)

#endif
