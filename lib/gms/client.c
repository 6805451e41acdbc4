/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GMS client. The connection is the lock: connect() waits in the server for
 * the requested mode. One address reservation holds every allocation at a
 * granularity-aligned offset in allocation order, so addresses survive
 * unmap()/remap():
 * - a writer reserves, when granted RW, the device's total memory (rounded
 *   to the granularity), since it cannot know the final size up front and
 *   address space is cheap; an allocation that would not fit fails with
 *   GF_ERR_OUT_OF_MEMORY before anything is asked of the server;
 * - a reader reserves the sum of the (aligned) allocation sizes at its
 *   first map_all().
 * After commit the writer's mappings are re-made read-only in place (unmap
 * then map again at the same offsets of the same reservation, same physical
 * memory), so addresses do not change.
 * Sleep and wake: client_wake.c does the I/O (the state both files share
 * is client_int.h); where the client stands and every decision about it
 * (what a sleep keeps, which way a wake goes, what a hangup means, whether
 * a layout is stale) is client_fsm.c's.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "client_int.h"
#include "client_session.h"
#include "gms_internal.h"
#include "metablob.h"
#include "wire.h"
#include "xfer.h"

/* An entry decoded from the metadata blob lives in it: only chunk entries own their block. */
static void meta_entry_free(const gf_gms *g, struct cmeta *e)
{
	uintptr_t k = (uintptr_t)e->key, b = (uintptr_t)g->meta_blob;
	if (!g->meta_blob || k < b || k >= b + g->meta_blob_len)
		free(e->key);
}

static uint64_t round_up(uint64_t v, uint64_t g)
{
	return (v + g - 1) / g * g;
}

uint64_t gf_gms_round_trips(const gf_gms *gms)
{
	return gms ? gms->round_trips : 0;
}

static void watch_forget(gf_gms *g, int fd);
static bool hung_up(short revents);

/* ---------------------------------------------------------------- the FSM */

/* A copy of the FSM, read under its lock (the lock is not part of the client's value). */
struct gmsc_fsm gms_client_fsm_get(const gf_gms *g)
{
	pthread_mutex_t *mu = (pthread_mutex_t *)&g->kmu;
	pthread_mutex_lock(mu);
	struct gmsc_fsm f = g->fsm;
	pthread_mutex_unlock(mu);
	return f;
}

/* ---------------------------------------------------------------- loss */

/* The FSM went LOST (once per connection): say so, and run the hook. */
static void announce_lost(gf_gms *g, const char *detail)
{
	gf_log(GF_LOG_WARN, "gms", "event=gms_lost gms=%s detail=\"%s\"", g->uri_text, detail);
	if (g->lost_fn)
		g->lost_fn(g, GF_ERR_GMS_LOST, detail, g->lost_ud);
}

/* The GMS went away: a loss when a lock was held, reported once; nothing otherwise (e.g. while connecting). */
static void report_lost(gf_gms *g, const char *detail)
{
	pthread_mutex_lock(&g->kmu);
	bool first = gmsc_fsm_lost(&g->fsm);
	pthread_mutex_unlock(&g->kmu);
	if (first)
		announce_lost(g, detail);
}

static int io_failed(gf_gms *g, int rc)
{
	/* A reply that never came while we hold a lock leaves the stream unusable: that GMS is lost too. */
	struct gmsc_fsm f = gms_client_fsm_get(g);
	if (rc == GF_ERR_CLOSED || rc == GF_ERR_IO || (rc == GF_ERR_TIMEOUT && gmsc_fsm_mode(&f))) {
		char d[300];
		snprintf(d, sizeof(d), "%s", gf_error_detail());
		report_lost(g, d);
		return gf_err(GF_ERR_GMS_LOST, "GPU memory service %s went away: %s", g->uri_text, d);
	}
	return rc;
}

/* 0 when @g holds a lock (*mode: which), else why not. */
static int check_usable(const gf_gms *g, int *mode)
{
	if (!g)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	struct gmsc_fsm f = gms_client_fsm_get(g);
	if (f.state == GMSC_LOST)
		return gf_err(GF_ERR_GMS_LOST, "GPU memory service %s was lost", g->uri_text);
	if (!(*mode = gmsc_fsm_mode(&f)))
		return gf_err(GF_ERR_STATE, "not connected (asleep): call gf_gms_remap() first");
	return 0;
}

/* One request/reply. @g->msg holds the request and receives the reply. */
static int request(gf_gms *g, int **fds, size_t *nfds, int64_t deadline)
{
	g->msg->seq = ++g->seq;
	int rc = gf_msg_send(g->fd, g->msg, NULL, 0, deadline);
	if (rc < 0)
		return io_failed(g, rc);
	rc = gf_msg_recv(&g->rd, g->fd, g->msg, fds, nfds, deadline);
	if (rc < 0)
		return io_failed(g, rc);
	g->round_trips++;
	if ((rc = gf_msg_error_code(g->msg)) < 0) {
		if (fds && *nfds)
			gf_close_fds(*fds, *nfds);
		if (fds) {
			free(*fds);
			*fds = NULL;
			*nfds = 0;
		}
		return rc;
	}
	return 0;
}

int gms_client_request(gf_gms *g, int **fds, size_t *nfds, int64_t deadline)
{
	return request(g, fds, nfds, deadline);
}

int gms_client_check_usable(const gf_gms *g)
{
	int mode;
	return check_usable(g, &mode);
}

/* ---------------------------------------------------------------- connection */

void gms_client_close_conn(gf_gms *g)
{
	watch_forget(g, g->fd);
	gf_close(g->fd);
	g->fd = -1;
	gf_frame_reader_clear(&g->rd);
}

int gf_gms_open_session(const char *uri_text, const struct gf_uri *u, int64_t deadline, int *out_fd,
			struct gf_frame_reader *rd, size_t max_fds)
{
	int fd, rc;
	char peer[64];
	if ((rc = gf_uri_connect(u, deadline, &fd)) < 0)
		return rc;
	gf_frame_reader_init(rd, max_fds);
	snprintf(peer, sizeof(peer), "gms-client-%d", (int)getpid());
	rc = gf_handshake_client(fd, rd, gf_Component_COMPONENT_GMS, peer, NULL, 0, deadline, NULL);
	if (rc < 0) {
		gf_frame_reader_clear(rd);
		gf_close(fd);
		if (rc == GF_ERR_CLOSED || rc == GF_ERR_IO)
			return gf_err(GF_ERR_UNREACHABLE, "%s: handshake failed: %s", uri_text, gf_error_detail());
		return rc;
	}
	*out_fd = fd;
	return 0;
}

/* The reply to GmsConnect in @g->msg: check it and record the grant in @g->grant. */
int gms_client_take_connected(gf_gms *g)
{
	int rc = 0;
	if (g->msg->which_body != gf_Msg_gms_connected_tag)
		rc = gf_err(GF_ERR_PROTOCOL, "connect: expected gms_connected, got %s", gf_msg_name(g->msg));
	if (rc == 0) {
		const gf_GmsConnected *c = &g->msg->body.gms_connected;
		if (c->granted != gf_GmsMode_GMS_MODE_RW && c->granted != gf_GmsMode_GMS_MODE_RO)
			rc = gf_err(GF_ERR_PROTOCOL, "connect: server granted mode %d", (int)c->granted);
		else if (c->granted == gf_GmsMode_GMS_MODE_RO && c->layout_hash.size != 16)
			rc = gf_err(GF_ERR_PROTOCOL, "connect: RO grant without a layout hash");
		/* Importing another backend's or device's handles fails obscurely later; say it now. */
		const char *mine = gf_mem_kind_name(gf_mem_kind(g->mem));
		char uuid[64] = "";
		if (rc == 0 && c->backend[0] && strcmp(c->backend, mine))
			rc = gf_err(GF_ERR_INVALID_ARG, "%s serves the %s backend, this client opened %s", g->uri_text,
				    c->backend, mine);
		if (rc == 0 && c->device_uuid[0] && gf_mem_device_uuid(g->mem, uuid, sizeof(uuid)) == 0 &&
		    strcmp(uuid, c->device_uuid))
			rc = gf_err(GF_ERR_INVALID_ARG, "%s serves device %s, this client's backend is bound to %s",
				    g->uri_text, c->device_uuid, uuid);
		if (rc == 0) {
			g->grant.mode = c->granted;
			g->grant.has_hash = c->layout_hash.size == 16;
			if (g->grant.has_hash)
				memcpy(g->grant.hash, c->layout_hash.bytes, 16);
			g->grant.handles_valid = c->handles_valid;
			g->grant.takes_progress = c->takes_progress;
			g->no_restore = c->no_restore;
			g->generation = c->generation;
			/* A server's word, bounded: a huge value would overflow the deadline below. */
			g->oom_retry_ms = c->oom_retry_ms <= 0 ? 0
					  : c->oom_retry_ms > GF_MAX_DURATION_MS ? GF_MAX_DURATION_MS : c->oom_retry_ms;
		}
	}
	return rc;
}

void gms_client_fill_connect(gf_gms *g, int mode, int64_t timeout_ms, bool with_list, bool handles_kept,
			 bool by_progress)
{
	gf_msg_start(g->msg, gf_Msg_gms_connect_tag);
	g->msg->body.gms_connect.mode = (gf_GmsMode)mode;
	g->msg->body.gms_connect.timeout_ms = timeout_ms < 0 ? -1 : timeout_ms;
	g->msg->body.gms_connect.with_list = with_list;
	g->msg->body.gms_connect.lock_epoch = g->lock_epoch;
	if (g->has_proof) {
		g->msg->body.gms_connect.lock_proof.size = GF_LOCK_PROOF_LEN;
		memcpy(g->msg->body.gms_connect.lock_proof.bytes, g->lock_proof, GF_LOCK_PROOF_LEN);
	}
	g->msg->body.gms_connect.handles_kept = handles_kept;
	g->msg->body.gms_connect.by_progress = by_progress;
}

/*
 * Send the request in @g->msg, then wait until its answer arrives or
 * @cancel_fd is readable (GF_ERR_INTERRUPTED; the caller drains it and
 * closes the connection, which withdraws the request in the server).
 */
static int wait_cancelable(gf_gms *g, int cancel_fd, int64_t deadline)
{
	g->msg->seq = ++g->seq;
	int rc = gf_msg_send(g->fd, g->msg, NULL, 0, deadline);
	if (rc < 0)
		return io_failed(g, rc);
	for (;;) {
		if (gf_frame_reader_buffered(&g->rd))
			return 0;
		struct pollfd p[2] = { { .fd = g->fd, .events = POLLIN }, { .fd = cancel_fd, .events = POLLIN } };
		int64_t left = deadline == INT64_MAX ? -1 : (deadline - gf_now_us() + 999) / 1000;
		int n = poll(p, 2, left < 0 ? -1 : left > INT32_MAX ? INT32_MAX : (int)left);
		if (n < 0 && errno != EINTR)
			return gf_err(GF_ERR_IO, "connect: poll: %s", strerror(errno));
		if (n > 0 && p[0].revents)
			return 0; /* the answer (or a hangup) is there: read it */
		if (n > 0 && p[1].revents)
			return gf_err(GF_ERR_INTERRUPTED, "connect to %s: interrupted while waiting", g->uri_text);
		if (n == 0 && left == 0)
			return 0; /* read now, and time out there */
	}
}

/* Read the answer to a request wait_cancelable() sent. */
static int request_reply(gf_gms *g, int64_t deadline)
{
	int rc = gf_msg_recv(&g->rd, g->fd, g->msg, NULL, NULL, deadline);
	if (rc < 0)
		return io_failed(g, rc);
	g->round_trips++;
	return gf_msg_error_code(g->msg);
}

/*
 * Connect and take the lock in @mode; fills @g->grant. By progress the
 * server alone knows when the wait ends (a writer's progress moves it), so
 * the reply has no deadline here: only the connect and handshake do.
 */
int gms_client_do_connect(gf_gms *g, int mode, int64_t timeout_ms, bool by_progress, int cancel_fd)
{
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	int64_t reply_deadline = deadline == INT64_MAX || by_progress ? INT64_MAX : deadline + GMS_REPLY_GRACE_US;
	/* 0 asks the GMS "only if grantable now": the handshake before it still needs its round trip. */
	int64_t open_deadline = timeout_ms == 0 ? gf_now_us() + GMS_REPLY_GRACE_US : deadline;
	int rc = gf_gms_open_session(g->uri_text, &g->uri, open_deadline, &g->fd, &g->rd, GF_MSG_MAX_FDS);
	if (rc < 0)
		return rc;
	/* Each request's answer is read whole before the next request: a
	 * frame's header and body come in one read (the wake's answer too, on
	 * the session kept through the sleep). */
	gf_frame_reader_set_read_ahead(&g->rd);
	gms_client_fill_connect(g, mode, timeout_ms, false, false, by_progress);
	rc = cancel_fd >= 0 ? wait_cancelable(g, cancel_fd, reply_deadline) : 0;
	if (rc == 0)
		rc = cancel_fd >= 0 ? request_reply(g, reply_deadline) : request(g, NULL, NULL, reply_deadline);
	if (rc == 0)
		rc = gms_client_take_connected(g);
	if (rc < 0) {
		/* A lost server during connect is "unreachable", not a loss of a held lock. */
		if (rc == GF_ERR_GMS_LOST)
			rc = gf_err(GF_ERR_UNREACHABLE, "%s", gf_error_detail());
		gms_client_close_conn(g);
	}
	return rc;
}

int gf_gms_connect(gf_gms **out, const char *uri, gf_mem *mem, int mode, int64_t timeout_ms,
		   const struct gf_gms_connect_opts *opts)
{
	static const struct gf_gms_connect_opts none = { .proof = NULL };
	if (!opts)
		opts = &none;
	if (!out || !uri || !mem)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_connect: NULL argument");
	if (mode != GF_GMS_RW && mode != GF_GMS_RO && mode != GF_GMS_RW_OR_RO)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_connect: unknown mode %d", mode);
	if (opts->proof && opts->proof->epoch == 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_connect: a proof of epoch 0 names no grant");
	const bool by_progress = opts->by_progress != 0;
	const int cancel_fd = by_progress && opts->cancel_fd > 0 ? opts->cancel_fd : -1;
	gf_gms *g = calloc(1, sizeof(*g));
	if (!g || !(g->msg = gf_msg_new())) {
		free(g);
		return gf_err(GF_ERR_NOMEM, "gf_gms_connect: out of memory");
	}
	g->fd = -1;
	g->parked_fd = -1;
	g->keep_handles = true;
	g->w_kick = -1;
	g->w_fd = -1;
	gmsc_fsm_init(&g->fsm);
	pthread_mutex_init(&g->kmu, NULL);
	pthread_cond_init(&g->w_idle, NULL);
	g->mem = mem;
	g->lock_epoch = opts->proof ? opts->proof->epoch : opts->lock_epoch;
	g->has_proof = opts->proof != NULL;
	if (g->has_proof)
		memcpy(g->lock_proof, opts->proof->token, GF_LOCK_PROOF_LEN);
	snprintf(g->uri_text, sizeof(g->uri_text), "%s", uri);
	size_t rec;
	int rc = gf_uri_parse(uri, &g->uri);
	if (rc == 0 && g->uri.kind != GF_URI_UNIX)
		rc = gf_err(GF_ERR_INVALID_ARG, "GMS URIs are unix:// (fds cannot cross hosts): %s", uri);
	if (rc == 0)
		rc = gf_mem_granularity(mem, &g->gran, &rec);
	if (rc == 0)
		rc = gms_client_do_connect(g, mode, timeout_ms, by_progress, cancel_fd);
	if (rc == 0 && !gmsc_fsm_granted(&g->fsm, g->grant.mode)) /* no watcher yet: no lock needed */
		rc = gf_err(GF_ERR_PROTOCOL, "connect: unexpected grant %d", g->grant.mode);
	if (rc == 0 && g->grant.mode == GF_GMS_RW) {
		uint64_t freeb, total;
		rc = gf_mem_info(mem, &freeb, &total);
		if (rc == 0)
			rc = gf_mem_reserve(&g->va, mem, round_up(total ? total : g->gran, g->gran), 0);
	}
	if (rc < 0) {
		gf_gms_free(g);
		return rc;
	}
	*out = g;
	return 0;
}

int gf_gms_set_lock_proof(gf_gms *gms, const struct gf_lock_proof *proof)
{
	if (!gms || (proof && proof->epoch == 0))
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_set_lock_proof: NULL client or a proof of epoch 0");
	gms->lock_epoch = proof ? proof->epoch : 0;
	gms->has_proof = proof != NULL;
	if (proof)
		memcpy(gms->lock_proof, proof->token, GF_LOCK_PROOF_LEN);
	return 0;
}

int gf_gms_granted_mode(const gf_gms *gms)
{
	if (!gms)
		return 0;
	struct gmsc_fsm f = gms_client_fsm_get(gms);
	return gmsc_fsm_mode(&f);
}

/* Unmap (fenced mappings included: they hold the allocations too) and release every import.
 * Not while the watcher keeps them asleep, unless under kmu (it may release them too). */
void gms_client_release_imports(gf_gms *g)
{
	if (g->va)
		gf_mem_unmap_all(g->va);
	for (size_t i = 0; i < g->nallocs; i++) {
		gf_mem_alloc_free(g->allocs[i].a);
		g->allocs[i].a = NULL;
	}
}

/* ---------------------------------------------------------------- the session watcher */

static void watcher_kick(gf_gms *g)
{
	uint64_t one = 1;
	ssize_t w = write(g->w_kick, &one, sizeof(one));
	(void)w; /* a full counter is still readable: the kick is not lost */
}

static void *watcher_main(void *arg)
{
	gf_gms *g = arg;
	pthread_mutex_lock(&g->kmu);
	while (!g->w_quit) {
		int fd = g->w_fd;
		unsigned gen = g->w_gen;
		pthread_mutex_unlock(&g->kmu);
		/* Only a hangup is asked for (POLLIN is not): replies never wake this thread. */
		struct pollfd p[2] = {{.fd = fd, .events = POLLRDHUP}, {.fd = g->w_kick, .events = POLLIN}};
		int n = poll(p, 2, -1);
		if (n < 0 && errno != EINTR)
			usleep(1000); /* ENOMEM: try again, without spinning */
		if (n > 0 && (p[1].revents & POLLIN)) {
			uint64_t x;
			ssize_t r = read(g->w_kick, &x, sizeof(x));
			(void)r;
		}
		pthread_mutex_lock(&g->kmu);
		if (n <= 0 || fd < 0 || !hung_up(p[0].revents) || g->w_gen != gen)
			continue; /* nothing, or another session meanwhile: look again */
		/* A hangup on the session polled: stop polling it; the FSM says what it means now. */
		g->w_fd = -1;
		g->w_gen++;
		switch (gmsc_fsm_hangup(&g->fsm)) {
		case GMSC_HANGUP_RELEASE:
			gf_log(GF_LOG_INFO, "gms", "event=kept_session_closed gms=%s state=asleep released_handles=%zu",
			       g->uri_text, g->nallocs);
			gms_client_release_imports(g);
			break;
		case GMSC_HANGUP_LOST:
			g->w_busy = true;
			pthread_mutex_unlock(&g->kmu);
			announce_lost(g, "connection hung up");
			pthread_mutex_lock(&g->kmu);
			g->w_busy = false;
			pthread_cond_broadcast(&g->w_idle);
			break;
		case GMSC_HANGUP_IGNORE:
			break;
		}
	}
	pthread_mutex_unlock(&g->kmu);
	return NULL;
}

/* Called with kmu held: poll @fd from now on (starting the thread the
 * first time); kicks the thread only when the fd changes. < 0: nothing polled. */
int gms_client_watch_set_locked(gf_gms *g, int fd)
{
	if (fd == g->w_fd)
		return 0;
	if (g->w_running) {
		watcher_kick(g);
	} else if (fd >= 0) {
		if (g->w_kick < 0 && (g->w_kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
			return gf_err_errno(GF_ERR_IO, errno, "watch: eventfd");
		int rc = pthread_create(&g->w_thread, NULL, watcher_main, g);
		if (rc)
			return gf_err_errno(GF_ERR_IO, rc, "watch: pthread_create");
		g->w_running = true;
	}
	g->w_fd = fd;
	g->w_gen++;
	return 0;
}

/* @fd is about to be closed: the watcher must not hold it open (a poll keeps its file alive). */
static void watch_forget(gf_gms *g, int fd)
{
	if (fd < 0)
		return;
	pthread_mutex_lock(&g->kmu);
	if (g->w_fd == fd)
		gms_client_watch_set_locked(g, -1);
	pthread_mutex_unlock(&g->kmu);
}

static void watcher_stop(gf_gms *g)
{
	pthread_mutex_lock(&g->kmu);
	bool running = g->w_running;
	g->w_quit = true;
	pthread_mutex_unlock(&g->kmu);
	if (running) {
		watcher_kick(g);
		pthread_join(g->w_thread, NULL);
		g->w_running = false;
	}
	gf_close(g->w_kick);
	g->w_kick = -1;
}

int gf_gms_set_keep_handles(gf_gms *gms, int keep)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	gms->keep_handles = keep != 0;
	return 0;
}

/* The kept session goes, and with it any kept handles (no server can vouch for them now). */
void gms_client_drop_parked(gf_gms *g)
{
	pthread_mutex_lock(&g->kmu);
	gmsc_fsm_dropped(&g->fsm); /* from here the watcher leaves the handles alone */
	pthread_mutex_unlock(&g->kmu);
	watch_forget(g, g->parked_fd);
	gms_client_release_imports(g);
	gf_close(g->parked_fd);
	g->parked_fd = -1;
	gf_frame_reader_clear(&g->parked_rd);
}

void gf_gms_free(gf_gms *gms)
{
	if (!gms)
		return;
	gf_gms_stop_watch(gms);
	watcher_stop(gms);
	gms_client_release_imports(gms);
	gf_mem_va_free(gms->va);
	gms->va = NULL;
	if (gms->fd >= 0)
		gms_client_close_conn(gms);
	if (gms->parked_fd >= 0)
		gms_client_drop_parked(gms);
	for (size_t i = 0; i < gms->nmeta; i++)
		meta_entry_free(gms, &gms->meta[i]);
	free(gms->meta);
	free(gms->meta_blob);
	free(gms->allocs);
	gf_msg_free(gms->msg);
	pthread_cond_destroy(&gms->w_idle);
	pthread_mutex_destroy(&gms->kmu);
	free(gms);
}

/* ---------------------------------------------------------------- writer */

int gf_gms_allocate(gf_gms *gms, uint64_t size, const char *tag, uint64_t *id)
{
	int mode = -1, rc = check_usable(gms, &mode);
	if (rc < 0)
		return rc;
	if (mode != GF_GMS_RW)
		return gf_err(GF_ERR_STATE, "allocate needs the RW lock (granted RO)");
	if (size == 0)
		return gf_err(GF_ERR_INVALID_ARG, "allocate: size 0");
	if (tag && strlen(tag) >= GF_LIMIT_TAG)
		return gf_err(GF_ERR_INVALID_ARG, "allocate: tag longer than %d bytes", GF_LIMIT_TAG - 1);
	uint64_t offset = round_up(gms->va_used, gms->gran);
	if (offset + round_up(size, gms->gran) > gf_mem_va_size(gms->va))
		return gf_err(GF_ERR_OUT_OF_MEMORY, "allocate %llu bytes: address reservation of %zu bytes exhausted",
			      (unsigned long long)size, gf_mem_va_size(gms->va));
	if (gms->nallocs == gms->allocs_cap) {
		size_t cap = gms->allocs_cap ? gms->allocs_cap * 2 : 64;
		struct calloc_entry *n = realloc(gms->allocs, cap * sizeof(*n));
		if (!n)
			return gf_err(GF_ERR_NOMEM, "allocate: out of memory");
		gms->allocs = n;
		gms->allocs_cap = cap;
	}
	memset(gms->msg, 0, sizeof(*gms->msg));
	gms->msg->which_body = gf_Msg_gms_allocate_tag;
	gms->msg->body.gms_allocate.size = size;
	snprintf(gms->msg->body.gms_allocate.tag, sizeof(gms->msg->body.gms_allocate.tag), "%s", tag ? tag : "");
	int *fds = NULL;
	size_t nfds = 0;
	/* The server bounds its OOM retry and announced the bound; a stopped server must not hang us. */
	rc = request(gms, &fds, &nfds, gf_now_us() + gms->oom_retry_ms * 1000 + GMS_IO_TIMEOUT_US);
	if (rc < 0)
		return rc;
	if (gms->msg->which_body != gf_Msg_gms_allocated_tag || nfds != 1 ||
	    !gms->msg->body.gms_allocated.has_allocation) {
		gf_close_fds(fds, nfds);
		free(fds);
		return gf_err(GF_ERR_PROTOCOL, "allocate: expected gms_allocated with one fd, got %s with %zu",
			      gf_msg_name(gms->msg), nfds);
	}
	const gf_GmsAllocation *a = &gms->msg->body.gms_allocated.allocation;
	gf_mem_alloc *imp = NULL;
	rc = gf_mem_import_adopt(&imp, gms->mem, fds[0], a->size); /* the received fd becomes the handle */
	free(fds);
	if (rc < 0)
		return rc;
	if (offset + a->size > gf_mem_va_size(gms->va)) {
		gf_mem_alloc_free(imp);
		return gf_err(GF_ERR_OUT_OF_MEMORY, "allocate: rounded size %llu exceeds the reservation",
			      (unsigned long long)a->size);
	}
	rc = gf_mem_map(gms->va, offset, imp, GF_MEM_READWRITE);
	if (rc < 0) {
		gf_mem_alloc_free(imp);
		return rc;
	}
	struct calloc_entry *e = &gms->allocs[gms->nallocs++];
	e->id = a->id;
	e->size = a->size;
	e->offset = offset;
	e->a = imp;
	snprintf(e->tag, sizeof(e->tag), "%s", a->tag);
	gms->va_used = offset + a->size;
	if (id)
		*id = a->id;
	return 0;
}

int gf_gms_report_progress(gf_gms *gms, uint64_t done_bytes, uint64_t total_bytes)
{
	int mode = -1, rc = check_usable(gms, &mode);
	if (rc < 0)
		return rc;
	if (mode != GF_GMS_RW)
		return gf_err(GF_ERR_STATE, "progress is reported by the writer (granted RO)");
	if (!gms->grant.takes_progress)
		return 0;
	int64_t now = gf_now_us();
	if (gms->progress_sent_us && now - gms->progress_sent_us < GMS_PROGRESS_EVERY_US)
		return 0;
	memset(gms->msg, 0, sizeof(*gms->msg));
	gms->msg->which_body = gf_Msg_gms_progress_tag;
	gms->msg->body.gms_progress.done_bytes = done_bytes;
	gms->msg->body.gms_progress.total_bytes = total_bytes;
	rc = request(gms, NULL, NULL, now + GMS_IO_TIMEOUT_US);
	if (rc < 0)
		return rc;
	if (gms->msg->which_body != gf_Msg_ok_tag)
		return gf_err(GF_ERR_PROTOCOL, "progress: expected ok, got %s", gf_msg_name(gms->msg));
	gms->progress_sent_us = now;
	return 0;
}

static const struct calloc_entry *find_alloc(const gf_gms *g, uint64_t id)
{
	/* The server numbers allocations 1..n in order: try the direct slot first. */
	if (id >= 1 && id <= g->nallocs && g->allocs[id - 1].id == id)
		return &g->allocs[id - 1];
	for (size_t i = 0; i < g->nallocs; i++)
		if (g->allocs[i].id == id)
			return &g->allocs[i];
	return NULL;
}

/* Room for @more entries. */
static int meta_reserve(gf_gms *g, size_t more)
{
	if (g->nmeta + more <= g->meta_cap)
		return 0;
	size_t cap = g->meta_cap ? g->meta_cap * 2 : 256;
	while (cap < g->nmeta + more)
		cap *= 2;
	struct cmeta *n = realloc(g->meta, cap * sizeof(*n));
	if (!n)
		return gf_err(GF_ERR_NOMEM, "metadata: out of memory");
	g->meta = n;
	g->meta_cap = cap;
	return 0;
}

static int meta_append(gf_gms *g, const char *key, uint64_t alloc_id, uint64_t offset, const void *value,
		       size_t value_len)
{
	int rc = meta_reserve(g, 1);
	if (rc < 0)
		return rc;
	struct cmeta *e = &g->meta[g->nmeta];
	/* One block per entry: the key, its NUL, then the value (freed with the key). */
	size_t klen = strlen(key);
	e->key = malloc(klen + 1 + value_len);
	if (!e->key)
		return gf_err(GF_ERR_NOMEM, "metadata: out of memory");
	memcpy(e->key, key, klen + 1);
	e->value = (uint8_t *)e->key + klen + 1;
	if (value_len)
		memcpy(e->value, value, value_len);
	e->value_len = value_len;
	e->alloc_id = alloc_id;
	e->offset = offset;
	g->nmeta++;
	return 0;
}

int gf_gms_put_meta(gf_gms *gms, const char *key, uint64_t alloc_id, uint64_t offset, const void *value,
		    size_t value_len)
{
	int mode = -1, rc = check_usable(gms, &mode);
	if (rc < 0)
		return rc;
	if (mode != GF_GMS_RW)
		return gf_err(GF_ERR_STATE, "put metadata needs the RW lock");
	if (!key || !*key || strlen(key) >= GF_LIMIT_META_KEY)
		return gf_err(GF_ERR_INVALID_ARG, "metadata key must be 1..%d bytes", GF_LIMIT_META_KEY - 1);
	if (value_len > GF_LIMIT_META_VALUE || (value_len && !value))
		return gf_err(GF_ERR_INVALID_ARG, "metadata value must be 0..%d bytes", GF_LIMIT_META_VALUE);
	memset(gms->msg, 0, sizeof(*gms->msg));
	gms->msg->which_body = gf_Msg_gms_meta_put_tag;
	gf_GmsMetaPut *p = &gms->msg->body.gms_meta_put;
	snprintf(p->key, sizeof(p->key), "%s", key);
	p->allocation_id = alloc_id;
	p->offset = offset;
	if (value_len)
		memcpy(p->value.bytes, value, value_len);
	p->value.size = (pb_size_t)value_len;
	rc = request(gms, NULL, NULL, gf_now_us() + GMS_IO_TIMEOUT_US);
	if (rc < 0)
		return rc;
	if (gms->msg->which_body != gf_Msg_ok_tag)
		return gf_err(GF_ERR_PROTOCOL, "put metadata: expected ok, got %s", gf_msg_name(gms->msg));
	gms->meta_sorted = false;
	return meta_append(gms, key, alloc_id, offset, value, value_len);
}

static int cmeta_cmp(const void *a, const void *b)
{
	return strcmp(((const struct cmeta *)a)->key, ((const struct cmeta *)b)->key);
}

struct gf_mem_mapping *gms_client_mapping_list(gf_gms *g)
{
	struct gf_mem_mapping *maps = calloc(g->nallocs ? g->nallocs : 1, sizeof(*maps));
	if (!maps)
		return NULL;
	for (size_t i = 0; i < g->nallocs; i++) {
		maps[i].offset = g->allocs[i].offset;
		maps[i].alloc = g->allocs[i].a;
	}
	return maps;
}

int gf_gms_commit(gf_gms *gms, uint64_t *generation)
{
	int mode = -1, rc = check_usable(gms, &mode);
	if (rc < 0)
		return rc;
	if (mode != GF_GMS_RW)
		return gf_err(GF_ERR_STATE, "commit needs the RW lock");
	struct gf_mem_mapping *maps = gms_client_mapping_list(gms);
	if (!maps)
		return gf_err(GF_ERR_NOMEM, "commit: out of memory");
	/* Writes still queued on the device must land before readers can see the layout. */
	if ((rc = gf_mem_synchronize(gms->mem)) < 0) {
		free(maps);
		return rc;
	}
	memset(gms->msg, 0, sizeof(*gms->msg));
	gms->msg->which_body = gf_Msg_gms_commit_tag;
	rc = request(gms, NULL, NULL, gf_now_us() + GMS_IO_TIMEOUT_US);
	if (rc == 0 && (gms->msg->which_body != gf_Msg_gms_committed_tag ||
			gms->msg->body.gms_committed.layout_hash.size != 16))
		rc = gf_err(GF_ERR_PROTOCOL, "commit: expected gms_committed, got %s", gf_msg_name(gms->msg));
	if (rc < 0) {
		free(maps);
		return rc;
	}
	pthread_mutex_lock(&gms->kmu);
	gmsc_fsm_committed(&gms->fsm, gms->msg->body.gms_committed.layout_hash.bytes, gms->nallocs);
	pthread_mutex_unlock(&gms->kmu);
	gms->generation = gms->msg->body.gms_committed.generation;
	if (gms->nmeta)
		qsort(gms->meta, gms->nmeta, sizeof(*gms->meta), cmeta_cmp);
	gms->meta_sorted = true;
	/* Same reservation, same offsets, same physical memory: only the protection changes. */
	if (gms->nallocs) {
		rc = gf_mem_unmap_all(gms->va);
		if (rc == 0)
			rc = gf_mem_map_many(gms->va, maps, gms->nallocs, GF_MEM_READ);
	}
	free(maps);
	if (rc < 0)
		return rc;
	if (generation)
		*generation = gms->generation;
	return 0;
}

/* ---------------------------------------------------------------- reader */

static int meta_from_blob(void *ud, const struct gf_lc_meta *e)
{
	gf_gms *g = ud;
	/* meta_take_blob() reserved room for every entry. */
	g->meta[g->nmeta++] = (struct cmeta){(char *)e->key, e->alloc_id, e->offset, (uint8_t *)e->value, e->value_len};
	return 0;
}

/* Read, check and take the metadata blob behind @fd (@size bytes, @count entries; the caller closes @fd). */
static int meta_take_blob(gf_gms *g, int fd, uint64_t size, uint32_t count)
{
	if (g->meta_blob)
		return gf_err(GF_ERR_PROTOCOL, "list: a second metadata blob");
	uint8_t *buf;
	int rc = meta_reserve(g, count);
	if (rc == 0)
		rc = gf_mb_read_fd(fd, size, &buf);
	if (rc < 0)
		return rc;
	size_t before = g->nmeta;
	rc = gf_mb_decode(buf, (size_t)size, count, meta_from_blob, g);
	if (rc < 0) {
		g->nmeta = before; /* the entries decoded so far point into buf */
		free(buf);
		return rc;
	}
	g->meta_blob = buf;
	g->meta_blob_len = (size_t)size;
	return 0;
}


void gms_client_listed_free(struct listed *l)
{
	gf_close_fds(l->fds, l->nfds);
	free(l->fds);
	free(l->allocs);
	memset(l, 0, sizeof(*l));
}

/*
 * One bulk list: send GmsList, receive every chunk back to back. Metadata go
 * to @g unless @with_meta is false. @on_chunk (optional) works on each chunk's
 * allocations while the server prepares the next; when anything fails, the
 * caller undoes what it did.
 */
int gms_client_list_all(gf_gms *g, bool with_meta, struct listed *l, chunk_fn on_chunk, bool already_asked)
{
	int64_t deadline = gf_now_us() + GMS_IO_TIMEOUT_US;
	memset(l, 0, sizeof(*l));
	int rc;
	/* A wake's GmsConnect asked for the list with the grant: the chunks are on their way. */
	if (!already_asked) {
		memset(g->msg, 0, sizeof(*g->msg));
		g->msg->which_body = gf_Msg_gms_list_tag;
		g->msg->body.gms_list.with_fds = true;
		g->msg->body.gms_list.without_metadata = !with_meta;
		g->msg->body.gms_list.metadata_blob = with_meta;
		g->msg->seq = ++g->seq;
		rc = gf_msg_send(g->fd, g->msg, NULL, 0, deadline);
		if (rc < 0)
			return io_failed(g, rc);
		g->round_trips++;
	}
	for (bool first = true;; first = false) {
		int *fds = NULL;
		size_t nfds = 0;
		rc = gf_msg_recv(&g->rd, g->fd, g->msg, &fds, &nfds, deadline);
		if (rc < 0) {
			gms_client_listed_free(l);
			return io_failed(g, rc);
		}
		if ((rc = gf_msg_error_code(g->msg)) < 0 || g->msg->which_body != gf_Msg_gms_list_chunk_tag) {
			gf_close_fds(fds, nfds);
			free(fds);
			gms_client_listed_free(l);
			return rc < 0 ? rc : gf_err(GF_ERR_PROTOCOL, "list: expected gms_list_chunk, got %s",
						    gf_msg_name(g->msg));
		}
		const gf_GmsListChunk *ch = &g->msg->body.gms_list_chunk;
		/* A metadata blob comes only in the first chunk of a list that asked for metadata, as its last fd. */
		bool blob = ch->metadata_blob_size != 0;
		if (nfds != (size_t)ch->allocations_count + (blob ? 1 : 0) || ch->layout_hash.size != 16 ||
		    (!first && memcmp(l->hash, ch->layout_hash.bytes, 16)) ||
		    (blob && (!first || !with_meta || ch->metadata_count))) {
			gf_close_fds(fds, nfds);
			free(fds);
			gms_client_listed_free(l);
			return gf_err(GF_ERR_PROTOCOL, "list: chunk with %u allocations%s carries %zu fds",
				      (unsigned)ch->allocations_count, blob ? " and a metadata blob" : "", nfds);
		}
		if (blob) {
			rc = meta_take_blob(g, fds[ch->allocations_count], ch->metadata_blob_size, ch->total_metadata);
			gf_close(fds[ch->allocations_count]);
			if (rc < 0) {
				gf_close_fds(fds, ch->allocations_count);
				free(fds);
				gms_client_listed_free(l);
				return rc;
			}
		}
		memcpy(l->hash, ch->layout_hash.bytes, 16);
		l->generation = ch->generation;
		l->total = ch->total_allocations;
		size_t chunk_first = l->n;
		if (l->n + ch->allocations_count > l->cap) {
			size_t cap = l->cap ? l->cap * 2 : 64;
			while (cap < l->n + ch->allocations_count)
				cap *= 2;
			struct calloc_entry *na = realloc(l->allocs, cap * sizeof(*na));
			int *nf = realloc(l->fds, cap * sizeof(*nf));
			if (na)
				l->allocs = na;
			if (nf)
				l->fds = nf;
			if (!na || !nf) {
				gf_close_fds(fds, nfds);
				free(fds);
				gms_client_listed_free(l);
				return gf_err(GF_ERR_NOMEM, "list: out of memory");
			}
			l->cap = cap;
		}
		for (size_t i = 0; i < ch->allocations_count; i++) {
			struct calloc_entry *e = &l->allocs[l->n];
			memset(e, 0, sizeof(*e));
			e->id = ch->allocations[i].id;
			e->size = ch->allocations[i].size;
			snprintf(e->tag, sizeof(e->tag), "%s", ch->allocations[i].tag);
			l->fds[l->n] = fds[i];
			l->n++;
			l->nfds++;
		}
		free(fds);
		if (on_chunk && (rc = on_chunk(g, l, chunk_first)) < 0) {
			gms_client_listed_free(l);
			return rc;
		}
		for (size_t i = 0; with_meta && i < ch->metadata_count; i++) {
			const gf_GmsMetaEntry *e = &ch->metadata[i];
			if ((rc = meta_append(g, e->key, e->allocation_id, e->offset, e->value.bytes, e->value.size)) < 0) {
				gms_client_listed_free(l);
				return rc;
			}
		}
		if (ch->last) {
			if (l->n != ch->total_allocations) {
				gms_client_listed_free(l);
				return gf_err(GF_ERR_PROTOCOL, "list: %zu allocations received, %u announced", l->n,
					      (unsigned)ch->total_allocations);
			}
			return 0;
		}
	}
}

/* Import every listed fd and map all at @offsets, read-only; all-or-nothing. */
static int import_and_map(gf_gms *g, struct listed *l)
{
	int rc = 0;
	/* Each received fd becomes its allocation's handle (no dup, no close); the rest are closed on failure. */
	for (size_t i = 0; i < l->n && rc == 0; i++) {
		rc = gf_mem_import_adopt(&l->allocs[i].a, g->mem, l->fds[i], l->allocs[i].size);
		l->fds[i] = -1;
	}
	gf_close_fds(l->fds, l->nfds);
	l->nfds = 0;
	struct gf_mem_mapping *maps = NULL;
	if (rc == 0 && l->n) {
		maps = calloc(l->n, sizeof(*maps));
		if (!maps)
			rc = gf_err(GF_ERR_NOMEM, "map: out of memory");
		for (size_t i = 0; maps && i < l->n; i++) {
			maps[i].offset = l->allocs[i].offset;
			maps[i].alloc = l->allocs[i].a;
		}
		if (rc == 0)
			rc = gf_mem_map_many(g->va, maps, l->n, GF_MEM_READ);
	}
	free(maps);
	if (rc < 0)
		for (size_t i = 0; i < l->n; i++) {
			gf_mem_alloc_free(l->allocs[i].a);
			l->allocs[i].a = NULL;
		}
	return rc;
}

int gf_gms_map_all(gf_gms *gms)
{
	int mode = -1, rc = check_usable(gms, &mode);
	if (rc < 0)
		return rc;
	if (mode != GF_GMS_RO)
		return gf_err(GF_ERR_STATE, "map_all needs the RO lock (commit first when writing)");
	if (gms->fsm.have_layout)
		return 0; /* the writer that committed, or already mapped */
	struct listed l;
	size_t meta_before = gms->nmeta;
	bool blob_before = gms->meta_blob != NULL;
	if ((rc = gms_client_list_all(gms, true, &l, NULL, false)) < 0)
		goto fail_meta;
	/* The grant that made this client a reader named the layout the list must be. */
	if (memcmp(l.hash, gms->grant.hash, 16)) {
		gms_client_listed_free(&l);
		rc = gf_err(GF_ERR_PROTOCOL, "list: layout hash differs from the one granted");
		goto fail_meta;
	}
	uint64_t off = 0;
	for (size_t i = 0; i < l.n; i++) {
		l.allocs[i].offset = off;
		off = round_up(off + l.allocs[i].size, gms->gran);
	}
	if (!gms->va && (rc = gf_mem_reserve(&gms->va, gms->mem, off ? off : gms->gran, 0)) < 0) {
		gms_client_listed_free(&l);
		goto fail_meta;
	}
	if (off > gf_mem_va_size(gms->va)) {
		gms_client_listed_free(&l);
		rc = gf_err(GF_ERR_STATE, "layout of %llu bytes exceeds the reservation", (unsigned long long)off);
		goto fail_meta;
	}
	if ((rc = import_and_map(gms, &l)) < 0) {
		gms_client_listed_free(&l);
		goto fail_meta;
	}
	free(gms->allocs);
	gms->allocs = l.allocs;
	gms->nallocs = l.n;
	gms->allocs_cap = l.cap;
	gms->va_used = off;
	free(l.fds);
	pthread_mutex_lock(&gms->kmu);
	gmsc_fsm_layout_mapped(&gms->fsm, l.hash, l.n);
	pthread_mutex_unlock(&gms->kmu);
	gms->generation = l.generation;
	gms->meta_sorted = true; /* the server lists metadata sorted by key */
	return 0;
fail_meta:
	while (gms->nmeta > meta_before) {
		gms->nmeta--;
		meta_entry_free(gms, &gms->meta[gms->nmeta]);
	}
	if (!blob_before && gms->meta_blob) {
		free(gms->meta_blob);
		gms->meta_blob = NULL;
		gms->meta_blob_len = 0;
	}
	return rc;
}

/* ---------------------------------------------------------------- queries */

size_t gf_gms_alloc_count(const gf_gms *gms)
{
	return gms ? gms->nallocs : 0;
}

int gf_gms_alloc_at(const gf_gms *gms, size_t index, struct gf_gms_alloc_info *out)
{
	if (!gms || !out || index >= gms->nallocs)
		return gf_err(GF_ERR_INVALID_ARG, "alloc_at: index %zu out of range", index);
	const struct calloc_entry *e = &gms->allocs[index];
	memset(out, 0, sizeof(*out));
	out->id = e->id;
	out->size = e->size;
	out->addr = gms->va ? gf_mem_va_addr(gms->va) + e->offset : 0;
	snprintf(out->tag, sizeof(out->tag), "%s", e->tag);
	return 0;
}

size_t gf_gms_meta_count(const gf_gms *gms)
{
	return gms ? gms->nmeta : 0;
}

static void meta_fill(const gf_gms *g, const struct cmeta *m, struct gf_gms_meta *out)
{
	const struct calloc_entry *a = find_alloc(g, m->alloc_id);
	out->key = m->key;
	out->alloc_id = m->alloc_id;
	out->offset = m->offset;
	out->addr = a && g->va ? gf_mem_va_addr(g->va) + a->offset + m->offset : 0;
	out->value = m->value;
	out->value_len = m->value_len;
}

int gf_gms_meta_at(const gf_gms *gms, size_t index, struct gf_gms_meta *out)
{
	if (!gms || !out || index >= gms->nmeta)
		return gf_err(GF_ERR_INVALID_ARG, "meta_at: index %zu out of range", index);
	meta_fill(gms, &gms->meta[index], out);
	return 0;
}

int gf_gms_meta_get(const gf_gms *gms, const char *key, struct gf_gms_meta *out)
{
	if (!gms || !key || !out)
		return gf_err(GF_ERR_INVALID_ARG, "meta_get: NULL argument");
	const struct cmeta *m = NULL;
	if (gms->meta_sorted) {
		struct cmeta probe = {.key = (char *)key};
		m = gms->nmeta ? bsearch(&probe, gms->meta, gms->nmeta, sizeof(*gms->meta), cmeta_cmp) : NULL;
	} else {
		for (size_t i = 0; i < gms->nmeta && !m; i++)
			if (!strcmp(gms->meta[i].key, key))
				m = &gms->meta[i];
	}
	if (!m)
		return gf_err(GF_ERR_NOT_FOUND, "no metadata key %s", key);
	meta_fill(gms, m, out);
	return 0;
}

int gf_gms_layout(const gf_gms *gms, uint8_t hash[16], uint64_t *generation)
{
	if (!gms || !hash)
		return gf_err(GF_ERR_INVALID_ARG, "layout: NULL argument");
	struct gmsc_fsm f = gms_client_fsm_get(gms);
	if (!f.have_layout)
		return gf_err(GF_ERR_STATE, "no committed layout known to this client yet");
	memcpy(hash, f.hash, 16);
	if (generation)
		*generation = gms->generation;
	return 0;
}

/* ---------------------------------------------------------------- sleep / wake */

/* ---------------------------------------------------------------- loss detection */

void gf_gms_set_lost_fn(gf_gms *gms, gf_gms_lost_fn fn, void *userdata)
{
	if (!gms)
		return;
	gms->lost_fn = fn;
	gms->lost_ud = userdata;
}

int gf_gms_get_fd(const gf_gms *gms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	if (gms->fd < 0)
		return gf_err(GF_ERR_STATE, "not connected (asleep)");
	return gms->fd;
}

/* The server never speaks unasked, so a hangup (or anything readable) while idle means it is gone. */
static bool hung_up(short revents)
{
	return revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL);
}

int gf_gms_process(gf_gms *gms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	struct gmsc_fsm f = gms_client_fsm_get(gms);
	if (f.state == GMSC_LOST)
		return gf_err(GF_ERR_GMS_LOST, "GPU memory service %s was lost", gms->uri_text);
	if (!gmsc_fsm_mode(&f))
		return 0;
	struct pollfd p = {.fd = gms->fd, .events = POLLRDHUP};
	if (poll(&p, 1, 0) > 0 && hung_up(p.revents)) {
		report_lost(gms, "connection hung up");
		return gf_err(GF_ERR_GMS_LOST, "GPU memory service %s hung up", gms->uri_text);
	}
	return 0;
}

int gf_gms_start_watch(gf_gms *gms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	pthread_mutex_lock(&gms->kmu);
	gms->fsm.watch = true;
	/* Asleep: the wake points the watcher at its session. After a wake on
	 * the kept session the thread polls this fd already: no kick. */
	int rc = gmsc_fsm_mode(&gms->fsm) ? gms_client_watch_set_locked(gms, gms->fd) : 0;
	pthread_mutex_unlock(&gms->kmu);
	return rc;
}

void gf_gms_stop_watch(gf_gms *gms)
{
	if (!gms)
		return;
	pthread_mutex_lock(&gms->kmu);
	gms->fsm.watch = false; /* the thread stays, parked on the same session */
	/* A hook running on the watcher finishes first, unless this is the hook. */
	while (gms->w_busy && !pthread_equal(pthread_self(), gms->w_thread))
		pthread_cond_wait(&gms->w_idle, &gms->kmu);
	pthread_mutex_unlock(&gms->kmu);
}
