/* Error names and the diagnostic that carries one message line. */
#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <flow/error.h>

const char *flow_err_name(flow_err_t err)
{
	switch (err) {
	case FLOW_OK: return "FLOW_OK";
	case FLOW_ERR_NOMEM: return "FLOW_ERR_NOMEM";
	case FLOW_ERR_IO: return "FLOW_ERR_IO";
	case FLOW_ERR_FORMAT: return "FLOW_ERR_FORMAT";
	case FLOW_ERR_CHECKSUM: return "FLOW_ERR_CHECKSUM";
	case FLOW_ERR_USAGE: return "FLOW_ERR_USAGE";
	case FLOW_ERR_PEER: return "FLOW_ERR_PEER";
	case FLOW_ERR_TIMEOUT: return "FLOW_ERR_TIMEOUT";
	case FLOW_ERR_DEVICE: return "FLOW_ERR_DEVICE";
	case FLOW_ERR_RANGE: return "FLOW_ERR_RANGE";
	case FLOW_ERR_NOTSUP: return "FLOW_ERR_NOTSUP";
	case FLOW_ERR_VERIFY: return "FLOW_ERR_VERIFY";
	}
	return "FLOW_ERR_UNKNOWN";
}

void flow_diag_clear(flow_diag_t *diag)
{
	if (!diag)
		return;
	diag->err = FLOW_OK;
	diag->msg[0] = '\0';
}

/* Format into diag unless it already holds an error (the first one wins). */
static flow_err_t diag_vset(flow_diag_t *diag, flow_err_t err, int errnum,
			    const char *fmt, va_list ap)
{
	if (!diag || diag->err != FLOW_OK)
		return err;
	diag->err = err;
	int n = vsnprintf(diag->msg, sizeof(diag->msg), fmt, ap);
	if (n < 0)
		diag->msg[0] = '\0';
	if (errnum != 0) {
		size_t used = strlen(diag->msg);
		snprintf(diag->msg + used, sizeof(diag->msg) - used, ": %s",
			 strerror(errnum));
	}
	return err;
}

flow_err_t flow_diag_set(flow_diag_t *diag, flow_err_t err, const char *fmt,
			 ...)
{
	va_list ap;
	va_start(ap, fmt);
	diag_vset(diag, err, 0, fmt, ap);
	va_end(ap);
	return err;
}

flow_err_t flow_diag_errno(flow_diag_t *diag, flow_err_t err, int errnum,
			   const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	diag_vset(diag, err, errnum, fmt, ap);
	va_end(ap);
	return err;
}

const char *flow_diag_message(const flow_diag_t *diag)
{
	if (!diag || diag->err == FLOW_OK)
		return "";
	if (diag->msg[0] == '\0')
		return flow_err_name(diag->err);
	return diag->msg;
}
