/* SPDX-License-Identifier: Apache-2.0 */
/* The loss policy: the one hook lock loss and GMS loss go through, and the
 * default policy, the one place the library ends a process. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "common.h"
#include "engine_int.h"


static void *loss_reaper(void *arg)
{
	int64_t grace_ms = (int64_t)(intptr_t)arg;
	gf_engine_real_sleep_ms(grace_ms);
	/* gf_log is not used here: the engine object may be gone by now. */
	fprintf(stderr, "gf-engine: still alive %lld ms after the loss policy's SIGTERM; _exit(70)\n",
		(long long)grace_ms);
	_exit(70);
	return NULL;
}

GF_EXPORT void gf_engine_default_loss(gf_engine *e, int err, const char *detail, void *userdata)
{
	int64_t grace_ms = 10000;
	if (e) {
		pthread_mutex_lock(&e->mu);
		grace_ms = e->loss_grace_ms;
		pthread_mutex_unlock(&e->mu);
	}
	gf_log(GF_LOG_ERR, "engine",
	       "event=engine_lost id=%s err=%s detail=\"%s\" action=terminate grace_ms=%" PRId64
	       " msg=\"terminating the process so the platform restarts it as a standby (default loss policy)\"",
	       e && e->id ? e->id : "", gf_error_name(err) ? gf_error_name(err) : "?", detail ? detail : "",
	       grace_ms);
	/* The grace timer runs on its own detached thread so the watcher
	 * thread that called us returns, and the engine's SIGTERM path can
	 * stop and join it while shutting down cleanly. */
	pthread_t t;
	pthread_attr_t attr;
	bool timer = false;
	if (pthread_attr_init(&attr) == 0) {
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		timer = pthread_create(&t, &attr, loss_reaper, (void *)(intptr_t)grace_ms) == 0;
		pthread_attr_destroy(&attr);
	}
	kill(getpid(), SIGTERM);
	if (!timer)
		loss_reaper((void *)(intptr_t)grace_ms);
}

void gf_engine_fatal(gf_engine *e, int err, const char *cause, const char *reason)
{
	/* Lock loss, GMS loss and the startup watchdog can race; the policy
	 * runs once. */
	if (atomic_exchange(&e->loss_called, true))
		return;
	/* First: the next holder may already serve from the same listening
	 * socket, so nothing of ours may accept from it any more. */
	gf_engine_stop_accepting(e);
	gf_engine_die(e, cause, reason);
	pthread_mutex_lock(&e->mu);
	gf_engine_loss_fn fn = e->loss;
	void *ud = e->loss_ud;
	pthread_mutex_unlock(&e->mu);
	if (fn)
		fn(e, err, reason, ud);
	else
		gf_engine_default_loss(e, err, reason, ud);
}

static void *fatal_main(void *arg)
{
	gf_engine *e = arg;
	gf_engine_fatal(e, e->fatal_err, e->fatal_cause, e->fatal_reason);
	return NULL;
}

void gf_engine_fatal_async(gf_engine *e, int err, const char *cause, const char *reason)
{
	/* Dead at once, so every probe from now on fails; the policy on a
	 * thread of its own, so the probe that found the loss still answers
	 * before the default policy ends the process, and a policy that takes
	 * its time does not hold the probe server. */
	gf_engine_die(e, cause, reason);
	pthread_mutex_lock(&e->mu);
	if (e->fatal_thread_running || atomic_load(&e->loss_called)) {
		pthread_mutex_unlock(&e->mu);
		return;
	}
	e->fatal_err = err;
	snprintf(e->fatal_cause, sizeof(e->fatal_cause), "%s", cause);
	snprintf(e->fatal_reason, sizeof(e->fatal_reason), "%s", reason ? reason : "");
	e->fatal_thread_running = pthread_create(&e->fatal_thread, NULL, fatal_main, e) == 0;
	bool started = e->fatal_thread_running;
	pthread_mutex_unlock(&e->mu);
	if (!started)
		gf_engine_fatal(e, err, cause, reason);
}

static void engine_lost(gf_engine *e, int err, const char *what, const char *detail)
{
	char reason[512];
	snprintf(reason, sizeof(reason), "%s lost: %s", what, detail ? detail : "");
	gf_engine_fatal(e, err, "lost", reason);
}

void gf_engine_lock_lost_hook(gf_lock *lock, int err, const char *detail, void *userdata)
{
	(void)lock;
	engine_lost(userdata, err ? err : GF_ERR_LOCK_LOST, "lock", detail);
}

void gf_engine_gms_lost_hook(gf_gms *gms, int err, const char *detail, void *userdata)
{
	gf_engine *e = userdata;
	int device = -1;
	for (int i = 0; i < e->ndev; i++)
		if (e->dev[i].gms == gms)
			device = i;
	char what[64];
	snprintf(what, sizeof(what), "GMS of device %d", device);
	engine_lost(e, err ? err : GF_ERR_GMS_LOST, what, detail);
}

