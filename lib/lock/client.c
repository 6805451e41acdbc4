/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock client's façade: the public gf_lock_* calls over a backend table
 * (backend.h): socket.c speaks gf-lockd's protocol (unix://, tcp://),
 * etcd_backend.c the lock on etcd. What is the same for both lives here:
 * fork safety, the settings, the watcher thread and the lost and step-down
 * hooks. The one-shot calls are in oneshot.c.
 *
 * Threads: gf_lock_acquire() runs on the caller's thread and does its I/O
 * without holding the object's mutex, so gf_lock_interrupt() (an eventfd
 * write) can always reach it. Once held, either the caller drives
 * gf_lock_process() from its own loop or the watcher thread does; the
 * mutex serialises the two with the query functions.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "backend.h"

static const struct gf_lock_backend *const backends[] = { &gf_lock_etcd_backend, &gf_lock_socket_backend };

const struct gf_lock_backend *gf_lock_backend_for(const char *uri)
{
	size_t n = sizeof(backends) / sizeof(backends[0]);
	for (size_t i = 0; i + 1 < n; i++)
		if (backends[i]->matches(uri))
			return backends[i];
	return backends[n - 1];
}

/* ---- fork safety: a fork of the holder must never hold the lock ---- */

static pthread_mutex_t list_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gf_lock *all_locks;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void)
{
	pthread_mutex_lock(&list_mu);
	for (struct gf_lock *l = all_locks; l; l = l->lnext)
		pthread_mutex_lock(&l->mu);
}

static void fork_parent(void)
{
	for (struct gf_lock *l = all_locks; l; l = l->lnext)
		pthread_mutex_unlock(&l->mu);
	pthread_mutex_unlock(&list_mu);
}

static void fork_child(void)
{
	/* The child shares the parent's connection or lease: the backend drops
	 * its copy so that the lock goes when the parent dies, even if this
	 * child lives on. Threads do not survive fork, so neither does a watcher. */
	for (struct gf_lock *l = all_locks; l; l = l->lnext) {
		l->be->forked(l);
		l->watching = l->w_active = l->w_started = l->w_due = false;
		pthread_mutex_init(&l->mu, NULL);
		pthread_mutex_init(&l->wmu, NULL);
		pthread_cond_init(&l->wcond, NULL);
	}
	pthread_mutex_init(&list_mu, NULL);
}

static void register_atfork(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

int gf_lock_new(gf_lock **out, const char *uri, const char *engine_id)
{
	if (!out || !uri || !engine_id)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL argument");
	int rc = gf_id_check(engine_id, "lock");
	if (rc < 0)
		return rc;
	gf_lock *l = calloc(1, sizeof(*l));
	if (!l)
		return gf_err(GF_ERR_NOMEM, "lock: out of memory");
	memcpy(l->id, engine_id, strlen(engine_id) + 1);
	l->be = gf_lock_backend_for(uri);
	rc = l->be->open(l, uri);
	if (rc < 0) {
		free(l);
		return rc;
	}
	l->intr_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	l->watch_stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	l->watch_wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	l->watch_timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (l->intr_fd < 0 || l->watch_stop_fd < 0 || l->watch_wake_fd < 0 || l->watch_timer_fd < 0) {
		rc = gf_err_errno(GF_ERR_IO, errno, "lock: eventfd");
		gf_close(l->intr_fd);
		gf_close(l->watch_stop_fd);
		gf_close(l->watch_wake_fd);
		gf_close(l->watch_timer_fd);
		l->be->free(l);
		free(l);
		return rc;
	}
	pthread_mutex_init(&l->mu, NULL);
	pthread_mutex_init(&l->wmu, NULL);
	pthread_cond_init(&l->wcond, NULL);
	l->reconnect_ms = 12000;
	l->hb_ms = 1000;
	l->fence_ms = 3000;
	pthread_once(&atfork_once, register_atfork);
	pthread_mutex_lock(&list_mu);
	l->lnext = all_locks;
	if (all_locks)
		all_locks->lprev = l;
	all_locks = l;
	pthread_mutex_unlock(&list_mu);
	*out = l;
	return 0;
}

/* The parked watcher looks at its flags again. */
static void wake_watcher(gf_lock *l)
{
	uint64_t one = 1;
	ssize_t r = write(l->watch_wake_fd, &one, sizeof(one));
	(void)r; /* a full counter wakes it as well */
}

/* A start put off (gf_lock_start_watch_by()) no longer due. Called with wmu held. */
static void cancel_due(gf_lock *l)
{
	if (!l->w_due)
		return;
	l->w_due = false;
	struct itimerspec off = { 0 };
	timerfd_settime(l->watch_timer_fd, 0, &off, NULL);
}

void gf_lock_free(gf_lock *l)
{
	if (!l)
		return;
	gf_lock_stop_watch(l);
	pthread_mutex_lock(&l->wmu);
	bool started = l->w_started;
	l->w_quit = true;
	wake_watcher(l);
	pthread_mutex_unlock(&l->wmu);
	if (started)
		pthread_join(l->watcher, NULL);
	pthread_mutex_lock(&list_mu);
	if (l->lprev)
		l->lprev->lnext = l->lnext;
	else
		all_locks = l->lnext;
	if (l->lnext)
		l->lnext->lprev = l->lprev;
	pthread_mutex_unlock(&list_mu);
	l->be->free(l);
	gf_close(l->intr_fd);
	gf_close(l->watch_stop_fd);
	gf_close(l->watch_wake_fd);
	gf_close(l->watch_timer_fd);
	pthread_cond_destroy(&l->wcond);
	pthread_mutex_destroy(&l->wmu);
	pthread_mutex_destroy(&l->mu);
	free(l);
}

int gf_lock_set_reconnect_timeout(gf_lock *l, int64_t ms)
{
	if (!l || ms < 0 || ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "lock: reconnect timeout outside 0..a year");
	pthread_mutex_lock(&l->mu);
	l->reconnect_ms = ms;
	pthread_mutex_unlock(&l->mu);
	return l->be->set_reconnect_timeout ? l->be->set_reconnect_timeout(l, ms) : 0;
}

int gf_lock_set_secret(gf_lock *l, const void *secret, size_t len)
{
	if (!l || !secret || len == 0)
		return gf_err(GF_ERR_INVALID_ARG, "lock: empty secret");
	return l->be->set_secret(l, secret, len);
}

int gf_lock_set_lease(gf_lock *l, int64_t heartbeat_ms, int64_t fence_ms)
{
	if (!l || heartbeat_ms <= 0 || fence_ms <= heartbeat_ms || fence_ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "lock: lease needs 0 < heartbeat < fence <= a year");
	pthread_mutex_lock(&l->mu);
	l->hb_ms = heartbeat_ms;
	l->fence_ms = fence_ms;
	pthread_mutex_unlock(&l->mu);
	return l->be->set_lease ? l->be->set_lease(l, heartbeat_ms, fence_ms) : 0;
}

void gf_lock_set_lost_fn(gf_lock *l, gf_lock_lost_fn fn, void *userdata)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->lost_fn = fn;
	l->lost_ud = userdata;
	pthread_mutex_unlock(&l->mu);
}

int gf_lock_set_resources(gf_lock *l, const char *const *gpus, size_t ngpus, uint64_t wake_bytes,
			  uint64_t asleep_bytes)
{
	if (!l || (ngpus && !gpus))
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL argument");
	if (ngpus > GF_POOL_MAX_GPUS)
		return gf_err(GF_ERR_INVALID_ARG, "lock: %zu GPUs declared, at most %d", ngpus, GF_POOL_MAX_GPUS);
	struct gf_pool_decl d = { .ngpus = 0 };
	for (size_t i = 0; i < ngpus; i++) {
		if (!gpus[i] || !gf_pool_uuid_parse(gpus[i], d.gpus[d.ngpus]))
			return gf_err(GF_ERR_INVALID_ARG,
				      "lock: GPU \"%.60s\" is not a UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
				      gpus[i] ? gpus[i] : "(null)");
		if (gf_pool_on_gpu(&d, d.gpus[d.ngpus]))
			return gf_err(GF_ERR_INVALID_ARG, "lock: GPU %s declared twice", d.gpus[d.ngpus]);
		d.ngpus++;
	}
	pthread_mutex_lock(&l->mu);
	memcpy(l->decl.gpus, d.gpus, sizeof(d.gpus));
	l->decl.ngpus = d.ngpus;
	l->decl.wake_bytes = wake_bytes;
	l->decl.asleep_bytes = asleep_bytes;
	pthread_mutex_unlock(&l->mu);
	return 0;
}

int gf_lock_set_pinned(gf_lock *l, int pinned)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	pthread_mutex_lock(&l->mu);
	l->decl.pinned = pinned != 0;
	pthread_mutex_unlock(&l->mu);
	return 0;
}

int gf_lock_set_model(gf_lock *l, const char *model)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	if (model && *model) {
		int rc = gf_id_check(model, "lock model");
		if (rc < 0)
			return rc;
	}
	pthread_mutex_lock(&l->mu);
	snprintf(l->decl.model, sizeof(l->decl.model), "%s", model ? model : "");
	pthread_mutex_unlock(&l->mu);
	return 0;
}

int gf_lock_set_serving_report(gf_lock *l, int on)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	pthread_mutex_lock(&l->mu);
	l->reports_serving = on != 0;
	pthread_mutex_unlock(&l->mu);
	return 0;
}

int gf_lock_serving(gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	if (!l->be->serving)
		return gf_err(GF_ERR_NOT_SUPPORTED, "lock %s: %s locks have no readiness relay", l->id, l->be->name);
	return l->be->serving(l);
}

int gf_lock_add_pid(gf_lock *l, int pid)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	if (pid <= 0)
		return gf_err(GF_ERR_INVALID_ARG, "lock %s: add_pid: pid %d is not a process id", l->id, pid);
	if (!l->be->add_pid)
		return gf_err(GF_ERR_NOT_SUPPORTED,
			      "lock %s: %s locks cannot wait for processes (a pidfd cannot cross hosts); only unix:// lock servers can",
			      l->id, l->be->name);
	return l->be->add_pid(l, pid);
}

void gf_lock_set_next_fn(gf_lock *l, gf_lock_next_fn fn, void *userdata)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->next_fn = fn;
	l->next_ud = userdata;
	pthread_mutex_unlock(&l->mu);
}

void gf_lock_set_step_down_fn(gf_lock *l, gf_lock_step_down_fn fn, void *userdata)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->step_down_fn = fn;
	l->step_down_ud = userdata;
	pthread_mutex_unlock(&l->mu);
}

bool gf_lock_interrupted(gf_lock *l)
{
	uint64_t v;
	return read(l->intr_fd, &v, sizeof(v)) == sizeof(v);
}

int gf_lock_acquire(gf_lock *l, int64_t timeout_ms, struct gf_lock_grant *grant)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	return l->be->acquire(l, timeout_ms, grant);
}

int gf_lock_process(gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	struct gf_lock_news news = { .lost = false };
	pthread_mutex_lock(&l->mu);
	int rc = l->be->process(l, &news);
	gf_lock_lost_fn fn = l->lost_fn;
	void *ud = l->lost_ud;
	gf_lock_step_down_fn sfn = l->step_down_fn;
	void *sud = l->step_down_ud;
	pthread_mutex_unlock(&l->mu);
	/* The hooks run without the mutex: they may query the lock. */
	if (news.lost) {
		if (fn)
			fn(l, GF_ERR_LOCK_LOST, news.detail, ud);
		return gf_err(GF_ERR_LOCK_LOST, "%s", news.detail);
	}
	if (news.step_down && rc == 0 && sfn)
		sfn(l, news.step_down, sud);
	else if (news.step_down && rc == 0)
		gf_log(GF_LOG_WARN, "lock", "msg=\"step-down request ignored: no hook installed\" id=%s", l->id);
	return rc;
}

int gf_lock_release(gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	gf_lock_stop_watch(l);
	return l->be->release(l);
}

int gf_lock_listeners(const gf_lock *l, const struct gf_lock_listener **out, size_t *n)
{
	if (!l || !out || !n)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL argument");
	if (!l->be->listeners)
		return gf_err(GF_ERR_NOT_SUPPORTED,
			      "lock %s: listeners travel as file descriptors, over unix:// lock servers only", l->id);
	return l->be->listeners(l, out, n);
}

void gf_lock_interrupt(gf_lock *l)
{
	if (!l)
		return;
	uint64_t one = 1;
	ssize_t r = write(l->intr_fd, &one, sizeof(one));
	(void)r;
}

int gf_lock_is_held(const gf_lock *l)
{
	return l ? l->be->is_held(l) : 0;
}

uint64_t gf_lock_epoch(const gf_lock *l)
{
	return l ? l->be->epoch(l) : 0;
}

int gf_lock_get_fd(const gf_lock *l)
{
	if (!l)
		return -1;
	gf_lock *m = (gf_lock *)l;
	pthread_mutex_lock(&m->mu);
	int fd = m->be->get_fd(m);
	pthread_mutex_unlock(&m->mu);
	return fd;
}

int gf_lock_get_events(const gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "gf_lock_get_events: NULL lock");
	return POLLIN;
}

int64_t gf_lock_fence_ms(const gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	gf_lock *m = (gf_lock *)l;
	pthread_mutex_lock(&m->mu);
	int64_t t = m->be->fence_ms(m);
	pthread_mutex_unlock(&m->mu);
	return t;
}

int64_t gf_lock_unreachable_ms(const gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	return l->be->unreachable_ms ? l->be->unreachable_ms(l) : 0;
}

int gf_lock_get_timeout_ms(const gf_lock *l)
{
	if (!l)
		return -1;
	gf_lock *m = (gf_lock *)l;
	pthread_mutex_lock(&m->mu);
	int t = m->be->get_timeout_ms(m);
	pthread_mutex_unlock(&m->mu);
	return t;
}

/* One hold's watch: runs the process loop until stopped or no longer held. */
static void watch_loop(gf_lock *l)
{
	for (;;) {
		if (!gf_lock_is_held(l)) {
			/* A holder may stop counting as held (etcd: at T_fence)
			 * before anything was read: let process() report it. */
			gf_lock_process(l);
			break;
		}
		struct pollfd p[2] = { { .fd = gf_lock_get_fd(l), .events = POLLIN },
				       { .fd = l->watch_stop_fd, .events = POLLIN } };
		int n = poll(p, 2, gf_lock_get_timeout_ms(l));
		if (n > 0 && (p[1].revents & POLLIN))
			break;
		if (gf_lock_process(l) == GF_ERR_LOCK_LOST)
			break;
	}
}

/* Parked until a start (now, or due by the timer) or the end. Called and returns with wmu held. */
static void park(gf_lock *l)
{
	while (!l->watching && !l->w_quit) {
		pthread_mutex_unlock(&l->wmu);
		struct pollfd p[2] = { { .fd = l->watch_wake_fd, .events = POLLIN },
				       { .fd = l->watch_timer_fd, .events = POLLIN } };
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			usleep(1000); /* ENOMEM: try again, without spinning */
		uint64_t v;
		ssize_t r = read(l->watch_wake_fd, &v, sizeof(v));
		bool fired = read(l->watch_timer_fd, &v, sizeof(v)) == (ssize_t)sizeof(v);
		(void)r;
		pthread_mutex_lock(&l->wmu);
		/* A firing of a start cancelled meanwhile finds w_due false. */
		if (fired && l->w_due) {
			l->w_due = false;
			l->watching = true;
		}
	}
}

static void *watch_main(void *arg)
{
	gf_lock *l = arg;
	pthread_mutex_lock(&l->wmu);
	for (;;) {
		park(l);
		if (l->w_quit)
			break;
		/* A stop meant for an earlier watch (written while it was
		 * starting, or after it ended on its own) must not end this
		 * one. Drained here, under wmu, rather than by the starter:
		 * a failover's wake does not pay for it, and a stop for this
		 * watch can only come after wmu is released. */
		uint64_t v;
		while (read(l->watch_stop_fd, &v, sizeof(v)) > 0)
			;
		l->w_active = true;
		pthread_mutex_unlock(&l->wmu);
		watch_loop(l);
		pthread_mutex_lock(&l->wmu);
		l->w_active = false;
		l->watching = false;
		pthread_cond_broadcast(&l->wcond);
	}
	pthread_mutex_unlock(&l->wmu);
	return NULL;
}

/* Called with wmu held. */
static int start_watcher_locked(gf_lock *l)
{
	if (l->w_started)
		return 0;
	int e = pthread_create(&l->watcher, NULL, watch_main, l);
	if (e)
		return gf_err_errno(GF_ERR_IO, e, "lock: pthread_create");
	l->w_started = true;
	return 0;
}

int gf_lock_prepare_watch(gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	pthread_mutex_lock(&l->wmu);
	int rc = start_watcher_locked(l);
	pthread_mutex_unlock(&l->wmu);
	return rc;
}

int gf_lock_start_watch(gf_lock *l)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	if (!gf_lock_is_held(l))
		return gf_err(GF_ERR_STATE, "lock %s: not held", l->id);
	pthread_mutex_lock(&l->wmu);
	int rc = 0;
	if (l->watching || l->w_active) {
		rc = gf_err(GF_ERR_STATE, "lock %s: watcher already running", l->id);
	} else if (l->w_due) {
		cancel_due(l); /* put off by gf_lock_start_watch_by(): now instead */
		l->watching = true;
		wake_watcher(l);
	} else if ((rc = start_watcher_locked(l)) == 0) {
		l->watching = true;
		wake_watcher(l);
	}
	pthread_mutex_unlock(&l->wmu);
	return rc;
}

int gf_lock_start_watch_by(gf_lock *l, int64_t delay_ms)
{
	if (!l)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL lock");
	if (delay_ms <= 0)
		return gf_lock_start_watch(l);
	if (!gf_lock_is_held(l))
		return gf_err(GF_ERR_STATE, "lock %s: not held", l->id);
	pthread_mutex_lock(&l->wmu);
	int rc = 0;
	if (l->watching || l->w_active || l->w_due) {
		rc = gf_err(GF_ERR_STATE, "lock %s: watcher already running", l->id);
	} else if ((rc = start_watcher_locked(l)) == 0) {
		struct itimerspec at = { .it_value = { .tv_sec = delay_ms / 1000, .tv_nsec = delay_ms % 1000 * 1000000 } };
		if (timerfd_settime(l->watch_timer_fd, 0, &at, NULL) < 0) {
			/* No timer: the watch starts now, as gf_lock_start_watch() would. */
			l->watching = true;
			wake_watcher(l);
		} else {
			l->w_due = true;
		}
	}
	pthread_mutex_unlock(&l->wmu);
	return rc;
}

void gf_lock_stop_watch(gf_lock *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->wmu);
	cancel_due(l);
	if (l->watching || l->w_active) {
		l->watching = false;
		uint64_t one = 1;
		ssize_t r = write(l->watch_stop_fd, &one, sizeof(one));
		(void)r;
		/* The loop ends before this returns: after it, no hook runs (unless this is the hook). */
		while (l->w_active && !pthread_equal(pthread_self(), l->watcher))
			pthread_cond_wait(&l->wcond, &l->wmu);
	}
	pthread_mutex_unlock(&l->wmu);
}
