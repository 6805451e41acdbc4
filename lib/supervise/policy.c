/* SPDX-License-Identifier: Apache-2.0 */
/* The supervisor's restart policy: a pure state machine per engine (no I/O,
 * no clock of its own), so every rule is unit-tested without processes. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "gpufailover/engine.h"
#include "policy.h"

#define MS 1000LL

void gf_sv_periods_default(struct gf_sv_periods *p)
{
	/* AppWrapper's defaults, plus our own revoke and stable periods (docs/design.md, decision 23);
	 * term_grace is AppWrapper's ForcefulDeletionGracePeriod, shorter (docs/supervisor.md says why). */
	p->admission_ms = 60 * MS;
	p->warmup_ms = 5 * 60 * MS;
	p->failure_grace_ms = 60 * MS;
	p->retry_pause_ms = 90 * MS;
	p->retry_limit = 3;
	p->term_grace_ms = 30 * MS;
	p->revoke_grace_ms = 10 * 60 * MS;
	/* AppWrapper's default too: a failed engine is cleaned up at once, never left holding the lock. */
	p->deletion_on_failure_grace_ms = 0;
	p->stable_ms = 10 * 60 * MS;
	p->maximum_ms = 24 * 60 * 60 * MS;
}

int gf_sv_periods_validate(struct gf_sv_periods *p, char *note, size_t note_len)
{
	struct {
		const char *key;
		int64_t *v;
	} f[] = {
		{ "admission", &p->admission_ms },         { "warmup", &p->warmup_ms },
		{ "failure_grace", &p->failure_grace_ms }, { "retry_pause", &p->retry_pause_ms },
		{ "term_grace", &p->term_grace_ms },       { "revoke_grace", &p->revoke_grace_ms },
		{ "deletion_on_failure_grace", &p->deletion_on_failure_grace_ms },
		{ "stable", &p->stable_ms },
	};
	if (note && note_len)
		note[0] = '\0';
	/* The cap keeps every period * 1000 (µs) far from int64 overflow. */
	if (p->maximum_ms <= 0 || p->maximum_ms > 100LL * 365 * 24 * 3600 * MS)
		return gf_err(GF_ERR_INVALID_ARG, "maximum: must be positive and at most 100 years");
	if (p->retry_limit < 0)
		return gf_err(GF_ERR_INVALID_ARG, "retry_limit: must not be negative");
	for (size_t i = 0; i < GF_ARRAY_SIZE(f); i++)
		if (*f[i].v < 0)
			return gf_err(GF_ERR_INVALID_ARG, "%s: must not be negative", f[i].key);
	for (size_t i = 0; i < GF_ARRAY_SIZE(f); i++) {
		if (*f[i].v <= p->maximum_ms)
			continue;
		*f[i].v = p->maximum_ms;
		if (note && note_len) {
			size_t used = strlen(note);
			snprintf(note + used, note_len - used, "%s%s clamped to %" PRId64 " ms",
				 used ? "; " : "", f[i].key, p->maximum_ms);
		}
	}
	/* A process cannot be warm before it was admitted (AppWrapper refuses it too). */
	if (p->admission_ms > p->warmup_ms)
		return gf_err(GF_ERR_INVALID_ARG, "admission: must not exceed warmup (%" PRId64 " ms > %" PRId64 " ms)",
			      p->admission_ms, p->warmup_ms);
	return 0;
}

const char *gf_sv_state_name(int state)
{
	static const char *const names[] = {
		[GF_SV_STOPPED] = "stopped",         [GF_SV_STARTING] = "starting", [GF_SV_WARMING] = "warming",
		[GF_SV_RUNNING] = "running",         [GF_SV_UNHEALTHY] = "unhealthy",
		[GF_SV_TERMINATING] = "terminating", [GF_SV_KILLING] = "killing",   [GF_SV_PAUSED] = "paused",
		[GF_SV_FAILED] = "failed",           [GF_SV_SUCCEEDED] = "succeeded", [GF_SV_HELD] = "held",
	};
	if (state < 0 || (size_t)state >= GF_ARRAY_SIZE(names) || !names[state])
		return "unknown";
	return names[state];
}

const char *gf_sv_exit_class_name(int cls)
{
	switch (cls) {
	case GF_SV_EXIT_NONE: return "none";
	case GF_SV_EXIT_SUCCESS: return "success";
	case GF_SV_EXIT_RETRYABLE: return "retryable";
	case GF_SV_EXIT_TERMINAL: return "terminal";
	case GF_SV_EXIT_PLANNED: return "planned";
	default: return "unknown";
	}
}

void gf_sv_init(struct gf_sv_engine *e)
{
	memset(e, 0, sizeof(*e));
	e->state = GF_SV_STOPPED;
	e->last_exit_status = -1;
	snprintf(e->reason, sizeof(e->reason), "not started");
}

static void enter(struct gf_sv_engine *e, int state, int64_t now, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void enter(struct gf_sv_engine *e, int state, int64_t now, const char *fmt, ...)
{
	if (e->state != state)
		e->since_us = now;
	e->state = state;
	if (state != GF_SV_RUNNING)
		e->healthy_since_us = 0;
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(e->reason, sizeof(e->reason), fmt, ap);
		va_end(ap);
	}
}

static int spawn(struct gf_sv_engine *e, int64_t now)
{
	if (e->spawned_us)
		e->restarts++;
	e->spawned_us = now;
	e->alive = 1;
	e->revoked = 0;
	enter(e, GF_SV_STARTING, now, "started; waiting for the probe server");
	return GF_SV_ACT_SPAWN;
}

static int is_terminal(int status, const int *terminal, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (terminal[i] == status)
			return 1;
	return 0;
}

/* The pause before the next start: retry_pause, but after failed spawns at
 * least GF_SV_SPAWN_RETRY_MIN_MS, doubled for each further one in a row up
 * to GF_SV_SPAWN_RETRY_MAX_MS. A spawn fails at once, so with retry_pause 0
 * and a high retry_limit the retries would otherwise spin. */
static int64_t pause_ms(const struct gf_sv_engine *e, const struct gf_sv_periods *p)
{
	if (e->spawn_failures == 0)
		return p->retry_pause_ms;
	int64_t backoff = GF_SV_SPAWN_RETRY_MIN_MS;
	for (int64_t i = 1; i < e->spawn_failures && backoff < GF_SV_SPAWN_RETRY_MAX_MS; i++)
		backoff *= 2;
	if (backoff > GF_SV_SPAWN_RETRY_MAX_MS)
		backoff = GF_SV_SPAWN_RETRY_MAX_MS;
	return p->retry_pause_ms > backoff ? p->retry_pause_ms : backoff;
}

/* The reset after a failure whose process is gone: count a retry and pause
 * (or restart at once), or Failed when no retry is left. */
static int reset_after(struct gf_sv_engine *e, const struct gf_sv_periods *p, int64_t now, const char *what)
{
	if (e->retries >= p->retry_limit) {
		enter(e, GF_SV_FAILED, now, "retry limit %" PRId64 " reached (last: %s)", p->retry_limit, what);
		return 0;
	}
	e->retries++;
	e->pause_ms = pause_ms(e, p);
	if (e->pause_ms == 0) {
		int act = spawn(e, now);
		snprintf(e->reason, sizeof(e->reason), "restarted (retry %" PRId64 "/%" PRId64 ") after %s",
			 e->retries, p->retry_limit, what);
		return act;
	}
	enter(e, GF_SV_PAUSED, now, "retry %" PRId64 "/%" PRId64 " in %" PRId64 " ms after %s", e->retries,
	      p->retry_limit, e->pause_ms, what);
	return 0;
}

/* The current process is gone (exited, failed to start, or given up on after
 * revocation): decide between restart, pause and the end states. @planned:
 * the exit is the switchover's own (see GF_SV_EV_EXITED). @graced: a
 * retryable failure waits the failure grace before its reset. */
static int after_exit(struct gf_sv_engine *e, const struct gf_sv_periods *p, int cls, int planned, int graced,
		      int64_t now, const char *what)
{
	int reset = e->state == GF_SV_TERMINATING || e->state == GF_SV_KILLING || e->state == GF_SV_HELD;
	e->alive = 0;
	e->planned = 0;
	e->last_exit_class = cls;
	if (e->stopping) {
		enter(e, GF_SV_STOPPED, now, "stopped on request (%s)", what);
		return 0;
	}
	if (planned) {
		/* A planned switchover is no failure: restart at once, count nothing. */
		e->last_exit_class = GF_SV_EXIT_PLANNED;
		int act = spawn(e, now);
		snprintf(e->reason, sizeof(e->reason), "restarted after a planned switchover (%s)", what);
		return act;
	}
	if (cls == GF_SV_EXIT_TERMINAL) {
		enter(e, GF_SV_FAILED, now, "terminal exit (%s): not retried", what);
		return 0;
	}
	if (cls == GF_SV_EXIT_SUCCESS && !reset) {
		enter(e, GF_SV_SUCCEEDED, now, "exited successfully (%s)", what);
		return 0;
	}
	/* AppWrapper acts on a failed pod only after the failure grace, like on
	 * any other failure; the grace runs from the first sign of failure (an
	 * exit while already Unhealthy keeps its start). After the supervisor's
	 * own SIGTERM or SIGKILL that grace is already spent. */
	if (graced && !reset && p->failure_grace_ms > 0) {
		snprintf(e->exit_what, sizeof(e->exit_what), "%s", what);
		enter(e, GF_SV_UNHEALTHY, now, "%s; failure grace before the reset", what);
		return 0;
	}
	return reset_after(e, p, now, what);
}

static int unhealthy(struct gf_sv_engine *e, int64_t now, const char *why)
{
	if (e->state != GF_SV_UNHEALTHY)
		enter(e, GF_SV_UNHEALTHY, now, "%s", why);
	return 0;
}

int gf_sv_step(struct gf_sv_engine *e, const struct gf_sv_periods *p, const struct gf_sv_input *in)
{
	int event = in->event, exit_status = in->exit_status, exit_signal = in->exit_signal;
	const struct gf_sv_probe *probe = in->probe;
	const int *terminal = in->terminal;
	size_t n_terminal = in->n_terminal;
	int64_t now_us = in->now_us;
	char what[64];
	switch (event) {
	case GF_SV_EV_START:
		if (e->alive || (e->state != GF_SV_STOPPED && e->state != GF_SV_FAILED &&
				 e->state != GF_SV_SUCCEEDED))
			return 0;
		e->stopping = 0;
		e->retries = 0;
		e->spawn_failures = 0;
		return spawn(e, now_us);

	case GF_SV_EV_SPAWN_FAILED:
		if (!e->alive)
			return 0;
		e->last_exit_status = -1;
		e->last_exit_signal = 0;
		e->spawn_failures++;
		return after_exit(e, p, GF_SV_EXIT_RETRYABLE, 0, 0, now_us, "spawn failed");

	case GF_SV_EV_EXITED: {
		if (!e->alive)
			return 0;
		int cls;
		e->spawn_failures = 0;
		e->last_exit_status = exit_status;
		e->last_exit_signal = exit_signal;
		if (exit_signal > 0) {
			cls = GF_SV_EXIT_RETRYABLE;
			snprintf(what, sizeof(what), "killed by signal %d", exit_signal);
		} else {
			cls = exit_status == 0 ? GF_SV_EXIT_SUCCESS
			      : is_terminal(exit_status, terminal, n_terminal) ? GF_SV_EXIT_TERMINAL
										: GF_SV_EXIT_RETRYABLE;
			snprintf(what, sizeof(what), "exit status %d", exit_status);
		}
		/* Planned only when a switchover was asked of this process and it
		 * ended the way a step-down does (75, or 0): a status on its own
		 * proves nothing, and a crash loop of "exit 75" must meet the retry
		 * pause and limit like any other. */
		int planned = e->planned && exit_signal == 0 &&
			      (exit_status == GF_ENGINE_EXIT_SWITCHOVER || exit_status == 0);
		return after_exit(e, p, cls, planned, 1, now_us, what);
	}

	case GF_SV_EV_PROBE: {
		if (!probe || !e->alive)
			return 0;
		int healthy = probe->reachable && probe->startup_ok && probe->live_ok;
		switch (e->state) {
		case GF_SV_STARTING:
			if (healthy)
				break;
			if (probe->reachable)
				enter(e, GF_SV_WARMING, now_us, "probe server up; waiting for /startup");
			return 0;
		case GF_SV_WARMING:
			if (healthy)
				break;
			return 0;
		case GF_SV_RUNNING:
			if (!healthy)
				return unhealthy(e, now_us, !probe->reachable ? "probe server not answering"
							    : !probe->live_ok ? "/live failing"
									      : "/startup failing");
			return 0;
		case GF_SV_UNHEALTHY:
			if (healthy)
				break;
			return 0;
		default:
			return 0;
		}
		enter(e, GF_SV_RUNNING, now_us, "healthy");
		e->healthy_since_us = now_us;
		return 0;
	}

	case GF_SV_EV_TICK:
		switch (e->state) {
		case GF_SV_STARTING:
			if (now_us - e->spawned_us >= p->admission_ms * MS)
				return unhealthy(e, now_us, "admission period passed: probe server not answering");
			return 0;
		case GF_SV_WARMING:
			if (now_us - e->spawned_us >= p->warmup_ms * MS)
				return unhealthy(e, now_us, "warmup period passed: /startup not 200");
			return 0;
		case GF_SV_RUNNING:
			/* A long enough healthy run forgives earlier failures. */
			if (e->retries && e->healthy_since_us && now_us - e->healthy_since_us >= p->stable_ms * MS)
				e->retries = 0;
			return 0;
		case GF_SV_UNHEALTHY:
			if (now_us - e->since_us < p->failure_grace_ms * MS)
				return 0;
			if (!e->alive)
				return reset_after(e, p, now_us, e->exit_what);
			/* AppWrapper's DeletionOnFailureGracePeriod: with no retry left, keep
			 * the failed process (and so its lock) for an operator to inspect. */
			if (e->retries >= p->retry_limit && p->deletion_on_failure_grace_ms > 0) {
				enter(e, GF_SV_HELD, now_us, "%.100s; no retry left: held for debugging", e->reason);
				return 0;
			}
			enter(e, GF_SV_TERMINATING, now_us, "%.100s for the failure grace: SIGTERM", e->reason);
			return GF_SV_ACT_TERM;
		case GF_SV_HELD:
			if (now_us - e->since_us < p->deletion_on_failure_grace_ms * MS)
				return 0;
			enter(e, GF_SV_TERMINATING, now_us, "held for the deletion-on-failure grace: SIGTERM");
			return GF_SV_ACT_TERM;
		case GF_SV_TERMINATING:
			if (now_us - e->since_us < p->term_grace_ms * MS)
				return 0;
			enter(e, GF_SV_KILLING, now_us, "no exit within the term grace: SIGKILL");
			return GF_SV_ACT_KILL;
		case GF_SV_KILLING:
			if (now_us - e->since_us < p->revoke_grace_ms * MS)
				return 0;
			/* The process will not die (uninterruptible sleep in a driver): revoke its
			 * lock so the standby takes over anyway, and move on without it. */
			e->revoked = 1;
			e->last_exit_status = -1;
			e->last_exit_signal = 0;
			return GF_SV_ACT_REVOKE |
			       after_exit(e, p, GF_SV_EXIT_RETRYABLE, 0, 0, now_us, "no exit after SIGKILL; lock revoked");
		case GF_SV_PAUSED:
			if (now_us - e->since_us < e->pause_ms * MS)
				return 0;
			return spawn(e, now_us);
		default:
			return 0;
		}

	case GF_SV_EV_STOP:
		e->stopping = 1;
		if (!e->alive) {
			if (e->state == GF_SV_PAUSED || e->state == GF_SV_UNHEALTHY)
				enter(e, GF_SV_STOPPED, now_us, "stopped on request");
			return 0;
		}
		if (e->state == GF_SV_TERMINATING || e->state == GF_SV_KILLING)
			return 0;
		enter(e, GF_SV_TERMINATING, now_us, "stopping on request: SIGTERM");
		return GF_SV_ACT_TERM;

	case GF_SV_EV_SWITCHOVER:
		if (e->alive)
			e->planned = 1;
		return 0;

	default:
		return 0;
	}
}

int64_t gf_sv_next_deadline(const struct gf_sv_engine *e, const struct gf_sv_periods *p)
{
	switch (e->state) {
	case GF_SV_STARTING: return e->spawned_us + p->admission_ms * MS;
	case GF_SV_WARMING: return e->spawned_us + p->warmup_ms * MS;
	case GF_SV_RUNNING:
		return e->retries && e->healthy_since_us ? e->healthy_since_us + p->stable_ms * MS : INT64_MAX;
	case GF_SV_UNHEALTHY: return e->since_us + p->failure_grace_ms * MS;
	case GF_SV_TERMINATING: return e->since_us + p->term_grace_ms * MS;
	case GF_SV_KILLING: return e->since_us + p->revoke_grace_ms * MS;
	case GF_SV_HELD: return e->since_us + p->deletion_on_failure_grace_ms * MS;
	case GF_SV_PAUSED: return e->since_us + e->pause_ms * MS;
	default: return INT64_MAX;
	}
}

int gf_sv_wants_probes(const struct gf_sv_engine *e)
{
	return e->alive && e->state >= GF_SV_STARTING && e->state <= GF_SV_UNHEALTHY;
}
