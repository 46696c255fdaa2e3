/* Strict number parsing: whole string, in range, clear message. */
#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <flow/parse.h>

flow_err_t flow_parse_int(const char *text, int64_t min, int64_t max,
			  int64_t *value_out, flow_diag_t *diag)
{
	if (!text || !*text || isspace((unsigned char)text[0]))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid integer '%s'", text ? text : "");
	char *end;
	errno = 0;
	long long v = strtoll(text, &end, 10);
	if (*end != '\0')
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid integer '%s'", text);
	if (errno == ERANGE || v < min || v > max)
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "integer '%s' out of range [%lld, %lld]",
				     text, (long long)min, (long long)max);
	*value_out = v;
	return FLOW_OK;
}

flow_err_t flow_parse_size(const char *text, uint64_t *value_out,
			   flow_diag_t *diag)
{
	if (!text || !isdigit((unsigned char)text[0]))
		return flow_diag_set(diag, FLOW_ERR_USAGE, "invalid size '%s'",
				     text ? text : "");
	char *end;
	errno = 0;
	unsigned long long v = strtoull(text, &end, 10);
	if (errno == ERANGE)
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "size '%s' is too large", text);
	static const struct {
		const char *suffix;
		unsigned shift;
	} suffixes[] = {
		{ "", 0 },     { "k", 10 },   { "kib", 10 }, { "m", 20 },
		{ "mib", 20 }, { "g", 30 },   { "gib", 30 }, { "t", 40 },
		{ "tib", 40 },
	};
	for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
		if (strcasecmp(end, suffixes[i].suffix) != 0)
			continue;
		unsigned shift = suffixes[i].shift;
		if (shift && v > (UINT64_MAX >> shift))
			return flow_diag_set(diag, FLOW_ERR_RANGE,
					     "size '%s' is too large", text);
		*value_out = (uint64_t)v << shift;
		return FLOW_OK;
	}
	return flow_diag_set(diag, FLOW_ERR_USAGE, "invalid size '%s'", text);
}

flow_err_t flow_parse_double(const char *text, double min, double max,
			     double *value_out, flow_diag_t *diag)
{
	if (!text || !*text || isspace((unsigned char)text[0]))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid number '%s'", text ? text : "");
	char *end;
	errno = 0;
	double v = strtod(text, &end);
	if (*end != '\0' || !isfinite(v))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid number '%s'", text);
	if (errno == ERANGE || v < min || v > max)
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "number '%s' out of range [%g, %g]", text,
				     min, max);
	*value_out = v;
	return FLOW_OK;
}

flow_err_t flow_parse_dims(const char *text, size_t max_count,
			   uint64_t *values_out, size_t *count_out,
			   flow_diag_t *diag)
{
	size_t count = 0;
	const char *p = text ? text : "";
	if (!*p)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid dimensions '%s'", p);
	for (;;) {
		char *end;
		if (!isdigit((unsigned char)*p))
			goto bad;
		errno = 0;
		unsigned long long v = strtoull(p, &end, 10);
		if (errno == ERANGE || v == 0)
			goto bad;
		if (count == max_count)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "too many dimensions in '%s' (at most %zu)",
					     text, max_count);
		values_out[count++] = v;
		if (*end == '\0')
			break;
		if (*end != ',' && *end != 'x')
			goto bad;
		p = end + 1;
	}
	*count_out = count;
	return FLOW_OK;
bad:
	return flow_diag_set(diag, FLOW_ERR_USAGE,
			     "invalid dimensions '%s': expected positive integers separated by ',' or 'x'",
			     text);
}
