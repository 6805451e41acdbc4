/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock's one-shot calls, each on a connection of its own: ping, status
 * (JSON for gfctl and HTTP; the typed holder query for the library's own
 * users), readiness, and the admin requests (revoke, switchover, evict). Each goes to
 * the backend of its URI (backend.h); the ones only gf-lockd answers are
 * refused on etcd.
 *
 * The typed query and the revoke also come as handles that run on a thread of
 * their own and signal an eventfd when done, so a single-threaded loop (the
 * GMS fence, the supervisor's revocation) polls them like any other fd and is
 * never held up by a slow lock server.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "backend.h"
#include "wire.h"

int gf_lock_ping(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms)
{
	if (!uri)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL uri");
	return gf_lock_backend_for(uri)->ping(uri, secret, secret_len, timeout_ms);
}

int gf_lock_status_json(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms, char **json)
{
	if (!uri || !json)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL argument");
	return gf_lock_backend_for(uri)->status_json(uri, secret, secret_len, timeout_ms, json);
}

/* A request of gf-lockd's own whose body is only its tag (and an epoch or an engine id for the admin ones). */
static int simple_call(const char *uri, const void *secret, size_t secret_len, int64_t timeout_ms, pb_size_t tag,
		       uint64_t epoch, const char *id, pb_size_t want, const char *what, gf_Msg **reply)
{
	if (!uri)
		return gf_err(GF_ERR_INVALID_ARG, "lock: NULL uri");
	const struct gf_lock_backend *be = gf_lock_backend_for(uri);
	/* etcd holds no server of ours to ask. */
	if (!be->call)
		return gf_err(GF_ERR_NOT_SUPPORTED, "%s: not available on %s locks (only on gf-lockd)", what, be->name);
	gf_Msg *m = gf_msg_new();
	if (!m)
		return gf_err(GF_ERR_NOMEM, "lock: out of memory");
	m->which_body = tag;
	if (tag == gf_Msg_lock_revoke_tag)
		m->body.lock_revoke.epoch = epoch;
	else if (tag == gf_Msg_lock_switchover_tag)
		m->body.lock_switchover.epoch = epoch;
	else if (tag == gf_Msg_lock_evict_tag)
		snprintf(m->body.lock_evict.engine_id, sizeof(m->body.lock_evict.engine_id), "%s", id);
	int rc = be->call(uri, secret, secret_len, timeout_ms, m, want, what);
	if (rc == 0 && reply)
		*reply = m;
	else
		gf_msg_free(m);
	return rc;
}

int gf_lock_ready_for(const char *uri, const void *secret, size_t secret_len, const char *const *gpus,
		      size_t ngpus, const char *model, int64_t timeout_ms, char **json)
{
	if (ngpus && !gpus)
		return gf_err(GF_ERR_INVALID_ARG, "lock ready: NULL GPU list");
	/* A malformed query is refused before connecting. */
	gf_LockStatus *empty = calloc(1, sizeof(*empty));
	if (!empty)
		return gf_err(GF_ERR_NOMEM, "lock: out of memory");
	int rc = gf_lock_ready_from_status(empty, gpus, ngpus, model, NULL);
	free(empty);
	if (rc < 0)
		return rc;
	gf_Msg *m = NULL;
	rc = simple_call(uri, secret, secret_len, timeout_ms, gf_Msg_lock_status_request_tag, 0, NULL, gf_Msg_lock_status_tag,
			 "ready", &m);
	if (rc < 0)
		return rc;
	rc = gf_lock_ready_from_status(&m->body.lock_status, gpus, ngpus, model, json);
	gf_msg_free(m);
	return rc;
}

int gf_lock_switchover(const char *uri, const void *secret, size_t secret_len, uint64_t epoch, int64_t timeout_ms)
{
	return simple_call(uri, secret, secret_len, timeout_ms, gf_Msg_lock_switchover_tag, epoch, NULL, gf_Msg_ok_tag,
			   "switchover", NULL);
}

int gf_lock_revoke(const char *uri, const void *secret, size_t secret_len, uint64_t epoch, int64_t timeout_ms)
{
	if (epoch == 0)
		return gf_err(GF_ERR_INVALID_ARG, "lock revoke: epoch 0 names no grant");
	return simple_call(uri, secret, secret_len, timeout_ms, gf_Msg_lock_revoke_tag, epoch, NULL, gf_Msg_ok_tag, "revoke",
			   NULL);
}

int gf_lock_evict(const char *uri, const void *secret, size_t secret_len, const char *engine_id, int64_t timeout_ms)
{
	if (!engine_id || !gf_id_valid(engine_id))
		return gf_err(GF_ERR_INVALID_ARG, "lock evict: engine id must be 1..127 bytes of printable ASCII without "
						  "spaces, quotes, '\\' or '='");
	return simple_call(uri, secret, secret_len, timeout_ms, gf_Msg_lock_evict_tag, 0, engine_id, gf_Msg_ok_tag,
			   "evict", NULL);
}

/* ---- the typed holder query and the revoke, off the caller's loop ---- */

/*
 * One job on a thread of its own: a holder query or a revoke. Each public
 * handle (gf_lock_query, gf_lock_revoke_op) is a job and nothing else, so a
 * caller can never read a revoke's answer as a holder or the other way round.
 */
struct oneshot {
	/* Two references: the caller's and the worker's; the last one frees. */
	atomic_int refs;
	int done_fd; /* eventfd: readable once the worker is done */
	atomic_bool done;
	char *uri;
	uint8_t *secret;
	size_t secret_len;
	bool has_proof;
	struct gf_lock_proof proof;
	uint64_t revoke_epoch; /* a revoke of this grant instead of a holder query (0: query) */
	int64_t timeout_ms;
	int rc;
	char detail[256];
	struct gf_lock_holder holder;
};

/* The job is the first and only member: a handle and its job share one allocation. */
struct gf_lock_query {
	struct oneshot job;
};
struct gf_lock_revoke_op {
	struct oneshot job;
};

static void oneshot_unref(struct oneshot *q)
{
	if (atomic_fetch_sub(&q->refs, 1) != 1)
		return;
	gf_close(q->done_fd);
	if (q->secret)
		memset(q->secret, 0, q->secret_len);
	free(q->secret);
	free(q->uri);
	free(q);
}

static void *oneshot_main(void *arg)
{
	struct oneshot *q = arg;
	if (q->revoke_epoch)
		q->rc = gf_lock_revoke(q->uri, q->secret, q->secret_len, q->revoke_epoch, q->timeout_ms);
	else
		q->rc = gf_lock_backend_for(q->uri)->holder(q->uri, q->secret, q->secret_len, q->timeout_ms,
							     q->has_proof ? &q->proof : NULL, &q->holder);
	if (q->rc < 0)
		snprintf(q->detail, sizeof(q->detail), "%s", gf_error_detail());
	atomic_store(&q->done, true);
	uint64_t one = 1;
	ssize_t r = write(q->done_fd, &one, sizeof(one));
	(void)r;
	oneshot_unref(q);
	return NULL;
}

/* @what names the job in errors ("lock query", "lock revoke"); @out is the
 * caller's local. Sets *@out to the job, allocated with room for its handle
 * (the same size). */
static int oneshot_start(struct oneshot **out, const char *what, const char *uri, const void *secret,
			 size_t secret_len, const struct gf_lock_proof *proof, uint64_t revoke_epoch, int64_t timeout_ms)
{
	if (!uri || (secret_len && !secret))
		return gf_err(GF_ERR_INVALID_ARG, "%s: NULL argument", what);
	if (timeout_ms < 0 || timeout_ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "%s: timeout outside 0..a year", what);
	_Static_assert(sizeof(struct gf_lock_query) == sizeof(struct oneshot) &&
			       sizeof(struct gf_lock_revoke_op) == sizeof(struct oneshot),
		       "a handle is its job");
	struct oneshot *q = calloc(1, sizeof(*q));
	if (!q)
		return gf_err(GF_ERR_NOMEM, "%s: out of memory", what);
	q->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	q->uri = strdup(uri);
	q->secret = secret_len ? malloc(secret_len) : NULL;
	int rc = 0;
	if (q->done_fd < 0)
		rc = gf_err_errno(GF_ERR_IO, errno, "%s: eventfd", what);
	else if (!q->uri || (secret_len && !q->secret))
		rc = gf_err(GF_ERR_NOMEM, "%s: out of memory", what);
	if (rc < 0) {
		q->refs = 1;
		oneshot_unref(q);
		return rc;
	}
	if (secret_len)
		memcpy(q->secret, secret, secret_len);
	q->secret_len = secret_len;
	if (proof && proof->epoch) {
		q->has_proof = true;
		q->proof = *proof;
	}
	q->revoke_epoch = revoke_epoch;
	q->timeout_ms = timeout_ms;
	atomic_init(&q->refs, 2);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_t t;
	int e = pthread_create(&t, &attr, oneshot_main, q);
	pthread_attr_destroy(&attr);
	if (e) {
		q->refs = 1;
		oneshot_unref(q);
		return gf_err_errno(GF_ERR_IO, e, "%s: pthread_create", what);
	}
	*out = q;
	return 0;
}

/* The job's result without its holder: 0, GF_ERR_AGAIN while it runs, or its error. */
static int oneshot_result(struct oneshot *q, const char *what)
{
	if (!atomic_load(&q->done))
		return gf_err(GF_ERR_AGAIN, "%s: still running", what);
	if (q->rc < 0)
		return gf_err(q->rc, "%s", q->detail);
	return 0;
}

int gf_lock_query_start(gf_lock_query **out, const char *uri, const void *secret, size_t secret_len,
			const struct gf_lock_proof *proof, int64_t timeout_ms)
{
	if (!out)
		return gf_err(GF_ERR_INVALID_ARG, "lock query: NULL argument");
	struct oneshot *q = NULL;
	int rc = oneshot_start(&q, "lock query", uri, secret, secret_len, proof, 0, timeout_ms);
	if (rc == 0)
		*out = (gf_lock_query *)q;
	return rc;
}

int gf_lock_query_get_fd(const gf_lock_query *q)
{
	return q ? q->job.done_fd : -1;
}

int gf_lock_query_result(gf_lock_query *q, struct gf_lock_holder *out)
{
	if (!q)
		return gf_err(GF_ERR_INVALID_ARG, "lock query: NULL query");
	int rc = oneshot_result(&q->job, "lock query");
	if (rc == 0 && out)
		*out = q->job.holder;
	return rc;
}

void gf_lock_query_free(gf_lock_query *q)
{
	if (q)
		oneshot_unref(&q->job);
}

int gf_lock_revoke_start(gf_lock_revoke_op **out, const char *uri, const void *secret, size_t secret_len,
			 uint64_t epoch, int64_t timeout_ms)
{
	if (!out)
		return gf_err(GF_ERR_INVALID_ARG, "lock revoke: NULL argument");
	if (epoch == 0)
		return gf_err(GF_ERR_INVALID_ARG, "lock revoke: epoch 0 names no grant");
	struct oneshot *q = NULL;
	int rc = oneshot_start(&q, "lock revoke", uri, secret, secret_len, NULL, epoch, timeout_ms);
	if (rc == 0)
		*out = (gf_lock_revoke_op *)q;
	return rc;
}

int gf_lock_revoke_get_fd(const gf_lock_revoke_op *r)
{
	return r ? r->job.done_fd : -1;
}

int gf_lock_revoke_result(gf_lock_revoke_op *r)
{
	if (!r)
		return gf_err(GF_ERR_INVALID_ARG, "lock revoke: NULL revoke");
	return oneshot_result(&r->job, "lock revoke");
}

void gf_lock_revoke_free(gf_lock_revoke_op *r)
{
	if (r)
		oneshot_unref(&r->job);
}
