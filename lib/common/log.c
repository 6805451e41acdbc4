/* SPDX-License-Identifier: Apache-2.0 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static gf_log_fn log_fn;
static void *log_userdata;
static int log_level = GF_LOG_INFO;
static int env_level = -2; /* -2: not read yet, -1: GF_LOG unset */

static int level_from_env(void)
{
	const char *v = getenv("GF_LOG");
	if (!v || !*v)
		return -1;
	if (!strcmp(v, "err") || !strcmp(v, "error"))
		return GF_LOG_ERR;
	if (!strcmp(v, "warn") || !strcmp(v, "warning"))
		return GF_LOG_WARN;
	if (!strcmp(v, "info"))
		return GF_LOG_INFO;
	if (!strcmp(v, "debug"))
		return GF_LOG_DEBUG;
	return GF_LOG_WARN;
}

GF_EXPORT void gf_set_log_fn(gf_log_fn fn, void *userdata)
{
	pthread_mutex_lock(&log_lock);
	log_fn = fn;
	log_userdata = userdata;
	pthread_mutex_unlock(&log_lock);
}

GF_EXPORT void gf_set_log_level(int level)
{
	pthread_mutex_lock(&log_lock);
	log_level = level;
	pthread_mutex_unlock(&log_lock);
}

static const char *level_name(int level)
{
	switch (level) {
	case GF_LOG_ERR:
		return "error";
	case GF_LOG_WARN:
		return "warn";
	case GF_LOG_INFO:
		return "info";
	default:
		return "debug";
	}
}

GF_EXPORT void gf_log_stderr(int level, const char *component, const char *msg, void *userdata)
{
	struct timespec ts;
	struct tm tm;
	char when[40];
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	/* One fprintf per line keeps lines from concurrent threads whole. */
	/* mono_us (CLOCK_MONOTONIC, shared by all processes of the machine) lets
	 * a reader order and time events across processes to the microsecond. */
	long long mono = (long long)gf_now_us();
	if (userdata)
		fprintf(stderr, "ts=%s.%03ldZ mono_us=%lld prog=%s level=%s component=%s %s\n", when,
			ts.tv_nsec / 1000000, mono, (const char *)userdata, level_name(level), component, msg);
	else
		fprintf(stderr, "ts=%s.%03ldZ mono_us=%lld level=%s component=%s %s\n", when,
			ts.tv_nsec / 1000000, mono, level_name(level), component, msg);
}

bool gf_log_enabled(int level)
{
	bool on;
	pthread_mutex_lock(&log_lock);
	if (env_level == -2)
		env_level = level_from_env();
	if (log_fn)
		on = level <= log_level;
	else
		on = env_level >= 0 && level <= env_level;
	pthread_mutex_unlock(&log_lock);
	return on;
}

void gf_log(int level, const char *component, const char *fmt, ...)
{
	char msg[1024];
	gf_log_fn fn;
	void *ud;
	va_list ap;

	if (!gf_log_enabled(level))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&log_lock);
	fn = log_fn;
	ud = log_userdata;
	pthread_mutex_unlock(&log_lock);
	if (fn)
		fn(level, component, msg, ud);
	else
		gf_log_stderr(level, component, msg, NULL);
}
