/* SPDX-License-Identifier: Apache-2.0 */
/* The supervisor's object, shared by its runner (supervisor.c) and its configuration (config.c). */
#ifndef GF_SUPERVISOR_INT_H
#define GF_SUPERVISOR_INT_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include <curl/curl.h>

#include "gpufailover/lock.h"
#include "gpufailover/supervise.h"
#include "policy.h"

#define SV_MAX_ENGINES 64
#define SV_MAX_TERMINAL 64

extern char **environ;

struct sv_engine {
	char *name;
	char **argv;
	char **envp; /* NULL: inherit */
	char *cwd;
	char *probe_url; /* base, e.g. http://127.0.0.1:8081 */
	char *lock_id;   /* the engine id it holds the lock as (for revocation) */
	struct gf_sv_periods periods;
	struct gf_sv_engine pol;

	pid_t pid;
	int pidfd;
	/* Processes that would not die after SIGKILL and were given up on: reaped when they do. */
	pid_t lingering_pid;
	int lingering_fd;

	/* One probe round = /startup and /live in flight together. */
	CURL *h_startup, *h_live;
	int inflight;
	struct gf_sv_probe round;
	int64_t next_probe_us;
	int64_t last_revoked_epoch;
	int64_t revocations;
	/* The grant the current process (or a process of its own, see
	 * own_process) was seen holding under lock_id (0: none seen). */
	uint64_t held_epoch;
	/* The grant last seen held by a process that is gone: the only one the
	 * look after an exit may revoke. */
	uint64_t gone_epoch;
	/* After an exit: when to look whether that grant outlived its process
	 * (0: no look pending). */
	int64_t lock_check_at;
	/* The revocation in flight, off the loop: the holder query (revoke_q),
	 * then the revoke of the epoch it found (revoke_r, of revoke_epoch); at
	 * most one of the two is set. */
	gf_lock_query *revoke_q;
	gf_lock_revoke_op *revoke_r;
	uint64_t revoke_epoch;
	pid_t revoke_hpid;
	/* What proves a grant this engine's for the revocation in flight: the
	 * epoch seen held by a gone process, or a process that will not die. */
	uint64_t revoke_proven;
	pid_t revoke_gone_pid;
};

struct gf_supervisor {
	pthread_mutex_t mu; /* guards the engines' policy state against status readers */
	int loaded, started;
	int stop_fd;
	int stop_seen;
	char *lock_uri;
	char *lock_secret;
	size_t lock_secret_len;
	int64_t probe_interval_ms, probe_timeout_ms;
	int terminal[SV_MAX_TERMINAL];
	size_t n_terminal;
	struct sv_engine *eng;
	size_t n;
	CURLM *multi;
	int64_t lock_poll_at;  /* when the lock's holder is next looked at */
	gf_lock_query *poll_q; /* that look, off the loop (lock_poll_answer()) */
	int poll_failing;      /* the last look failed (logged once) */
};

/* Frees a NULL-terminated vector of strings (NULL: nothing). */
void gf_sv_free_strv(char **v);
/* Frees what one engine owns (its configuration, handles, fds), not @e itself. */
void gf_sv_engine_clear(struct sv_engine *e);

#endif
