/* The JSON string writer (flow/json.h). */
#include <config.h>

#include <flow/json.h>

bool flow_json_write_string(FILE *f, const char *s)
{
	bool ok = fputc('"', f) != EOF;

	for (; *s && ok; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			ok = fprintf(f, "\\%c", c) >= 0;
		else if (c < 0x20)
			ok = fprintf(f, "\\u%04x", c) >= 0;
		else
			ok = fputc(c, f) != EOF;
	}
	return ok && fputc('"', f) != EOF;
}
