/* JSON text for the programs' --json output: the one string writer every
 * JSON document of the library and the tools goes through.
 *
 * Strings are written as UTF-8 bytes, as given (the inputs are flow's own
 * names and file paths); '"', '\\' and every control byte below 0x20 are
 * escaped ("\u000a" for a newline), so any C string becomes one valid
 * JSON string literal on one line. */
#ifndef FLOW_JSON_H
#define FLOW_JSON_H

#include <stdio.h>

#include <flow/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Write s as a JSON string literal, quotes included, to f.  Returns false
 * when a write failed (ferror(f) is then set, as for every stdio call);
 * callers that check ferror once at the end may ignore it. */
FLOW_EXPORT bool flow_json_write_string(FILE *f, const char *s);

#ifdef __cplusplus
}
#endif

#endif
