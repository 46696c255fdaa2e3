/* Levelled logging with one switch, a settable sink and rank awareness. */
#include <config.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <flow/error.h>
#include <flow/log.h>

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static flow_log_level_t log_level = FLOW_LOG_WARN;
static int log_rank = -1;
static char log_prog[64];
static flow_log_fn log_sink;
static void *log_sink_data;

static const char *const level_names[] = { "off", "error", "warn", "info",
					   "debug", "trace" };

void flow_log_set_level(flow_log_level_t level)
{
	if (level < FLOW_LOG_OFF)
		level = FLOW_LOG_OFF;
	if (level > FLOW_LOG_TRACE)
		level = FLOW_LOG_TRACE;
	log_level = level;
}

flow_log_level_t flow_log_get_level(void)
{
	return log_level;
}

int flow_log_level_parse(const char *text, flow_log_level_t *level_out)
{
	if (!text)
		return FLOW_ERR_USAGE;
	for (int i = 0; i <= FLOW_LOG_TRACE; i++) {
		char digit[2] = { (char)('0' + i), '\0' };
		if (strcasecmp(text, level_names[i]) == 0 ||
		    strcmp(text, digit) == 0) {
			*level_out = (flow_log_level_t)i;
			return FLOW_OK;
		}
	}
	if (strcasecmp(text, "warning") == 0) {
		*level_out = FLOW_LOG_WARN;
		return FLOW_OK;
	}
	return FLOW_ERR_USAGE;
}

int flow_log_level_from_env(void)
{
	const char *text = getenv("FLOW_LOG_LEVEL");
	flow_log_level_t level;
	if (!text || !*text)
		return FLOW_OK;
	if (flow_log_level_parse(text, &level) != FLOW_OK)
		return FLOW_ERR_USAGE;
	flow_log_set_level(level);
	return FLOW_OK;
}

void flow_log_set_prog(const char *prog)
{
	pthread_mutex_lock(&log_lock);
	snprintf(log_prog, sizeof(log_prog), "%s", prog ? prog : "");
	pthread_mutex_unlock(&log_lock);
}

void flow_log_set_rank(int rank)
{
	log_rank = rank < 0 ? -1 : rank;
}

void flow_log_set_callback(flow_log_fn fn, void *userdata)
{
	pthread_mutex_lock(&log_lock);
	log_sink = fn;
	log_sink_data = userdata;
	pthread_mutex_unlock(&log_lock);
}

bool flow_log_enabled(flow_log_level_t level)
{
	if (level <= FLOW_LOG_OFF || level > log_level)
		return false;
	/* Only rank 0 speaks below WARN, so N ranks do not print N copies. */
	if (level >= FLOW_LOG_INFO && log_rank > 0)
		return false;
	return true;
}

static void default_sink(flow_log_level_t level, const char *line,
			 void *userdata)
{
	(void)level;
	(void)userdata;
	fflush(stdout);
	fprintf(stderr, "%s\n", line);
}

void flow_log_say(const char *prog, const char *fmt, va_list ap)
{
	char raw[1024], line[1024];
	vsnprintf(raw, sizeof raw, fmt, ap);
	flow_escape_line(line, sizeof line, raw);
	fflush(stdout);
	fprintf(stderr, "%s: %s\n", prog, line);
}

void flow_logv(flow_log_level_t level, const char *fmt, va_list ap)
{
	if (!flow_log_enabled(level))
		return;
	static const char *const tags[] = { "", "", "warning: ", "", "debug: ",
					    "trace: " };
	char line[1024];
	size_t used = 0;
	pthread_mutex_lock(&log_lock);
	if (log_rank > 0)
		used += (size_t)snprintf(line, sizeof(line), "[rank %d] ",
					 log_rank);
	if (log_prog[0])
		used += (size_t)snprintf(line + used, sizeof(line) - used,
					 "%s: ", log_prog);
	if (used < sizeof(line))
		used += (size_t)snprintf(line + used, sizeof(line) - used,
					 "%s", tags[level]);
	if (used < sizeof(line))
		vsnprintf(line + used, sizeof(line) - used, fmt, ap);
	size_t len = strlen(line);
	if (len > 0 && line[len - 1] == '\n')
		line[len - 1] = '\0';
	/* One line, whatever the arguments quote. */
	char printable[sizeof(line)];
	flow_escape_line(printable, sizeof(printable), line);
	flow_log_fn sink = log_sink ? log_sink : default_sink;
	sink(level, printable, log_sink_data);
	pthread_mutex_unlock(&log_lock);
}

void flow_log(flow_log_level_t level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	flow_logv(level, fmt, ap);
	va_end(ap);
}
