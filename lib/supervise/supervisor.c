/* SPDX-License-Identifier: Apache-2.0 */
/* The supervisor's I/O around the pure policy (policy.c): spawning with
 * posix_spawn into a process group of its own, exits seen through pidfds,
 * HTTP probes through libcurl's multi interface (so one slow engine never
 * delays the probes of another), and the lock revocation. Its configuration
 * is read by config.c. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "common.h"
#include "gpufailover/engine.h"
#include "gpufailover/lock.h"
#include "gpufailover/supervise.h"
#include "policy.h"
#include "supervisor_int.h"

void gf_sv_free_strv(char **v)
{
	if (!v)
		return;
	for (char **p = v; *p; p++)
		free(*p);
	free(v);
}

int gf_supervisor_new(gf_supervisor **out)
{
	if (!out)
		return gf_err(GF_ERR_INVALID_ARG, "out is NULL");
	gf_supervisor *sv = calloc(1, sizeof(*sv));
	if (!sv)
		return gf_err(GF_ERR_NOMEM, "supervisor");
	pthread_mutex_init(&sv->mu, NULL);
	sv->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (sv->stop_fd < 0) {
		int e = errno;
		free(sv);
		return gf_err_errno(GF_ERR_IO, e, "eventfd");
	}
	sv->probe_interval_ms = 1000;
	sv->probe_timeout_ms = 1000;
	/* Usage and configuration errors: a restart would fail the same way.
	 * 73 (GF_ENGINE_EXIT_EVICTED): the lock server evicted the standby to
	 * keep a GPU's budget; restarting it would undo that. */
	sv->terminal[0] = 2;
	sv->terminal[1] = 64;
	sv->terminal[2] = 73;
	sv->terminal[3] = 78;
	sv->n_terminal = 4;
	*out = sv;
	return 0;
}

void gf_sv_engine_clear(struct sv_engine *e)
{
	free(e->name);
	gf_sv_free_strv(e->argv);
	gf_sv_free_strv(e->envp);
	free(e->cwd);
	free(e->probe_url);
	free(e->lock_id);
	if (e->h_startup)
		curl_easy_cleanup(e->h_startup);
	if (e->h_live)
		curl_easy_cleanup(e->h_live);
	gf_close(e->pidfd);
	gf_close(e->lingering_fd);
	gf_lock_query_free(e->revoke_q);
	gf_lock_revoke_free(e->revoke_r);
}

void gf_supervisor_free(gf_supervisor *sv)
{
	if (!sv)
		return;
	for (size_t i = 0; i < sv->n; i++) {
		if (sv->multi) {
			if (sv->eng[i].h_startup)
				curl_multi_remove_handle(sv->multi, sv->eng[i].h_startup);
			if (sv->eng[i].h_live)
				curl_multi_remove_handle(sv->multi, sv->eng[i].h_live);
		}
		gf_sv_engine_clear(&sv->eng[i]);
	}
	free(sv->eng);
	gf_lock_query_free(sv->poll_q);
	if (sv->multi)
		curl_multi_cleanup(sv->multi);
	free(sv->lock_uri);
	if (sv->lock_secret) {
		memset(sv->lock_secret, 0, sv->lock_secret_len);
		free(sv->lock_secret);
	}
	gf_close(sv->stop_fd);
	pthread_mutex_destroy(&sv->mu);
	free(sv);
}

/* ---- actions ------------------------------------------------------------ */

static int do_spawn(gf_supervisor *sv, struct sv_engine *e)
{
	posix_spawnattr_t attr;
	posix_spawn_file_actions_t fa;
	sigset_t empty, dfl;
	int r;
	(void)sv;
	sigemptyset(&empty);
	sigfillset(&dfl);
	posix_spawnattr_init(&attr);
	posix_spawn_file_actions_init(&fa);
	/* A process group of its own, so SIGKILL reaches the engine's helpers too;
	 * default signal dispositions and an empty mask, whatever ours are. */
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	posix_spawnattr_setpgroup(&attr, 0);
	posix_spawnattr_setsigmask(&attr, &empty);
	posix_spawnattr_setsigdefault(&attr, &dfl);
	/* Stdin, stdout and stderr only: libcurl's wake-up socketpair and other
	 * descriptors opened without O_CLOEXEC (ours, or an embedding
	 * program's) must not leak into an engine that outlives them. */
	posix_spawn_file_actions_addclosefrom_np(&fa, 3);
	if (e->cwd)
		posix_spawn_file_actions_addchdir_np(&fa, e->cwd);
	pid_t pid;
	r = posix_spawnp(&pid, e->argv[0], &fa, &attr, e->argv, e->envp ? e->envp : environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	if (r != 0)
		return gf_err_errno(GF_ERR_IO, r, "engine=%s spawn %s", e->name, e->argv[0]);
	int fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (fd < 0) {
		int en = errno;
		kill(-pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return gf_err_errno(GF_ERR_IO, en, "engine=%s pidfd_open", e->name);
	}
	pthread_mutex_lock(&sv->mu);
	e->pid = pid;
	e->held_epoch = 0;
	pthread_mutex_unlock(&sv->mu);
	e->pidfd = fd;
	e->next_probe_us = 0;
	/* Look at the lock soon: a grant and a switchover are proven by it. */
	sv->lock_poll_at = 0;
	gf_log(GF_LOG_INFO, "supervise", "event=engine_started engine=%s pid=%d", e->name, (int)pid);
	return 0;
}

/* ---- the lock ---------------------------------------------------------- */

/*
 * Whether the grant @epoch is still held under @id, asked when an engine
 * that held it exits: only then, and only of a lock server that answered the
 * polls, so the wait (at most 2 s) is rare. Unknown (no answer) counts as
 * held: nothing is planned on a guess, and the look after the revoke
 * grace decides about a revocation.
 */
static int grant_kept(gf_supervisor *sv, const char *id, uint64_t epoch)
{
	gf_lock_query *q;
	struct gf_lock_holder h;
	if (gf_lock_query_start(&q, sv->lock_uri, sv->lock_secret, sv->lock_secret_len, NULL, 2000) < 0)
		return 1;
	struct pollfd p = { .fd = gf_lock_query_get_fd(q), .events = POLLIN };
	int r = GF_ERR_AGAIN;
	while (r == GF_ERR_AGAIN && poll(&p, 1, 3000) >= 0)
		r = gf_lock_query_result(q, &h);
	gf_lock_query_free(q);
	return r < 0 || (strcmp(h.id, id) == 0 && h.epoch == epoch);
}

/* A process's parent and process group, from /proc. */
static int proc_parent(pid_t pid, pid_t *ppid, pid_t *pgrp)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	/* The command name may hold spaces and parentheses: the fields follow the last ')'. */
	char *rp = strrchr(buf, ')');
	char state;
	int pp, pg;
	if (!rp || sscanf(rp + 1, " %c %d %d", &state, &pp, &pg) != 3)
		return -1;
	*ppid = pp;
	*pgrp = pg;
	return 0;
}

/*
 * Whether @pid is the engine process @engine or one of its own: in the
 * process group it was spawned into, or a descendant (a lock holder started
 * by "sh -c" or a run.sh, even one that left the group). The lock server
 * reports pids in its own pid namespace: in another one nothing matches, and
 * nothing is ever revoked on a guess.
 */
static int own_process(pid_t pid, pid_t engine)
{
	pid_t ppid, pgrp;
	if (pid <= 0 || engine <= 0)
		return 0;
	if (pid == engine)
		return 1;
	if (proc_parent(pid, &ppid, &pgrp) < 0)
		return 0;
	if (pgrp == engine)
		return 1;
	for (int hops = 0; hops < 64 && ppid > 1; hops++) {
		if (ppid == engine)
			return 1;
		if (proc_parent(ppid, &ppid, &pgrp) < 0)
			return 0;
	}
	return 0;
}

/*
 * Note which grant each living engine's process holds: what a later
 * revocation or a planned restart must be proven by. Once per probe
 * interval; the query runs off the loop and its answer is an fd the loop
 * polls (lock_poll_answer()), so a slow lock server delays no engine.
 */
static void lock_poll(gf_supervisor *sv, int64_t now)
{
	sv->lock_poll_at = now + sv->probe_interval_ms * 1000;
	int want = 0;
	for (size_t i = 0; i < sv->n; i++)
		want |= sv->eng[i].lock_id && sv->eng[i].pid > 0;
	if (!sv->lock_uri || !want || sv->poll_q)
		return;
	if (gf_lock_query_start(&sv->poll_q, sv->lock_uri, sv->lock_secret, sv->lock_secret_len, NULL,
				sv->probe_timeout_ms) < 0)
		gf_log(GF_LOG_DEBUG, "supervise", "event=lock_poll_failed detail=\"%s\"", gf_error_detail());
}

static void lock_poll_answer(gf_supervisor *sv)
{
	struct gf_lock_holder h;
	int r = gf_lock_query_result(sv->poll_q, &h);
	if (r == GF_ERR_AGAIN)
		return;
	gf_lock_query_free(sv->poll_q);
	sv->poll_q = NULL;
	if (r < 0) {
		if (!sv->poll_failing)
			gf_log(GF_LOG_WARN, "supervise", "event=lock_poll_failed detail=\"%s\"", gf_error_detail());
		sv->poll_failing = 1;
		return;
	}
	if (sv->poll_failing)
		gf_log(GF_LOG_INFO, "supervise", "event=lock_poll_recovered");
	sv->poll_failing = 0;
	for (size_t i = 0; i < sv->n; i++) {
		struct sv_engine *e = &sv->eng[i];
		if (!e->lock_id || e->pid <= 0 || !h.id[0] || strcmp(h.id, e->lock_id) != 0 ||
		    !own_process((pid_t)h.pid, e->pid))
			continue;
		if (e->held_epoch != h.epoch)
			gf_log(GF_LOG_INFO, "supervise", "event=lock_held engine=%s epoch=%" PRIu64 " pid=%u", e->name,
			       h.epoch, h.pid);
		pthread_mutex_lock(&sv->mu);
		e->held_epoch = h.epoch;
		pthread_mutex_unlock(&sv->mu);
	}
}

/*
 * Revoke the grant @proven under this engine's id: one seen held by a
 * process of this engine that is gone or will not die (@gone_pid, when it
 * still exists, also proves a holder of its own). Never a grant of the
 * current process. The request names the epoch, so it can never hit a
 * holder granted in the meantime. Both steps (the holder query, then the
 * revoke) run off the loop, each on its handle's fd (revoke_answer(), then
 * revoke_done()): a slow lock server never delays another engine.
 */
static void do_revoke(gf_supervisor *sv, struct sv_engine *e, uint64_t proven, pid_t gone_pid)
{
	if (!sv->lock_uri || !e->lock_id) {
		gf_log(GF_LOG_WARN, "supervise",
		       "event=revoke_impossible engine=%s reason=\"it will not exit and no lock is configured\"",
		       e->name);
		return;
	}
	if (e->revoke_q || e->revoke_r)
		return; /* one in flight already: its answer decides */
	e->revoke_epoch = 0;
	e->revoke_proven = proven;
	e->revoke_gone_pid = gone_pid;
	if (gf_lock_query_start(&e->revoke_q, sv->lock_uri, sv->lock_secret, sv->lock_secret_len, NULL, 2000) < 0)
		gf_log(GF_LOG_ERR, "supervise",
		       "event=revoke_failed engine=%s step=status detail=\"%s\"", e->name, gf_error_detail());
	else
		gf_log(GF_LOG_INFO, "supervise",
		       "event=revoke_asking engine=%s msg=\"asking the lock server for its holder\"", e->name);
}

/* The revoke's fd turned readable. */
static void revoke_done(gf_supervisor *sv, struct sv_engine *e)
{
	int r = gf_lock_revoke_result(e->revoke_r);
	if (r == GF_ERR_AGAIN)
		return;
	gf_lock_revoke_free(e->revoke_r);
	e->revoke_r = NULL;
	uint64_t epoch = e->revoke_epoch;
	e->revoke_epoch = 0;
	if (r < 0) {
		/* Without an answer the revoke may still have taken effect. */
		bool unanswered = r == GF_ERR_TIMEOUT || r == GF_ERR_IO || r == GF_ERR_CLOSED || r == GF_ERR_UNREACHABLE;
		gf_log(GF_LOG_ERR, "supervise", "event=%s engine=%s epoch=%" PRIu64 " detail=\"%s\"%s",
		       unanswered ? "revoke_unconfirmed" : "revoke_refused", e->name, epoch, gf_error_detail(),
		       unanswered ? " msg=\"no answer: it may have taken effect\"" : "");
		return;
	}
	pthread_mutex_lock(&sv->mu);
	e->last_revoked_epoch = (int64_t)epoch;
	e->revocations++;
	pthread_mutex_unlock(&sv->mu);
	gf_log(GF_LOG_WARN, "supervise", "event=revoked engine=%s epoch=%" PRIu64 " pid=%d", e->name, epoch,
	       (int)e->revoke_hpid);
}

/* The revocation's holder query fd turned readable. */
static void revoke_answer(gf_supervisor *sv, struct sv_engine *e)
{
	struct gf_lock_holder h;
	int r = gf_lock_query_result(e->revoke_q, &h);
	if (r == GF_ERR_AGAIN)
		return;
	gf_lock_query_free(e->revoke_q);
	e->revoke_q = NULL;
	if (r < 0) {
		gf_log(GF_LOG_ERR, "supervise",
		       "event=revoke_failed engine=%s step=status detail=\"%s\"", e->name, gf_error_detail());
		return;
	}
	/* Judged against the engine's processes as they are now, after the answer. */
	int theirs = h.id[0] && strcmp(h.id, e->lock_id) == 0 &&
		     ((e->revoke_proven && h.epoch == e->revoke_proven) || own_process((pid_t)h.pid, e->revoke_gone_pid));
	if (!theirs || (e->pid > 0 && own_process((pid_t)h.pid, e->pid))) {
		gf_log(GF_LOG_INFO, "supervise",
		       "event=revoke_skipped engine=%s reason=\"no stale grant under its id\"", e->name);
		return;
	}
	e->revoke_epoch = h.epoch;
	e->revoke_hpid = (pid_t)h.pid;
	if (gf_lock_revoke_start(&e->revoke_r, sv->lock_uri, sv->lock_secret, sv->lock_secret_len, h.epoch, 2000) < 0) {
		gf_log(GF_LOG_ERR, "supervise",
		       "event=revoke_failed engine=%s epoch=%" PRIu64 " detail=\"%s\"", e->name, h.epoch, gf_error_detail());
		e->revoke_epoch = 0;
	}
}

static void carry_out(gf_supervisor *sv, struct sv_engine *e, int act, int64_t now);

static void feed(gf_supervisor *sv, struct sv_engine *e, int ev, const struct gf_sv_probe *probe, int status,
		 int sig, int64_t now)
{
	pthread_mutex_lock(&sv->mu);
	int before = e->pol.state;
	struct gf_sv_input in = { .event = ev, .probe = probe, .exit_status = status, .exit_signal = sig,
				  .terminal = sv->terminal, .n_terminal = sv->n_terminal, .now_us = now };
	int act = gf_sv_step(&e->pol, &e->periods, &in);
	int after = e->pol.state;
	pthread_mutex_unlock(&sv->mu);
	if (before != after)
		gf_log(after == GF_SV_FAILED || after == GF_SV_UNHEALTHY ? GF_LOG_WARN : GF_LOG_INFO, "supervise",
		       "event=state engine=%s state=%s from=%s reason=\"%s\" retries=%" PRId64, e->name,
		       gf_sv_state_name(after), gf_sv_state_name(before), e->pol.reason, e->pol.retries);
	carry_out(sv, e, act, now);
}

static void carry_out(gf_supervisor *sv, struct sv_engine *e, int act, int64_t now)
{
	if (act & GF_SV_ACT_TERM && e->pid > 0)
		kill(e->pid, SIGTERM);
	if (act & GF_SV_ACT_KILL && e->pid > 0)
		kill(-e->pid, SIGKILL);
	if (act & GF_SV_ACT_REVOKE) {
		/* Keep reaping it in the background; the policy has moved on, and
		 * the process is no longer "the engine" when the grant is judged. */
		gf_close(e->lingering_fd);
		e->lingering_pid = e->pid;
		e->lingering_fd = e->pidfd;
		e->pid = 0;
		e->pidfd = -1;
		e->gone_epoch = e->held_epoch;
		do_revoke(sv, e, e->held_epoch, e->lingering_pid);
	}
	if (act & GF_SV_ACT_SPAWN) {
		if (do_spawn(sv, e) < 0) {
			gf_log(GF_LOG_ERR, "supervise",
			       "event=spawn_failed engine=%s detail=\"%s\"", e->name, gf_error_detail());
			/* One level deep: the policy answers a failed spawn with a
			 * pause (at least GF_SV_SPAWN_RETRY_MIN_MS), never with
			 * another spawn; with retry_pause 0 this once recursed
			 * until the stack ran out. */
			feed(sv, e, GF_SV_EV_SPAWN_FAILED, NULL, -1, 0, now);
		}
	}
}

/* ---- probes ------------------------------------------------------------- */

static size_t discard_body(char *p, size_t size, size_t n, void *u)
{
	(void)p;
	(void)u;
	return size * n;
}

static CURL *probe_handle(gf_supervisor *sv, struct sv_engine *e, const char *path)
{
	char url[512];
	CURL *h = curl_easy_init();
	if (!h)
		return NULL;
	snprintf(url, sizeof(url), "%s%s", e->probe_url, path);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)sv->probe_timeout_ms);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)sv->probe_timeout_ms);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard_body);
	curl_easy_setopt(h, CURLOPT_PRIVATE, e);
	return h;
}

static void probe_start(gf_supervisor *sv, struct sv_engine *e, int64_t now)
{
	e->next_probe_us = now + sv->probe_interval_ms * 1000;
	memset(&e->round, 0, sizeof(e->round));
	e->h_startup = probe_handle(sv, e, "/startup");
	e->h_live = probe_handle(sv, e, "/live");
	if (!e->h_startup || !e->h_live) {
		if (e->h_startup)
			curl_easy_cleanup(e->h_startup);
		if (e->h_live)
			curl_easy_cleanup(e->h_live);
		e->h_startup = e->h_live = NULL;
		return;
	}
	curl_multi_add_handle(sv->multi, e->h_startup);
	curl_multi_add_handle(sv->multi, e->h_live);
	e->inflight = 2;
}

static void probes_collect(gf_supervisor *sv, int64_t now)
{
	CURLMsg *m;
	int left;
	while ((m = curl_multi_info_read(sv->multi, &left))) {
		if (m->msg != CURLMSG_DONE)
			continue;
		CURL *h = m->easy_handle;
		struct sv_engine *e = NULL;
		long code = 0;
		curl_easy_getinfo(h, CURLINFO_PRIVATE, (char **)&e);
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
		if (m->data.result == CURLE_OK && code > 0)
			e->round.reachable = 1;
		if (h == e->h_startup) {
			e->round.startup_ok = m->data.result == CURLE_OK && code == 200;
			e->h_startup = NULL;
		} else {
			e->round.live_ok = m->data.result == CURLE_OK && code == 200;
			e->h_live = NULL;
		}
		curl_multi_remove_handle(sv->multi, h);
		curl_easy_cleanup(h);
		if (--e->inflight == 0 && e->pid > 0)
			feed(sv, e, GF_SV_EV_PROBE, &e->round, 0, 0, now);
	}
}

/* ---- the loop ----------------------------------------------------------- */

static void reap(gf_supervisor *sv, struct sv_engine *e, int64_t now)
{
	siginfo_t si;
	memset(&si, 0, sizeof(si));
	if (waitid(P_PIDFD, (id_t)e->pidfd, &si, WEXITED | WNOHANG) < 0 || si.si_pid == 0)
		return;
	int status = si.si_code == CLD_EXITED ? si.si_status : -1;
	int sig = si.si_code == CLD_EXITED ? 0 : si.si_status;
	gf_log(GF_LOG_INFO, "supervise", "event=engine_exited engine=%s pid=%d status=%d signal=%d", e->name,
	       (int)e->pid, status, sig);
	/* Before its group is killed: was the grant it held let go before the
	 * exit? Only a holder stepping down does that. */
	int planned = 0;
	if (e->held_epoch) {
		int kept = grant_kept(sv, e->lock_id, e->held_epoch);
		planned = status == GF_ENGINE_EXIT_SWITCHOVER && !kept;
		/* Normally the lock server sees the exit and grants the next
		 * waiter; if the grant outlives the process (a process of its
		 * own that will not die), the revoke grace bounds the wait
		 * before that grant, and only that one, is revoked. */
		if (kept) {
			e->gone_epoch = e->held_epoch;
			e->lock_check_at = now + e->periods.revoke_grace_ms * 1000;
		}
	}
	/* Whatever its helpers still do, the group goes with the engine. */
	kill(-e->pid, SIGKILL);
	gf_close(e->pidfd);
	e->pidfd = -1;
	pthread_mutex_lock(&sv->mu);
	e->pid = 0;
	e->held_epoch = 0;
	pthread_mutex_unlock(&sv->mu);
	/* The engine stepped down on request (gfctl switchover): a restart, not a failure. */
	if (planned)
		feed(sv, e, GF_SV_EV_SWITCHOVER, NULL, 0, 0, now);
	feed(sv, e, GF_SV_EV_EXITED, NULL, status, sig, now);
}

static void reap_lingering(struct sv_engine *e)
{
	siginfo_t si;
	memset(&si, 0, sizeof(si));
	if (waitid(P_PIDFD, (id_t)e->lingering_fd, &si, WEXITED | WNOHANG) < 0 || si.si_pid == 0)
		return;
	gf_log(GF_LOG_INFO, "supervise", "event=revoked_exited engine=%s pid=%d", e->name, (int)e->lingering_pid);
	gf_close(e->lingering_fd);
	e->lingering_fd = -1;
	e->lingering_pid = 0;
}

int gf_supervisor_start(gf_supervisor *sv)
{
	if (!sv)
		return gf_err(GF_ERR_INVALID_ARG, "sv is NULL");
	if (!sv->loaded || sv->started)
		return gf_err(GF_ERR_STATE, sv->loaded ? "supervisor already started" : "no config loaded");
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0 || !(sv->multi = curl_multi_init()))
		return gf_err(GF_ERR_NOMEM, "libcurl init");
	sv->started = 1;
	int64_t now = gf_now_us();
	for (size_t i = 0; i < sv->n; i++)
		feed(sv, &sv->eng[i], GF_SV_EV_START, NULL, 0, 0, now);
	return 0;
}

void gf_supervisor_request_stop(gf_supervisor *sv)
{
	uint64_t one = 1;
	if (sv && write(sv->stop_fd, &one, sizeof(one)) < 0) {
		/* The counter is already non-zero: the stop is pending anyway. */
	}
}

int gf_supervisor_run(gf_supervisor *sv)
{
	if (!sv || !sv->started)
		return gf_err(GF_ERR_STATE, "supervisor not started");
	/* The stop fd and the lock poll's query; per engine: its pidfd, a
	 * lingering process's, its revocation's query or revoke (one at a time). */
	struct curl_waitfd wfd[2 + 3 * SV_MAX_ENGINES];
	struct sv_engine *owner[2 + 3 * SV_MAX_ENGINES];
	int lingering[2 + 3 * SV_MAX_ENGINES]; /* 0: pidfd (or stop), 1: lingering, 2: revoke's query, 3: poll, 4: revoke */
	for (;;) {
		int64_t now = gf_now_us();
		int alive = 0;
		int64_t deadline = INT64_MAX;
		for (size_t i = 0; i < sv->n; i++) {
			struct sv_engine *e = &sv->eng[i];
			if (gf_sv_next_deadline(&e->pol, &e->periods) <= now)
				feed(sv, e, GF_SV_EV_TICK, NULL, 0, 0, now);
			if (e->pid > 0 && !e->inflight && gf_sv_wants_probes(&e->pol) && e->next_probe_us <= now)
				probe_start(sv, e, now);
			if (e->lock_check_at && e->lock_check_at <= now && !sv->stop_seen) {
				e->lock_check_at = 0;
				do_revoke(sv, e, e->gone_epoch, 0);
			}
			if (e->lock_check_at && e->lock_check_at < deadline)
				deadline = e->lock_check_at;
			int64_t d = gf_sv_next_deadline(&e->pol, &e->periods);
			if (d < deadline)
				deadline = d;
			if (e->pid > 0 && gf_sv_wants_probes(&e->pol) && !e->inflight && e->next_probe_us < deadline)
				deadline = e->next_probe_us;
			alive |= e->pid > 0 || e->pol.alive;
		}
		if (sv->stop_seen && !alive)
			return 0;
		if (sv->lock_uri && sv->lock_poll_at <= now)
			lock_poll(sv, now);
		if (sv->lock_uri && sv->lock_poll_at < deadline)
			deadline = sv->lock_poll_at;

		unsigned n = 0;
		wfd[n] = (struct curl_waitfd){ .fd = sv->stop_fd, .events = CURL_WAIT_POLLIN };
		owner[n] = NULL;
		lingering[n++] = 0;
		if (sv->poll_q) {
			wfd[n] = (struct curl_waitfd){ .fd = gf_lock_query_get_fd(sv->poll_q), .events = CURL_WAIT_POLLIN };
			owner[n] = NULL;
			lingering[n++] = 3;
		}
		for (size_t i = 0; i < sv->n; i++) {
			if (sv->eng[i].pidfd >= 0) {
				wfd[n] = (struct curl_waitfd){ .fd = sv->eng[i].pidfd, .events = CURL_WAIT_POLLIN };
				owner[n] = &sv->eng[i];
				lingering[n++] = 0;
			}
			if (sv->eng[i].lingering_fd >= 0) {
				wfd[n] = (struct curl_waitfd){ .fd = sv->eng[i].lingering_fd, .events = CURL_WAIT_POLLIN };
				owner[n] = &sv->eng[i];
				lingering[n++] = 1;
			}
			if (sv->eng[i].revoke_q) {
				wfd[n] = (struct curl_waitfd){ .fd = gf_lock_query_get_fd(sv->eng[i].revoke_q),
							       .events = CURL_WAIT_POLLIN };
				owner[n] = &sv->eng[i];
				lingering[n++] = 2;
			}
			if (sv->eng[i].revoke_r) {
				wfd[n] = (struct curl_waitfd){ .fd = gf_lock_revoke_get_fd(sv->eng[i].revoke_r),
							       .events = CURL_WAIT_POLLIN };
				owner[n] = &sv->eng[i];
				lingering[n++] = 4;
			}
		}
		int timeout = gf_poll_timeout_ms(deadline);
		if (timeout < 0 || timeout > 1000)
			timeout = 1000;
		int numfds = 0;
		CURLMcode mc = curl_multi_poll(sv->multi, wfd, n, timeout, &numfds);
		if (mc != CURLM_OK)
			return gf_err(GF_ERR_IO, "curl_multi_poll: %s", curl_multi_strerror(mc));
		int running;
		curl_multi_perform(sv->multi, &running);
		now = gf_now_us();
		probes_collect(sv, now);
		for (unsigned k = 0; k < n; k++) {
			if (!(wfd[k].revents & CURL_WAIT_POLLIN))
				continue;
			if (lingering[k] == 3) {
				lock_poll_answer(sv);
			} else if (!owner[k]) {
				uint64_t v;
				if (read(sv->stop_fd, &v, sizeof(v)) == sizeof(v) && !sv->stop_seen) {
					sv->stop_seen = 1;
					gf_log(GF_LOG_INFO, "supervise", "event=stopping_engines");
					for (size_t i = 0; i < sv->n; i++)
						feed(sv, &sv->eng[i], GF_SV_EV_STOP, NULL, 0, 0, now);
				}
			} else if (lingering[k] == 2) {
				revoke_answer(sv, owner[k]);
			} else if (lingering[k] == 4) {
				revoke_done(sv, owner[k]);
			} else if (lingering[k]) {
				reap_lingering(owner[k]);
			} else {
				reap(sv, owner[k], now);
			}
		}
	}
}

/* ---- status ------------------------------------------------------------- */

int gf_supervisor_status_json(gf_supervisor *sv, char **json)
{
	if (!sv || !json)
		return gf_err(GF_ERR_INVALID_ARG, "NULL argument");
	json_t *root = json_object(), *arr = json_array();
	int64_t now = gf_now_us();
	pthread_mutex_lock(&sv->mu);
	for (size_t i = 0; i < sv->n; i++) {
		struct sv_engine *e = &sv->eng[i];
		const struct gf_sv_engine *p = &e->pol;
		int64_t left = e->periods.retry_limit - p->retries;
		json_t *o = json_pack(
			"{s:s, s:s, s:s, s:i, s:I, s:I, s:I, s:I, s:i, s:i, s:s, s:f, s:b, s:I}", "name", e->name,
			"state", gf_sv_state_name(p->state), "reason", p->reason, "pid", (int)e->pid, "retries",
			(json_int_t)p->retries, "retries_left", (json_int_t)(left > 0 ? left : 0), "retry_limit",
			(json_int_t)e->periods.retry_limit, "restarts", (json_int_t)p->restarts, "last_exit_status",
			p->last_exit_status, "last_exit_signal", p->last_exit_signal, "last_exit_class",
			gf_sv_exit_class_name(p->last_exit_class), "seconds_in_state",
			p->since_us ? (double)(now - p->since_us) / 1e6 : 0.0, "revoked", p->revoked,
			"revoked_epoch", (json_int_t)e->last_revoked_epoch);
		if (o)
			json_object_set_new(o, "lock_epoch", json_integer((json_int_t)e->held_epoch));
		if (o && e->lingering_pid)
			json_object_set_new(o, "lingering_pid", json_integer(e->lingering_pid));
		if (o)
			json_array_append_new(arr, o);
	}
	pthread_mutex_unlock(&sv->mu);
	json_object_set_new(root, "engines", arr);
	*json = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	return *json ? 0 : gf_err(GF_ERR_NOMEM, "status");
}

int gf_supervisor_metrics(gf_supervisor *sv, char **text)
{
	if (!sv || !text)
		return gf_err(GF_ERR_INVALID_ARG, "NULL argument");
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return gf_err(GF_ERR_NOMEM, "metrics");
	int64_t now = gf_now_us();
	pthread_mutex_lock(&sv->mu);
	fputs("# HELP gf_supervisor_engine_state Current state of a supervised engine (1 for the current state).\n"
	      "# TYPE gf_supervisor_engine_state gauge\n",
	      f);
	for (size_t i = 0; i < sv->n; i++)
		for (int s = GF_SV_STOPPED; s <= GF_SV_HELD; s++)
			fprintf(f, "gf_supervisor_engine_state{engine=\"%s\",state=\"%s\"} %d\n", sv->eng[i].name,
				gf_sv_state_name(s), sv->eng[i].pol.state == s);
	fputs("# HELP gf_supervisor_engine_state_seconds Time spent in the current state.\n"
	      "# TYPE gf_supervisor_engine_state_seconds gauge\n",
	      f);
	for (size_t i = 0; i < sv->n; i++)
		fprintf(f, "gf_supervisor_engine_state_seconds{engine=\"%s\"} %.6f\n", sv->eng[i].name,
			sv->eng[i].pol.since_us ? (double)(now - sv->eng[i].pol.since_us) / 1e6 : 0.0);
	fputs("# HELP gf_supervisor_engine_restarts_total Processes started after the first.\n"
	      "# TYPE gf_supervisor_engine_restarts_total counter\n",
	      f);
	for (size_t i = 0; i < sv->n; i++)
		fprintf(f, "gf_supervisor_engine_restarts_total{engine=\"%s\"} %" PRId64 "\n", sv->eng[i].name,
			sv->eng[i].pol.restarts);
	fputs("# HELP gf_supervisor_engine_retries_left Resets left before the engine is Failed.\n"
	      "# TYPE gf_supervisor_engine_retries_left gauge\n",
	      f);
	for (size_t i = 0; i < sv->n; i++) {
		int64_t left = sv->eng[i].periods.retry_limit - sv->eng[i].pol.retries;
		fprintf(f, "gf_supervisor_engine_retries_left{engine=\"%s\"} %" PRId64 "\n", sv->eng[i].name,
			left > 0 ? left : 0);
	}
	fputs("# HELP gf_supervisor_engine_last_exit_status Exit status of the last exit (-1: none or a signal).\n"
	      "# TYPE gf_supervisor_engine_last_exit_status gauge\n",
	      f);
	for (size_t i = 0; i < sv->n; i++)
		fprintf(f, "gf_supervisor_engine_last_exit_status{engine=\"%s\",class=\"%s\"} %d\n", sv->eng[i].name,
			gf_sv_exit_class_name(sv->eng[i].pol.last_exit_class), sv->eng[i].pol.last_exit_status);
	fputs("# HELP gf_supervisor_engine_revocations_total Lock revocations of engines that would not exit.\n"
	      "# TYPE gf_supervisor_engine_revocations_total counter\n",
	      f);
	for (size_t i = 0; i < sv->n; i++)
		fprintf(f, "gf_supervisor_engine_revocations_total{engine=\"%s\"} %" PRId64 "\n", sv->eng[i].name,
			sv->eng[i].revocations);
	pthread_mutex_unlock(&sv->mu);
	if (fclose(f) != 0) {
		free(buf);
		return gf_err(GF_ERR_NOMEM, "metrics");
	}
	*text = buf;
	return 0;
}
