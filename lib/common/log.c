/* SPDX-License-Identifier: Apache-2.0 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static gf_log_fn log_fn;
static void *log_userdata;
static int log_level = -1;  /* -1: not set by gf_set_log_level() */
static int env_level = -2; /* -2: not read yet, -1: GF_LOG unset */

/*
 * The hold (gf_log_hold()): one per process, owned by the thread that took
 * it (an engine's, from its grant), whose info lines wait here; any thread
 * may release it (an engine may serve on another thread than the one that
 * acquired). The lines are heap-allocated ahead (gf_log_hold_prepare()):
 * touched before the wait, not at the hold.
 */
#define HOLD_MAX 24
#define HOLD_MAX_US 1000000 /* a hold older than this is released by the owner's next line */
struct held_line {
	int level;
	const char *component; /* a static string (gf_log_fn's contract) */
	int64_t mono_us, wall_us;
	char msg[1024];
};
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static struct held_line *held; /* guarded by hold_mu */
static struct held_line *held_spare; /* the other buffer: a release delivers from it */
static int nheld;
static pthread_t hold_owner;
static int64_t hold_since;
static atomic_bool holding; /* read without hold_mu by every gf_log() */
/* While a line is being delivered: when it was logged (gf_log_line_time()). */
static _Thread_local bool line_time_set;
static _Thread_local int64_t line_mono_us, line_wall_us;
/* While held lines are delivered (by the thread whose batching is set,
 * holding batch_mu): gf_log_stderr() appends here, one write at the end.
 * One buffer for the process, made once: releases are rare. */
static pthread_mutex_t batch_mu = PTHREAD_MUTEX_INITIALIZER;
static char *batch;
static size_t batch_len, batch_cap;
static _Thread_local bool batching;

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

GF_EXPORT void gf_log_line_time(int64_t *mono_us, int64_t *wall_us)
{
	bool set = line_time_set;
	if (mono_us)
		*mono_us = set ? line_mono_us : gf_now_us();
	if (wall_us)
		*wall_us = set ? line_wall_us : gf_wall_us();
}

/* Appends to the batch; false when it cannot grow (the line is then written alone). */
static bool batch_add(const char *line, size_t len)
{
	if (batch_len + len > batch_cap) {
		size_t cap = batch_cap ? batch_cap : 4096;
		while (cap < batch_len + len)
			cap *= 2;
		char *b = realloc(batch, cap);
		if (!b)
			return false;
		batch = b;
		batch_cap = cap;
	}
	memcpy(batch + batch_len, line, len);
	batch_len += len;
	return true;
}

/* Under systemd stderr is often a stream to journald, named by
 * JOURNAL_STREAM (its device:inode). There a "<N>" prefix gives the line its
 * syslog priority (the log levels are those numbers), so that `journalctl -p
 * err` finds the errors; anywhere else it would be noise. Checked once. */
static pthread_once_t journal_once = PTHREAD_ONCE_INIT;
static bool journal_stream;

static void journal_check(void)
{
	const char *v = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	journal_stream = v && sscanf(v, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
			 (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

GF_EXPORT void gf_log_stderr(int level, const char *component, const char *msg, void *userdata)
{
	/* mono_us (CLOCK_MONOTONIC, shared by all processes of the machine) lets
	 * a reader order and time events across processes to the microsecond;
	 * both times are the line's, also for a line delivered after a hold. */
	int64_t mono, wall;
	gf_log_line_time(&mono, &wall);
	time_t sec = (time_t)(wall / 1000000);
	struct tm tm;
	char when[40];
	gmtime_r(&sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	char line[1400], pri[8] = "", event[64];
	int n;
	gf_log_event_prefix(event, sizeof(event), msg);
	pthread_once(&journal_once, journal_check);
	if (journal_stream)
		snprintf(pri, sizeof(pri), "<%d>", level < GF_LOG_ERR ? GF_LOG_ERR : level > GF_LOG_DEBUG ? GF_LOG_DEBUG : level);
	if (userdata)
		n = snprintf(line, sizeof(line), "%sts=%s.%03dZ mono_us=%lld prog=%s level=%s component=%s %s%s\n", pri,
			     when, (int)(wall % 1000000 / 1000), (long long)mono, (const char *)userdata,
			     level_name(level), component, event, msg);
	else
		n = snprintf(line, sizeof(line), "%sts=%s.%03dZ mono_us=%lld level=%s component=%s %s%s\n", pri, when,
			     (int)(wall % 1000000 / 1000), (long long)mono, level_name(level), component, event, msg);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(line)) {
		n = sizeof(line) - 1;
		line[n - 1] = '\n';
	}
	if (batching && batch_add(line, (size_t)n))
		return;
	/* One write per line keeps lines from concurrent threads whole. */
	fwrite(line, 1, (size_t)n, stderr);
}

bool gf_log_enabled(int level)
{
	bool on;
	pthread_mutex_lock(&log_lock);
	if (env_level == -2)
		env_level = level_from_env();
	/* With a hook: gf_set_log_level()'s level, else GF_LOG's, else info;
	 * without one, nothing unless GF_LOG asks (a library is quiet). */
	if (log_fn)
		on = level <= (log_level >= 0 ? log_level : env_level >= 0 ? env_level : GF_LOG_INFO);
	else
		on = env_level >= 0 && level <= env_level;
	pthread_mutex_unlock(&log_lock);
	return on;
}

/* Hands one line to the hook (or stderr), telling it when the line was logged. */
static void deliver(int level, const char *component, const char *msg, int64_t mono_us, int64_t wall_us)
{
	pthread_mutex_lock(&log_lock);
	gf_log_fn fn = log_fn;
	void *ud = log_userdata;
	pthread_mutex_unlock(&log_lock);
	line_time_set = true;
	line_mono_us = mono_us;
	line_wall_us = wall_us;
	if (fn)
		fn(level, component, msg, ud);
	else
		gf_log_stderr(level, component, msg, NULL);
	line_time_set = false;
}

/* The batch buffer, made and touched ahead. */
static void batch_prepare(void)
{
	pthread_mutex_lock(&batch_mu);
	if (!batch && (batch = malloc(HOLD_MAX * 1200))) {
		memset(batch, 0, HOLD_MAX * 1200);
		batch_cap = HOLD_MAX * 1200;
	}
	pthread_mutex_unlock(&batch_mu);
}

void gf_log_hold_prepare(void)
{
	pthread_mutex_lock(&hold_mu);
	/* Touched now: no page fault at the hold or at its release. */
	if (!held && (held = malloc(HOLD_MAX * sizeof(*held))))
		memset(held, 0, HOLD_MAX * sizeof(*held));
	if (!held_spare && (held_spare = malloc(HOLD_MAX * sizeof(*held_spare))))
		memset(held_spare, 0, HOLD_MAX * sizeof(*held_spare));
	pthread_mutex_unlock(&hold_mu);
	batch_prepare();
}

void gf_log_hold(void)
{
	gf_log_hold_prepare();
	pthread_mutex_lock(&hold_mu);
	/* One hold at a time: another thread's stays, this one's lines go out as usual. */
	if (held && !atomic_load(&holding)) {
		hold_owner = pthread_self();
		hold_since = gf_now_us();
		nheld = 0;
		atomic_store(&holding, true);
	}
	pthread_mutex_unlock(&hold_mu);
}

void gf_log_release(void)
{
	if (!atomic_load(&holding))
		return;
	pthread_mutex_lock(&hold_mu);
	if (!atomic_load(&holding)) {
		pthread_mutex_unlock(&hold_mu);
		return;
	}
	/* The lines leave with their buffer; the spare one takes its place
	 * (made again if a concurrent release still delivers from it). */
	int n = nheld;
	struct held_line *lines = held;
	held = held_spare;
	held_spare = NULL;
	nheld = 0;
	atomic_store(&holding, false);
	pthread_mutex_unlock(&hold_mu);
	/* Delivered outside hold_mu: a hook may log (it must not call back, but
	 * a hook that does must not deadlock here). */
	batch_prepare();
	pthread_mutex_lock(&batch_mu);
	batching = true;
	batch_len = 0;
	for (int i = 0; i < n; i++)
		deliver(lines[i].level, lines[i].component, lines[i].msg, lines[i].mono_us, lines[i].wall_us);
	batching = false;
	if (batch_len)
		fwrite(batch, 1, batch_len, stderr);
	pthread_mutex_unlock(&batch_mu);
	pthread_mutex_lock(&hold_mu);
	if (!held_spare)
		held_spare = lines;
	else if (!held)
		held = lines;
	else
		free(lines);
	pthread_mutex_unlock(&hold_mu);
}

enum hold_verdict { HOLD_NONE, HOLD_TAKEN, HOLD_RELEASE };

/* Whether the line joins the hold (this thread owns it, the line is info or
 * debug, the hold has room and is recent), goes out after a release (the
 * owner's warning or error, a full or old hold), or goes out as usual. */
static enum hold_verdict hold_line(int level, const char *component, const char *fmt, va_list ap, int64_t mono,
				   int64_t wall)
{
	pthread_mutex_lock(&hold_mu);
	enum hold_verdict v = HOLD_NONE;
	if (atomic_load(&holding) && pthread_equal(hold_owner, pthread_self())) {
		if (level >= GF_LOG_INFO && nheld < HOLD_MAX && mono - hold_since < HOLD_MAX_US) {
			struct held_line *h = &held[nheld++];
			gf_log_vformat(h->msg, sizeof(h->msg), fmt, ap);
			h->level = level;
			h->component = component;
			h->mono_us = mono;
			h->wall_us = wall;
			v = HOLD_TAKEN;
		} else {
			v = HOLD_RELEASE;
		}
	}
	pthread_mutex_unlock(&hold_mu);
	return v;
}

void gf_log(int level, const char *component, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	if (!gf_log_enabled(level))
		return;
	int64_t mono = gf_now_us(), wall = gf_wall_us();
	if (atomic_load(&holding)) {
		va_start(ap, fmt);
		enum hold_verdict v = hold_line(level, component, fmt, ap, mono, wall);
		va_end(ap);
		if (v == HOLD_TAKEN)
			return;
		/* The owner's warning or error, a full or old hold: what was held
		 * first, in order. Another thread's line goes out as usual. */
		if (v == HOLD_RELEASE)
			gf_log_release();
	}
	va_start(ap, fmt);
	gf_log_vformat(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	deliver(level, component, msg, mono, wall);
}
