/* SPDX-License-Identifier: Apache-2.0 */
/* The supervisor's restart policy, driven event by event with a fake clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../common/testutil.h"

#include "gpufailover.h"
#include "policy.h"

#define S 1000000LL /* one second in µs */

static const int terminal[] = { 2, 64, 78 };

struct sim {
	struct gf_sv_engine e;
	struct gf_sv_periods p;
	int64_t now;
};

static void sim_init(struct sim *s)
{
	gf_sv_init(&s->e);
	gf_sv_periods_default(&s->p);
	/* Short, distinct periods so each expiry is unambiguous. */
	s->p.admission_ms = 10000;
	s->p.warmup_ms = 20000;
	s->p.failure_grace_ms = 5000;
	s->p.retry_pause_ms = 3000;
	s->p.retry_limit = 2;
	s->p.term_grace_ms = 2000;
	s->p.revoke_grace_ms = 4000;
	s->p.deletion_on_failure_grace_ms = 0;
	s->p.stable_ms = 60000;
	assert_int_equal(gf_sv_periods_validate(&s->p, NULL, 0), 0);
	s->now = 1000 * S;
}

static int ev(struct sim *s, int event)
{
	struct gf_sv_input in = { .event = event, .terminal = terminal, .n_terminal = 3, .now_us = s->now };
	return gf_sv_step(&s->e, &s->p, &in);
}

static int probe(struct sim *s, int reachable, int startup, int live)
{
	struct gf_sv_probe pr = { reachable, startup, live };
	struct gf_sv_input in = { .event = GF_SV_EV_PROBE, .probe = &pr, .terminal = terminal, .n_terminal = 3,
				  .now_us = s->now };
	return gf_sv_step(&s->e, &s->p, &in);
}

static int exited(struct sim *s, int status, int sig)
{
	struct gf_sv_input in = { .event = GF_SV_EV_EXITED, .exit_status = status, .exit_signal = sig,
				  .terminal = terminal, .n_terminal = 3, .now_us = s->now };
	return gf_sv_step(&s->e, &s->p, &in);
}

/* Advance the clock to the policy's next deadline and tick. */
static int tick_to_deadline(struct sim *s)
{
	int64_t d = gf_sv_next_deadline(&s->e, &s->p);
	assert_true(d != INT64_MAX);
	if (d > s->now)
		s->now = d;
	return ev(s, GF_SV_EV_TICK);
}

/* A retryable exit of the process on its own: Unhealthy for the failure
 * grace, then the reset. Returns the reset's actions. */
static int crashed(struct sim *s, int status, int sig)
{
	assert_int_equal(exited(s, status, sig), 0);
	assert_int_equal(s->e.state, GF_SV_UNHEALTHY);
	return tick_to_deadline(s);
}

static void start_healthy(struct sim *s)
{
	assert_int_equal(ev(s, GF_SV_EV_START), GF_SV_ACT_SPAWN);
	assert_int_equal(s->e.state, GF_SV_STARTING);
	s->now += S;
	probe(s, 1, 0, 0);
	assert_int_equal(s->e.state, GF_SV_WARMING);
	s->now += S;
	probe(s, 1, 1, 1);
	assert_int_equal(s->e.state, GF_SV_RUNNING);
}

static void test_defaults_are_appwrapper(void **state)
{
	(void)state;
	struct gf_sv_periods p;
	gf_sv_periods_default(&p);
	assert_int_equal(p.admission_ms, 60000);
	assert_int_equal(p.warmup_ms, 300000);
	assert_int_equal(p.failure_grace_ms, 60000);
	assert_int_equal(p.retry_pause_ms, 90000);
	assert_int_equal(p.retry_limit, 3);
	assert_int_equal(p.term_grace_ms, 30000);
	assert_int_equal(p.revoke_grace_ms, 600000);
	/* Off by default, as in AppWrapper: a failed engine never keeps its lock. */
	assert_int_equal(p.deletion_on_failure_grace_ms, 0);
	assert_int_equal(p.maximum_ms, 86400000);
	assert_int_equal(gf_sv_periods_validate(&p, NULL, 0), 0);
}

static void test_validation(void **state)
{
	(void)state;
	struct gf_sv_periods p;
	char note[256];

	gf_sv_periods_default(&p);
	p.admission_ms = p.warmup_ms + 1;
	assert_int_equal(gf_sv_periods_validate(&p, note, sizeof(note)), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "admission"));

	gf_sv_periods_default(&p);
	p.retry_pause_ms = -1;
	assert_int_equal(gf_sv_periods_validate(&p, note, sizeof(note)), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "retry_pause"));

	gf_sv_periods_default(&p);
	p.retry_limit = -3;
	assert_int_equal(gf_sv_periods_validate(&p, note, sizeof(note)), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "retry_limit"));

	/* Above the maximum: clamped, and the clamp is reported. */
	gf_sv_periods_default(&p);
	p.maximum_ms = 120000;
	assert_int_equal(gf_sv_periods_validate(&p, note, sizeof(note)), 0);
	assert_int_equal(p.warmup_ms, 120000);
	assert_int_equal(p.revoke_grace_ms, 120000);
	assert_int_equal(p.admission_ms, 60000);
	assert_non_null(strstr(note, "warmup clamped to 120000 ms"));
	assert_non_null(strstr(note, "revoke_grace clamped"));

	gf_sv_periods_default(&p);
	p.deletion_on_failure_grace_ms = -1;
	assert_int_equal(gf_sv_periods_validate(&p, note, sizeof(note)), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "deletion_on_failure_grace"));

	/* Clamping can make admission > warmup impossible to honour: refused. */
	gf_sv_periods_default(&p);
	p.maximum_ms = 30000;
	p.admission_ms = 30000;
	p.warmup_ms = 20000;
	assert_int_equal(gf_sv_periods_validate(&p, note, sizeof(note)), GF_ERR_INVALID_ARG);

	gf_sv_periods_default(&p);
	p.maximum_ms = 0;
	assert_int_equal(gf_sv_periods_validate(&p, note, sizeof(note)), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "maximum"));
}

static void test_names(void **state)
{
	(void)state;
	assert_string_equal(gf_sv_state_name(GF_SV_RUNNING), "running");
	assert_string_equal(gf_sv_state_name(GF_SV_FAILED), "failed");
	assert_string_equal(gf_sv_state_name(GF_SV_HELD), "held");
	assert_string_equal(gf_sv_state_name(99), "unknown");
	assert_string_equal(gf_sv_state_name(-1), "unknown");
	assert_string_equal(gf_sv_exit_class_name(GF_SV_EXIT_TERMINAL), "terminal");
}

static void test_crash_loop_reaches_retry_limit(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	for (int i = 1; i <= 2; i++) {
		s.now += S;
		assert_int_equal(crashed(&s, 1, 0), 0);
		assert_int_equal(s.e.state, GF_SV_PAUSED);
		assert_int_equal(s.e.retries, i);
		assert_int_equal(s.e.last_exit_class, GF_SV_EXIT_RETRYABLE);
		/* The pause is honoured: no spawn before it ends. */
		s.now += 1000;
		assert_int_equal(ev(&s, GF_SV_EV_TICK), 0);
		assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_SPAWN);
		assert_int_equal(s.e.state, GF_SV_STARTING);
	}
	s.now += S;
	assert_int_equal(crashed(&s, 0, 9), 0);
	assert_int_equal(s.e.state, GF_SV_FAILED);
	assert_non_null(strstr(s.e.reason, "retry limit 2"));
	assert_int_equal(s.e.restarts, 2);
	assert_int_equal(gf_sv_next_deadline(&s.e, &s.p), INT64_MAX);
	/* Failed is final until started again by hand. */
	assert_int_equal(ev(&s, GF_SV_EV_TICK), 0);
	assert_int_equal(ev(&s, GF_SV_EV_START), GF_SV_ACT_SPAWN);
	assert_int_equal(s.e.retries, 0);
}

static void test_stable_period_resets_retries(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	crashed(&s, 1, 0);
	tick_to_deadline(&s);
	probe(&s, 1, 1, 1);
	assert_int_equal(s.e.state, GF_SV_RUNNING);
	assert_int_equal(s.e.retries, 1);
	/* Healthy for less than the stable period: the counter stays. */
	s.now += 30 * S;
	ev(&s, GF_SV_EV_TICK);
	assert_int_equal(s.e.retries, 1);
	assert_int_equal(tick_to_deadline(&s), 0);
	assert_int_equal(s.e.retries, 0);
	assert_int_equal(gf_sv_next_deadline(&s.e, &s.p), INT64_MAX);
}

static void test_terminal_exit_not_retried(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	assert_int_equal(exited(&s, 78, 0), 0);
	assert_int_equal(s.e.state, GF_SV_FAILED);
	assert_int_equal(s.e.last_exit_class, GF_SV_EXIT_TERMINAL);
	assert_int_equal(s.e.retries, 0);
	assert_non_null(strstr(s.e.reason, "terminal"));
}

static void test_success_exit(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	assert_int_equal(exited(&s, 0, 0), 0);
	assert_int_equal(s.e.state, GF_SV_SUCCEEDED);
}

static void test_hung_engine_escalates_to_revocation(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	s.now += S;
	probe(&s, 0, 0, 0); /* SIGSTOPped: the probe server stops answering */
	assert_int_equal(s.e.state, GF_SV_UNHEALTHY);
	/* A failing probe inside the failure grace is only debounced. */
	s.now += 2 * S;
	probe(&s, 1, 1, 0);
	assert_int_equal(ev(&s, GF_SV_EV_TICK), 0);
	assert_int_equal(s.e.state, GF_SV_UNHEALTHY);
	assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_TERM);
	assert_int_equal(s.e.state, GF_SV_TERMINATING);
	assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_KILL);
	assert_int_equal(s.e.state, GF_SV_KILLING);
	/* Probes no longer matter once the reset began. */
	assert_int_equal(gf_sv_wants_probes(&s.e), 0);
	int act = tick_to_deadline(&s);
	assert_true(act & GF_SV_ACT_REVOKE);
	assert_int_equal(s.e.revoked, 1);
	assert_int_equal(s.e.alive, 0);
	assert_int_equal(s.e.state, GF_SV_PAUSED);
	assert_int_equal(s.e.retries, 1);
	/* A late exit of the given-up process is not fed twice. */
	assert_int_equal(exited(&s, -1, 9), 0);
	assert_int_equal(s.e.retries, 1);
	assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_SPAWN);
}

static void test_debounce_recovers(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	probe(&s, 1, 1, 0);
	assert_int_equal(s.e.state, GF_SV_UNHEALTHY);
	s.now += S;
	probe(&s, 1, 1, 1);
	assert_int_equal(s.e.state, GF_SV_RUNNING);
	assert_int_equal(s.e.retries, 0);
}

static void test_sigkill_reset_counts_once(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	probe(&s, 1, 0, 0);
	tick_to_deadline(&s); /* TERM */
	s.now += 500000;
	/* The engine shuts down cleanly on SIGTERM: still a reset, counted. */
	assert_int_equal(exited(&s, 0, 0), 0);
	assert_int_equal(s.e.state, GF_SV_PAUSED);
	assert_int_equal(s.e.retries, 1);
}

static void test_admission_and_warmup(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	ev(&s, GF_SV_EV_START);
	/* Never answers: admission passes, then the failure grace. */
	assert_int_equal(tick_to_deadline(&s), 0);
	assert_int_equal(s.e.state, GF_SV_UNHEALTHY);
	assert_non_null(strstr(s.e.reason, "admission"));
	assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_TERM);

	sim_init(&s);
	ev(&s, GF_SV_EV_START);
	probe(&s, 1, 0, 0);
	assert_int_equal(s.e.state, GF_SV_WARMING);
	/* Warmup is measured from the spawn, not from the first answer. */
	assert_int_equal(gf_sv_next_deadline(&s.e, &s.p), s.e.spawned_us + 20 * S);
	tick_to_deadline(&s);
	assert_int_equal(s.e.state, GF_SV_UNHEALTHY);
	assert_non_null(strstr(s.e.reason, "warmup"));
	/* Reaching Standby late, within the failure grace, still counts. */
	probe(&s, 1, 1, 1);
	assert_int_equal(s.e.state, GF_SV_RUNNING);
}

static void test_switchover_is_not_a_retry(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	ev(&s, GF_SV_EV_SWITCHOVER);
	assert_int_equal(exited(&s, 75, 0), GF_SV_ACT_SPAWN);
	assert_int_equal(s.e.retries, 0);
	assert_int_equal(s.e.last_exit_class, GF_SV_EXIT_PLANNED);
	assert_int_equal(s.e.state, GF_SV_STARTING);
	/* Only the next exit was planned. */
	probe(&s, 1, 1, 1);
	crashed(&s, 1, 0);
	assert_int_equal(s.e.retries, 1);
}

/* Status 75 proves nothing by itself: without a switchover asked of the
 * process it is a failure like any other, paused and counted to the limit. */
static void test_exit_75_without_a_switchover_is_retried(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	assert_int_equal(crashed(&s, 75, 0), 0);
	assert_int_equal(s.e.state, GF_SV_PAUSED);
	assert_int_equal(s.e.retries, 1);
	assert_int_equal(s.e.last_exit_class, GF_SV_EXIT_RETRYABLE);
	assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_SPAWN);
	assert_int_equal(crashed(&s, 75, 0), 0);
	assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_SPAWN);
	assert_int_equal(crashed(&s, 75, 0), 0);
	assert_int_equal(s.e.state, GF_SV_FAILED);
	assert_int_equal(s.e.restarts, 2);
}

/* A switchover asked of a process that then crashes (or is killed) is a
 * failure: only the step-down's own exit is planned. */
static void test_crash_after_a_switchover_request_is_retried(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	ev(&s, GF_SV_EV_SWITCHOVER);
	assert_int_equal(crashed(&s, 1, 0), 0);
	assert_int_equal(s.e.last_exit_class, GF_SV_EXIT_RETRYABLE);
	assert_int_equal(s.e.retries, 1);
	assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_SPAWN);
	probe(&s, 1, 1, 1);
	ev(&s, GF_SV_EV_SWITCHOVER);
	assert_int_equal(crashed(&s, -1, 9), 0);
	assert_int_equal(s.e.last_exit_class, GF_SV_EXIT_RETRYABLE);
	assert_int_equal(s.e.retries, 2);
	/* And a request does not outlive its process. */
	assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_SPAWN);
	probe(&s, 1, 1, 1);
	assert_int_equal(crashed(&s, 75, 0), 0);
	assert_int_equal(s.e.state, GF_SV_FAILED);
}

static void test_stop(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	assert_int_equal(ev(&s, GF_SV_EV_STOP), GF_SV_ACT_TERM);
	assert_int_equal(exited(&s, 70, 0), 0);
	assert_int_equal(s.e.state, GF_SV_STOPPED);
	assert_int_equal(s.e.retries, 0);

	/* Stop during a pause: no restart. */
	sim_init(&s);
	start_healthy(&s);
	crashed(&s, 1, 0);
	assert_int_equal(s.e.state, GF_SV_PAUSED);
	assert_int_equal(ev(&s, GF_SV_EV_STOP), 0);
	assert_int_equal(s.e.state, GF_SV_STOPPED);
	assert_int_equal(ev(&s, GF_SV_EV_TICK), 0);

	/* Stop during the failure grace after an exit: no reset, no restart. */
	sim_init(&s);
	start_healthy(&s);
	exited(&s, 1, 0);
	assert_int_equal(s.e.state, GF_SV_UNHEALTHY);
	assert_int_equal(ev(&s, GF_SV_EV_STOP), 0);
	assert_int_equal(s.e.state, GF_SV_STOPPED);
	s.now += 60 * S;
	assert_int_equal(ev(&s, GF_SV_EV_TICK), 0);
	assert_int_equal(s.e.retries, 0);
}

static void test_spawn_failure(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	ev(&s, GF_SV_EV_START);
	assert_int_equal(ev(&s, GF_SV_EV_SPAWN_FAILED), 0);
	assert_int_equal(s.e.state, GF_SV_PAUSED);
	assert_int_equal(s.e.retries, 1);
	assert_int_equal(gf_sv_next_deadline(&s.e, &s.p), s.now + s.p.retry_pause_ms * 1000);
}

/* A spawn fails at once: with retry_pause 0 the retries still wait a
 * backoff (100 ms, doubling to 5 s), never restart from inside the failure
 * (the supervisor once recursed until its stack ran out), and the engine
 * ends Failed at its retry limit. */
static void test_spawn_failure_backs_off_without_a_pause(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	s.p.retry_pause_ms = 0;
	s.p.retry_limit = 100000;
	ev(&s, GF_SV_EV_START);
	int64_t expect = GF_SV_SPAWN_RETRY_MIN_MS;
	for (int i = 1; i <= 12; i++) {
		assert_int_equal(ev(&s, GF_SV_EV_SPAWN_FAILED), 0);
		assert_int_equal(s.e.state, GF_SV_PAUSED);
		assert_int_equal(s.e.retries, i);
		assert_int_equal(gf_sv_next_deadline(&s.e, &s.p), s.now + expect * 1000);
		s.now += expect * 1000 - 1;
		assert_int_equal(ev(&s, GF_SV_EV_TICK), 0);
		s.now += 1;
		assert_int_equal(ev(&s, GF_SV_EV_TICK), GF_SV_ACT_SPAWN);
		expect = expect * 2 > GF_SV_SPAWN_RETRY_MAX_MS ? GF_SV_SPAWN_RETRY_MAX_MS : expect * 2;
	}
	/* A process that ran ends the backoff: its exit pauses retry_pause (0). */
	assert_int_equal(exited(&s, 1, 0) & GF_SV_ACT_SPAWN, 0);
	s.now += s.p.failure_grace_ms * 1000;
	assert_int_equal(ev(&s, GF_SV_EV_TICK), GF_SV_ACT_SPAWN);
	/* The retry limit ends it. */
	s.p.retry_limit = s.e.retries + 2;
	for (int i = 0; i < 2; i++) {
		assert_int_equal(ev(&s, GF_SV_EV_SPAWN_FAILED), 0);
		tick_to_deadline(&s);
	}
	assert_int_equal(ev(&s, GF_SV_EV_SPAWN_FAILED), 0);
	assert_int_equal(s.e.state, GF_SV_FAILED);
	assert_non_null(strstr(s.e.reason, "retry limit"));
}

static void test_retry_limit_zero(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	s.p.retry_limit = 0;
	start_healthy(&s);
	crashed(&s, 1, 0);
	assert_int_equal(s.e.state, GF_SV_FAILED);
}

/* FailureGracePeriod applies to an exit too: the reset (retry counted, pause
 * started) waits the failure grace, counted from the first sign of failure. */
static void test_exit_waits_the_failure_grace(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	int64_t t0 = s.now;
	assert_int_equal(exited(&s, 1, 0), 0);
	assert_int_equal(s.e.state, GF_SV_UNHEALTHY);
	assert_int_equal(s.e.retries, 0);
	assert_int_equal(s.e.alive, 0);
	assert_non_null(strstr(s.e.reason, "exit status 1"));
	assert_int_equal(gf_sv_wants_probes(&s.e), 0);
	assert_int_equal(gf_sv_next_deadline(&s.e, &s.p), t0 + 5 * S);
	/* A late probe answer of the gone process changes nothing. */
	s.now = t0 + 5 * S - 1;
	probe(&s, 1, 1, 1);
	assert_int_equal(ev(&s, GF_SV_EV_TICK), 0);
	assert_int_equal(s.e.state, GF_SV_UNHEALTHY);
	s.now = t0 + 5 * S;
	assert_int_equal(ev(&s, GF_SV_EV_TICK), 0);
	assert_int_equal(s.e.state, GF_SV_PAUSED);
	assert_int_equal(s.e.retries, 1);
	assert_non_null(strstr(s.e.reason, "after exit status 1"));
	/* Then the retry pause, as before. */
	assert_int_equal(gf_sv_next_deadline(&s.e, &s.p), t0 + 8 * S);

	/* An exit while a failing probe's grace already runs keeps its start. */
	sim_init(&s);
	start_healthy(&s);
	t0 = s.now;
	probe(&s, 1, 1, 0);
	assert_int_equal(s.e.state, GF_SV_UNHEALTHY);
	s.now = t0 + 3 * S;
	assert_int_equal(exited(&s, -1, 11), 0);
	assert_int_equal(gf_sv_next_deadline(&s.e, &s.p), t0 + 5 * S);
	assert_int_equal(tick_to_deadline(&s), 0);
	assert_int_equal(s.e.state, GF_SV_PAUSED);

	/* failure_grace 0: the reset at once. */
	sim_init(&s);
	s.p.failure_grace_ms = 0;
	start_healthy(&s);
	assert_int_equal(exited(&s, 1, 0), 0);
	assert_int_equal(s.e.state, GF_SV_PAUSED);
	assert_int_equal(s.e.retries, 1);
}

/* term_grace is AppWrapper's ForcefulDeletionGracePeriod (normal delete →
 * forceful delete: SIGTERM → SIGKILL); revoke_grace is ours (SIGKILL → revoke). */
static void test_term_grace_then_revoke_grace(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	start_healthy(&s);
	probe(&s, 1, 1, 0);
	assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_TERM);
	int64_t t = s.now;
	assert_int_equal(gf_sv_next_deadline(&s.e, &s.p), t + 2 * S);
	s.now = t + 2 * S - 1;
	assert_int_equal(ev(&s, GF_SV_EV_TICK), 0);
	s.now = t + 2 * S;
	assert_int_equal(ev(&s, GF_SV_EV_TICK), GF_SV_ACT_KILL);
	t = s.now;
	assert_int_equal(gf_sv_next_deadline(&s.e, &s.p), t + 4 * S);
	s.now = t + 4 * S - 1;
	assert_int_equal(ev(&s, GF_SV_EV_TICK), 0);
	s.now = t + 4 * S;
	assert_true(ev(&s, GF_SV_EV_TICK) & GF_SV_ACT_REVOKE);
}

/* DeletionOnFailureGracePeriod: a failure with no retry left keeps the
 * process (Held) that long before it is terminated; with retries left, or
 * at its default 0, nothing is held. */
static void test_deletion_on_failure_grace_holds_a_failed_engine(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s);
	s.p.retry_limit = 0;
	s.p.deletion_on_failure_grace_ms = 7000;
	start_healthy(&s);
	probe(&s, 1, 1, 0);
	assert_int_equal(tick_to_deadline(&s), 0);
	assert_int_equal(s.e.state, GF_SV_HELD);
	assert_int_equal(s.e.alive, 1);
	assert_int_equal(gf_sv_wants_probes(&s.e), 0);
	assert_non_null(strstr(s.e.reason, "held for debugging"));
	int64_t t = s.now;
	assert_int_equal(gf_sv_next_deadline(&s.e, &s.p), t + 7 * S);
	/* A healthy answer does not undo a failure with no retry left. */
	s.now = t + 7 * S - 1;
	probe(&s, 1, 1, 1);
	assert_int_equal(ev(&s, GF_SV_EV_TICK), 0);
	assert_int_equal(s.e.state, GF_SV_HELD);
	s.now = t + 7 * S;
	assert_int_equal(ev(&s, GF_SV_EV_TICK), GF_SV_ACT_TERM);
	assert_int_equal(s.e.state, GF_SV_TERMINATING);
	assert_int_equal(exited(&s, 0, 0), 0);
	assert_int_equal(s.e.state, GF_SV_FAILED);

	/* The held process dying on its own: Failed at once. */
	sim_init(&s);
	s.p.retry_limit = 0;
	s.p.deletion_on_failure_grace_ms = 7000;
	start_healthy(&s);
	probe(&s, 1, 1, 0);
	tick_to_deadline(&s);
	assert_int_equal(s.e.state, GF_SV_HELD);
	assert_int_equal(exited(&s, -1, 9), 0);
	assert_int_equal(s.e.state, GF_SV_FAILED);

	/* A stop request ends the hold. */
	sim_init(&s);
	s.p.retry_limit = 0;
	s.p.deletion_on_failure_grace_ms = 7000;
	start_healthy(&s);
	probe(&s, 1, 1, 0);
	tick_to_deadline(&s);
	assert_int_equal(ev(&s, GF_SV_EV_STOP), GF_SV_ACT_TERM);

	/* Retries left: no hold. */
	sim_init(&s);
	s.p.deletion_on_failure_grace_ms = 7000;
	start_healthy(&s);
	probe(&s, 1, 1, 0);
	assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_TERM);

	/* The default (0): no hold even on the last failure. */
	sim_init(&s);
	s.p.retry_limit = 0;
	start_healthy(&s);
	probe(&s, 1, 1, 0);
	assert_int_equal(tick_to_deadline(&s), GF_SV_ACT_TERM);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults_are_appwrapper),
		cmocka_unit_test(test_validation),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_crash_loop_reaches_retry_limit),
		cmocka_unit_test(test_stable_period_resets_retries),
		cmocka_unit_test(test_terminal_exit_not_retried),
		cmocka_unit_test(test_success_exit),
		cmocka_unit_test(test_hung_engine_escalates_to_revocation),
		cmocka_unit_test(test_debounce_recovers),
		cmocka_unit_test(test_sigkill_reset_counts_once),
		cmocka_unit_test(test_admission_and_warmup),
		cmocka_unit_test(test_switchover_is_not_a_retry),
		cmocka_unit_test(test_exit_75_without_a_switchover_is_retried),
		cmocka_unit_test(test_crash_after_a_switchover_request_is_retried),
		cmocka_unit_test(test_stop),
		cmocka_unit_test(test_spawn_failure),
		cmocka_unit_test(test_spawn_failure_backs_off_without_a_pause),
		cmocka_unit_test(test_retry_limit_zero),
		cmocka_unit_test(test_exit_waits_the_failure_grace),
		cmocka_unit_test(test_term_grace_then_revoke_grace),
		cmocka_unit_test(test_deletion_on_failure_grace_holds_a_failed_engine),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
