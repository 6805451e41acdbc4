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
 * Sleep and wake: this file does the I/O; where the client stands and every
 * decision about it (what a sleep keeps, which way a wake goes, what a
 * hangup means, whether a layout is stale) is client_fsm.c's.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "gpufailover/lock.h"
#include "mem_int.h"
#include "client_fsm.h"
#include "client_session.h"
#include "gms_internal.h"
#include "metablob.h"
#include "wire.h"
#include "xfer.h"

#define GMS_REPLY_GRACE_US 2000000 /* the server answers TIMEOUT itself; this only guards against a stuck server */
#define GMS_IO_TIMEOUT_US 30000000 /* ordinary requests */
#define GMS_PROGRESS_EVERY_US 100000 /* a writer's progress reports: at most this often on the wire */

struct calloc_entry {
	uint64_t id, size, offset;
	char tag[GF_LIMIT_TAG];
	gf_mem_alloc *a; /* NULL while asleep */
};

struct cmeta {
	char *key;
	uint64_t alloc_id, offset;
	uint8_t *value; /* inside the key's block */
	size_t value_len;
};

/* What the last GmsConnected said. */
struct grant {
	int mode;           /* GF_GMS_RW or GF_GMS_RO */
	bool has_hash;
	uint8_t hash[16];   /* the committed layout's, with an RO grant */
	bool handles_valid; /* a wake's: the handles kept asleep are this layout's */
	bool takes_progress; /* the server takes GmsProgress from its writer */
};

struct gf_gms {
	char uri_text[256];
	struct gf_uri uri;
	gf_mem *mem;
	/*
	 * Where sleep and wake stand: the lock held, what a sleeper keeps, the
	 * layout a wake must find again (client_fsm.h; docs/gms.md "The
	 * client's states"). Every decision about them is the FSM's. Guarded
	 * by kmu: the watcher thread delivers hangups to it (it changes only
	 * state, kept and lost_mode; the layout fields are this thread's).
	 */
	struct gmsc_fsm fsm;
	int fd;
	struct gf_frame_reader rd;
	/* Asleep as a reader: the session, handshaken, without a lock, so that
	 * a wake is one request (GmsConnect with the list). -1 when none. */
	int parked_fd;
	struct gf_frame_reader parked_rd;
	/* WAKING: gf_gms_remap() reads the reply to the wake's GmsConnect by this deadline. */
	int64_t wake_reply_deadline;
	/* Asleep on a kept session, a reader also keeps its imported handles
	 * (allocs[].a), so a wake whose layout is unchanged maps them with no
	 * list and no fds. They pin the layout's memory: the GMS closes the
	 * session when it drops the layout, and the watcher then releases them. */
	bool keep_handles; /* gf_gms_set_keep_handles(); default true */
	/*
	 * The session watcher: one thread per client, started the first time
	 * it is needed and parked between uses, polling the session for a
	 * hangup only. What a hangup means is the FSM's to say: asleep with
	 * handles, the GMS dropped the layout (release them); awake and
	 * watched, the GMS is lost (the hook runs); otherwise nothing (a wake
	 * in progress sees it itself). A state change on the same session
	 * needs no kick, so the wake neither starts a thread nor wakes one.
	 * kmu guards the FSM, the handles while the watcher may release them,
	 * and w_*; w_gen tells the thread that the fd it polled has changed since.
	 */
	pthread_mutex_t kmu;
	pthread_cond_t w_idle;  /* w_busy went false */
	pthread_t w_thread;
	bool w_running;
	int w_kick;             /* eventfd: re-read w_fd, or quit */
	int w_fd;               /* the session polled; -1: none */
	unsigned w_gen;
	bool w_quit, w_busy;
	uint32_t seq;
	gf_Msg *msg;
	struct grant grant;
	gf_gms_lost_fn lost_fn;
	void *lost_ud;

	gf_mem_va *va;
	size_t gran;
	uint64_t va_used;

	struct calloc_entry *allocs;
	size_t nallocs, allocs_cap;
	struct cmeta *meta;
	size_t nmeta, meta_cap;
	bool meta_sorted;
	/* A reader's metadata as the GMS sent them (one blob): entries point
	 * into it rather than owning a block each. NULL when they came in chunks. */
	uint8_t *meta_blob;
	size_t meta_blob_len;

	uint64_t generation;
	int64_t oom_retry_ms;       /* the server's allocation retry bound */
	uint64_t lock_epoch;        /* sent with every connect: the fence of a GMS tied to a lock */
	bool has_proof;             /* and the fence proof of that grant */
	uint8_t lock_proof[GF_LOCK_PROOF_LEN];

	uint64_t round_trips;
	int64_t progress_sent_us; /* the last GmsProgress sent (0: none) */
};

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

/* ---------------------------------------------------------------- the FSM */

/* A copy of the FSM, read under its lock (the lock is not part of the client's value). */
static struct gmsc_fsm fsm_get(const gf_gms *g)
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
	gf_log(GF_LOG_WARN, "gms", "GPU memory service %s lost: %s", g->uri_text, detail);
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
	struct gmsc_fsm f = fsm_get(g);
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
	struct gmsc_fsm f = fsm_get(g);
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

/* ---------------------------------------------------------------- connection */

static void watch_forget(gf_gms *g, int fd);

static void close_conn(gf_gms *g)
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
static int take_connected(gf_gms *g)
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
			g->generation = c->generation;
			/* A server's word, bounded: a huge value would overflow the deadline below. */
			g->oom_retry_ms = c->oom_retry_ms <= 0 ? 0
					  : c->oom_retry_ms > GF_MAX_DURATION_MS ? GF_MAX_DURATION_MS : c->oom_retry_ms;
		}
	}
	return rc;
}

static void fill_connect(gf_gms *g, int mode, int64_t timeout_ms, bool with_list, bool handles_kept,
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
static int do_connect(gf_gms *g, int mode, int64_t timeout_ms, bool by_progress, int cancel_fd)
{
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	int64_t reply_deadline = deadline == INT64_MAX || by_progress ? INT64_MAX : deadline + GMS_REPLY_GRACE_US;
	/* 0 asks the GMS "only if grantable now": the handshake before it still needs its round trip. */
	int64_t open_deadline = timeout_ms == 0 ? gf_now_us() + GMS_REPLY_GRACE_US : deadline;
	int rc = gf_gms_open_session(g->uri_text, &g->uri, open_deadline, &g->fd, &g->rd, GF_MSG_MAX_FDS);
	if (rc < 0)
		return rc;
	fill_connect(g, mode, timeout_ms, false, false, by_progress);
	rc = cancel_fd >= 0 ? wait_cancelable(g, cancel_fd, reply_deadline) : 0;
	if (rc == 0)
		rc = cancel_fd >= 0 ? request_reply(g, reply_deadline) : request(g, NULL, NULL, reply_deadline);
	if (rc == 0)
		rc = take_connected(g);
	if (rc < 0) {
		/* A lost server during connect is "unreachable", not a loss of a held lock. */
		if (rc == GF_ERR_GMS_LOST)
			rc = gf_err(GF_ERR_UNREACHABLE, "%s", gf_error_detail());
		close_conn(g);
	}
	return rc;
}

static int connect_fenced(gf_gms **out, const char *uri, gf_mem *mem, int mode, int64_t timeout_ms,
			  const struct gf_lock_proof *proof, bool has_proof, bool by_progress, int cancel_fd);

int gf_gms_connect(gf_gms **out, const char *uri, gf_mem *mem, int mode, int64_t timeout_ms)
{
	return gf_gms_connect_epoch(out, uri, mem, mode, timeout_ms, 0);
}

int gf_gms_connect_epoch(gf_gms **out, const char *uri, gf_mem *mem, int mode, int64_t timeout_ms,
			 uint64_t lock_epoch)
{
	struct gf_lock_proof p = { .epoch = lock_epoch };
	return connect_fenced(out, uri, mem, mode, timeout_ms, &p, false, false, -1);
}

int gf_gms_connect_proof(gf_gms **out, const char *uri, gf_mem *mem, int mode, int64_t timeout_ms,
			 const struct gf_lock_proof *proof)
{
	if (proof && proof->epoch == 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_connect_proof: a proof of epoch 0 names no grant");
	struct gf_lock_proof none = { .epoch = 0 };
	return connect_fenced(out, uri, mem, mode, timeout_ms, proof ? proof : &none, proof != NULL, false, -1);
}

int gf_gms_connect_by_progress(gf_gms **out, const char *uri, gf_mem *mem, int mode, int64_t timeout_ms,
			       const struct gf_lock_proof *proof, int cancel_fd)
{
	if (proof && proof->epoch == 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_connect_by_progress: a proof of epoch 0 names no grant");
	struct gf_lock_proof none = { .epoch = 0 };
	return connect_fenced(out, uri, mem, mode, timeout_ms, proof ? proof : &none, proof != NULL, true,
			      cancel_fd);
}

static int connect_fenced(gf_gms **out, const char *uri, gf_mem *mem, int mode, int64_t timeout_ms,
			  const struct gf_lock_proof *proof, bool has_proof, bool by_progress, int cancel_fd)
{
	if (!out || !uri || !mem)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_connect: NULL argument");
	if (mode != GF_GMS_RW && mode != GF_GMS_RO && mode != GF_GMS_RW_OR_RO)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gms_connect: unknown mode %d", mode);
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
	g->lock_epoch = proof->epoch;
	g->has_proof = has_proof;
	if (has_proof)
		memcpy(g->lock_proof, proof->token, GF_LOCK_PROOF_LEN);
	snprintf(g->uri_text, sizeof(g->uri_text), "%s", uri);
	size_t rec;
	int rc = gf_uri_parse(uri, &g->uri);
	if (rc == 0 && g->uri.kind != GF_URI_UNIX)
		rc = gf_err(GF_ERR_INVALID_ARG, "GMS URIs are unix:// (fds cannot cross hosts): %s", uri);
	if (rc == 0)
		rc = gf_mem_granularity(mem, &g->gran, &rec);
	if (rc == 0)
		rc = do_connect(g, mode, timeout_ms, by_progress, cancel_fd);
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
	struct gmsc_fsm f = fsm_get(gms);
	return gmsc_fsm_mode(&f);
}

/* Unmap (fenced mappings included: they hold the allocations too) and release every import.
 * Not while the watcher keeps them asleep, unless under kmu (it may release them too). */
static void release_imports(gf_gms *g)
{
	if (g->va)
		gf_mem_unmap_all(g->va);
	for (size_t i = 0; i < g->nallocs; i++) {
		gf_mem_alloc_free(g->allocs[i].a);
		g->allocs[i].a = NULL;
	}
}

/* ---------------------------------------------------------------- the session watcher */

static bool hung_up(short revents);

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
			gf_log(GF_LOG_INFO, "gms", "asleep: %s closed the kept session; releasing %zu handles",
			       g->uri_text, g->nallocs);
			release_imports(g);
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
static int watch_set_locked(gf_gms *g, int fd)
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
		watch_set_locked(g, -1);
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
static void drop_parked(gf_gms *g)
{
	pthread_mutex_lock(&g->kmu);
	gmsc_fsm_dropped(&g->fsm); /* from here the watcher leaves the handles alone */
	pthread_mutex_unlock(&g->kmu);
	watch_forget(g, g->parked_fd);
	release_imports(g);
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
	release_imports(gms);
	gf_mem_va_free(gms->va);
	gms->va = NULL;
	if (gms->fd >= 0)
		close_conn(gms);
	if (gms->parked_fd >= 0)
		drop_parked(gms);
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

static struct gf_mem_mapping *mapping_list(gf_gms *g)
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
	struct gf_mem_mapping *maps = mapping_list(gms);
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

struct listed {
	struct calloc_entry *allocs;
	size_t n, cap;
	int *fds;
	size_t nfds;
	uint8_t hash[16];
	uint64_t generation;
	size_t total; /* allocations the server announced */
};

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

/* Called by list_all() after each chunk with the index of its first allocation. */
typedef int (*chunk_fn)(gf_gms *g, struct listed *l, size_t first);

static void listed_free(struct listed *l)
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
static int list_all(gf_gms *g, bool with_meta, struct listed *l, chunk_fn on_chunk, bool already_asked)
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
			listed_free(l);
			return io_failed(g, rc);
		}
		if ((rc = gf_msg_error_code(g->msg)) < 0 || g->msg->which_body != gf_Msg_gms_list_chunk_tag) {
			gf_close_fds(fds, nfds);
			free(fds);
			listed_free(l);
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
			listed_free(l);
			return gf_err(GF_ERR_PROTOCOL, "list: chunk with %u allocations%s carries %zu fds",
				      (unsigned)ch->allocations_count, blob ? " and a metadata blob" : "", nfds);
		}
		if (blob) {
			rc = meta_take_blob(g, fds[ch->allocations_count], ch->metadata_blob_size, ch->total_metadata);
			gf_close(fds[ch->allocations_count]);
			if (rc < 0) {
				gf_close_fds(fds, ch->allocations_count);
				free(fds);
				listed_free(l);
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
				listed_free(l);
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
			listed_free(l);
			return rc;
		}
		for (size_t i = 0; with_meta && i < ch->metadata_count; i++) {
			const gf_GmsMetaEntry *e = &ch->metadata[i];
			if ((rc = meta_append(g, e->key, e->allocation_id, e->offset, e->value.bytes, e->value.size)) < 0) {
				listed_free(l);
				return rc;
			}
		}
		if (ch->last) {
			if (l->n != ch->total_allocations) {
				listed_free(l);
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
	if ((rc = list_all(gms, true, &l, NULL, false)) < 0)
		goto fail_meta;
	/* The grant that made this client a reader named the layout the list must be. */
	if (memcmp(l.hash, gms->grant.hash, 16)) {
		listed_free(&l);
		rc = gf_err(GF_ERR_PROTOCOL, "list: layout hash differs from the one granted");
		goto fail_meta;
	}
	uint64_t off = 0;
	for (size_t i = 0; i < l.n; i++) {
		l.allocs[i].offset = off;
		off = round_up(off + l.allocs[i].size, gms->gran);
	}
	if (!gms->va && (rc = gf_mem_reserve(&gms->va, gms->mem, off ? off : gms->gran, 0)) < 0) {
		listed_free(&l);
		goto fail_meta;
	}
	if (off > gf_mem_va_size(gms->va)) {
		listed_free(&l);
		rc = gf_err(GF_ERR_STATE, "layout of %llu bytes exceeds the reservation", (unsigned long long)off);
		goto fail_meta;
	}
	if ((rc = import_and_map(gms, &l)) < 0) {
		listed_free(&l);
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
	struct gmsc_fsm f = fsm_get(gms);
	if (!f.have_layout)
		return gf_err(GF_ERR_STATE, "no committed layout known to this client yet");
	memcpy(hash, f.hash, 16);
	if (generation)
		*generation = gms->generation;
	return 0;
}

/* ---------------------------------------------------------------- sleep / wake */

/*
 * Sleep on the kept session: a reader gives the RO lock back
 * (GmsDisconnect) but keeps the session, so its wake needs no connect,
 * handshake or second request. 0 when parked; < 0 when that failed and the
 * connection is closed (the wake then connects afresh). No loss is reported
 * here (the engine is going to sleep, not losing its GMS).
 */
static int park_conn(gf_gms *g)
{
	int64_t deadline = gf_now_us() + GMS_IO_TIMEOUT_US;
	memset(g->msg, 0, sizeof(*g->msg));
	g->msg->which_body = gf_Msg_gms_disconnect_tag;
	g->msg->seq = ++g->seq;
	int rc = gf_msg_send(g->fd, g->msg, NULL, 0, deadline);
	if (rc == 0)
		rc = gf_msg_recv(&g->rd, g->fd, g->msg, NULL, NULL, deadline);
	if (rc == 0 && g->msg->which_body != gf_Msg_ok_tag)
		rc = gf_err(GF_ERR_PROTOCOL, "sleep: expected ok, got %s", gf_msg_name(g->msg));
	if (rc < 0) {
		close_conn(g);
		return rc;
	}
	g->parked_fd = g->fd;
	g->parked_rd = g->rd;
	g->fd = -1;
	gf_frame_reader_init(&g->rd, GF_MSG_MAX_FDS);
	return 0;
}

/* Send the wake's GmsConnect(RO, with the list) on the kept session: WAKING. */
static int send_wake(gf_gms *g, int64_t timeout_ms)
{
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	g->wake_reply_deadline = deadline == INT64_MAX ? INT64_MAX : deadline + GMS_REPLY_GRACE_US;
	/* From here the wake owns the kept handles; the watcher no longer touches them. */
	pthread_mutex_lock(&g->kmu);
	gmsc_fsm_wake_sent(&g->fsm);
	bool handles_kept = g->fsm.kept >= GMSC_KEPT_HANDLES;
	pthread_mutex_unlock(&g->kmu);
	fill_connect(g, GF_GMS_RO, timeout_ms, true, handles_kept, false);
	g->msg->seq = ++g->seq;
	return gf_msg_send(g->parked_fd, g->msg, NULL, 0, g->wake_reply_deadline);
}

/* Everything of a failed wake goes; the layout stays known, so the call can be retried. */
static void wake_failed(gf_gms *g)
{
	release_imports(g);
	close_conn(g);
	pthread_mutex_lock(&g->kmu);
	gmsc_fsm_dropped(&g->fsm);
	pthread_mutex_unlock(&g->kmu);
}

/*
 * Read the wake's grant on the kept session (WAKING). 0 with the grant in
 * @g->grant, 1 when the session is gone (connect afresh), < 0 when the
 * server refused (e.g. the timeout passed).
 */
static int read_wake(gf_gms *g)
{
	gf_frame_reader_clear(&g->rd);
	g->fd = g->parked_fd;
	g->rd = g->parked_rd;
	g->parked_fd = -1;
	int rc = gf_msg_recv(&g->rd, g->fd, g->msg, NULL, NULL, g->wake_reply_deadline);
	if (rc < 0) {
		gf_log(GF_LOG_DEBUG, "gms", "wake: kept session to %s is gone (%s); connecting again", g->uri_text,
		       gf_error_detail());
		wake_failed(g); /* kept handles included: nobody vouches for them now */
		return 1;
	}
	g->round_trips++;
	if ((rc = gf_msg_error_code(g->msg)) < 0 || (rc = take_connected(g)) < 0) {
		wake_failed(g);
		return rc;
	}
	return 0;
}

/* Wait, remap, serve: a GMS that crashed may be restarting (and restoring
 * the layout from a snapshot), so an absent socket is retried until the
 * deadline instead of failing the wake at once. */
static int connect_for_wake(gf_gms *g, int64_t timeout_ms)
{
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	for (;;) {
		int64_t left = (deadline - gf_now_us()) / 1000;
		int rc = do_connect(g, GF_GMS_RO, left > 0 ? left : 0, false, -1);
		if (rc != GF_ERR_UNREACHABLE || gf_now_us() + 50000 > deadline)
			return rc;
		usleep(50000);
	}
}

static void populate_all(gf_gms *g)
{
	for (size_t i = 0; i < g->nallocs; i++)
		gf_mem_populate(gf_mem_va_addr(g->va) + g->allocs[i].offset, g->allocs[i].size, false);
}

int gf_gms_prefault(gf_gms *gms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	struct gmsc_fsm f = fsm_get(gms);
	if (!gmsc_fsm_mapped(&f) || !gms->va)
		return gf_err(GF_ERR_STATE, "prefault: nothing mapped");
	/* Device memory takes no page faults; host mappings fault per 64 KiB on
	 * first touch, unless the wake opened them in place (page tables kept). */
	if (gf_mem_kind(gms->mem) != GF_MEM_HOST || f.in_place)
		return 0;
	populate_all(gms);
	return 0;
}

/* The wake's grant said the kept, unmapped handles are this layout's: map them at their offsets. */
static int map_kept(gf_gms *g)
{
	struct gf_mem_mapping *maps = mapping_list(g);
	if (!maps)
		return gf_err(GF_ERR_NOMEM, "remap: out of memory");
	int rc = g->nallocs ? gf_mem_map_many(g->va, maps, g->nallocs, GF_MEM_READ) : 0;
	free(maps);
	return rc;
}

int gf_gms_remap_begin(gf_gms *gms, int64_t timeout_ms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	if (timeout_ms < 0)
		return gf_err(GF_ERR_INVALID_ARG, "remap needs a finite timeout (Decision 6)");
	struct gmsc_fsm f = fsm_get(gms);
	switch (gmsc_fsm_wake_path(&f)) {
	case GMSC_WAKE_NOT_ASLEEP:
		return gf_err(GF_ERR_STATE, "remap_begin: still connected (call gf_gms_unmap() first)");
	case GMSC_WAKE_NO_LAYOUT:
		return gf_err(GF_ERR_STATE, "remap_begin: no committed layout was mapped before");
	case GMSC_WAKE_SEND:
		break;
	default:
		return 0; /* nothing to send ahead: sent already, or gf_gms_remap() connects */
	}
	if (send_wake(gms, timeout_ms) < 0) {
		gf_log(GF_LOG_DEBUG, "gms", "wake: kept session to %s is gone (%s); the remap connects again",
		       gms->uri_text, gf_error_detail());
		drop_parked(gms);
	}
	return 0;
}

int gf_gms_remap_cancel(gf_gms *gms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	struct gmsc_fsm f = fsm_get(gms);
	if (gmsc_fsm_wake_path(&f) != GMSC_WAKE_READ)
		return 0;
	gf_log(GF_LOG_INFO, "gms", "wake: request to %s taken back; the next wake connects afresh", gms->uri_text);
	drop_parked(gms);
	return 0;
}

int gf_gms_unmap(gf_gms *gms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	struct gmsc_fsm f = fsm_get(gms);
	if (!gmsc_fsm_mode(&f))
		return gf_err(GF_ERR_STATE, "already unmapped");
	/* No hook from here on, and no hangup changes the FSM; loss watching resumes after the wake. */
	bool watch = f.watch;
	gf_gms_stop_watch(gms);
	f = fsm_get(gms);
	/* Kernels still running on the weights must finish before the mappings go. */
	int rc = gf_mem_synchronize(gms->mem);
	char why[512] = "";
	if (rc < 0)
		snprintf(why, sizeof(why), "%s", gf_error_detail()); /* the fence must not hide it */
	/* Kept handles stay mapped, fenced, where the backend can (host): as
	 * unreadable as unmapped, and the wake is one mprotect, without faults:
	 * the page tables are filled now, while nobody waits, not at the wake. */
	enum gmsc_kept kept = gmsc_fsm_sleep_plan(&f, gms->keep_handles, gf_mem_kind(gms->mem) == GF_MEM_HOST);
	if (kept == GMSC_KEPT_MAPPED) {
		populate_all(gms);
		if (gf_mem_set_accessible(gms->va, 0) < 0)
			kept = GMSC_KEPT_HANDLES;
	}
	if (kept == GMSC_KEPT_HANDLES)
		gf_mem_unmap_all(gms->va);
	else if (kept < GMSC_KEPT_HANDLES)
		release_imports(gms);
	if (kept == GMSC_KEPT_NOTHING)
		close_conn(gms);
	else if (park_conn(gms) < 0) {
		release_imports(gms);
		kept = GMSC_KEPT_NOTHING;
	}
	pthread_mutex_lock(&gms->kmu);
	gmsc_fsm_slept(&gms->fsm, kept);
	gms->fsm.watch = watch;
	/* Kept handles go to the watcher's care: it releases them when the GMS closes the session. */
	if (kept >= GMSC_KEPT_HANDLES && watch_set_locked(gms, gms->parked_fd) < 0) {
		gf_log(GF_LOG_WARN, "gms", "sleep: handles released: %s", gf_error_detail());
		release_imports(gms);
		gmsc_fsm_released(&gms->fsm);
	}
	bool have_layout = gms->fsm.have_layout;
	pthread_mutex_unlock(&gms->kmu);
	if (!have_layout) {
		/* A writer that sleeps before commit aborted its layout: nothing to come back to. */
		gms->nallocs = 0;
		gms->va_used = 0;
	}
	return rc < 0 ? gf_err(rc, "%s", why) : rc;
}

/*
 * remap: import and map each chunk's allocations at their old offsets as the
 * chunk arrives, so the mmaps overlap the server's sending of the next one.
 * Whether the list is this client's layout is the FSM's question, asked on
 * the first chunk (its hash and count); the rest are checks of the server's
 * word against itself.
 */
static int remap_chunk(gf_gms *g, struct listed *l, size_t first)
{
	if (first == 0 && !gmsc_fsm_same_layout(&g->fsm, l->hash, l->total))
		return gf_err(GF_ERR_STALE_LAYOUT, "remap: the GMS lists a different set of allocations");
	if (l->n > g->nallocs)
		return gf_err(GF_ERR_PROTOCOL, "remap: the GMS lists more allocations than it announced");
	/* One gf_mem_map_many() per chunk (at most GF_LIMIT_CHUNK_ALLOCS). */
	struct gf_mem_mapping maps[GF_LIMIT_CHUNK_ALLOCS];
	size_t k = 0;
	for (size_t i = first; i < l->n; i++) {
		if (k == sizeof(maps) / sizeof(maps[0])) {
			int rc = gf_mem_map_many(g->va, maps, k, GF_MEM_READ);
			if (rc < 0)
				return rc;
			k = 0;
		}
		if (l->allocs[i].size != g->allocs[i].size)
			return gf_err(GF_ERR_PROTOCOL, "remap: allocation %zu differs in size from the layout listed", i);
		/* The received fd becomes the handle (no dup, no close). */
		int rc = gf_mem_import_adopt(&g->allocs[i].a, g->mem, l->fds[i], l->allocs[i].size);
		l->fds[i] = -1;
		if (rc < 0)
			return rc;
		maps[k++] = (struct gf_mem_mapping){g->allocs[i].offset, g->allocs[i].a};
	}
	return k ? gf_mem_map_many(g->va, maps, k, GF_MEM_READ) : 0;
}

/* The list path of a wake: receive the layout's handles (asked for with the grant, or now) and map them. */
static int remap_list(gf_gms *g, bool already_asked)
{
	struct listed l;
	int rc = list_all(g, false, &l, remap_chunk, already_asked);
	if (rc == 0 && !gmsc_fsm_same_layout(&g->fsm, l.hash, l.n))
		rc = gf_err(GF_ERR_STALE_LAYOUT, "remap: the GMS lists a different set of allocations");
	if (rc < 0) {
		listed_free(&l); /* list_all() left it empty or whole */
		return rc;
	}
	for (size_t i = 0; i < l.n; i++)
		g->allocs[i].id = l.allocs[i].id; /* same structure, ids may be renumbered */
	free(l.fds);
	free(l.allocs);
	g->generation = l.generation;
	return 0;
}

int gf_gms_remap(gf_gms *gms, int64_t timeout_ms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	if (timeout_ms < 0)
		return gf_err(GF_ERR_INVALID_ARG, "remap needs a finite timeout (Decision 6)");
	struct gmsc_fsm f = fsm_get(gms);
	enum gmsc_wake w = gmsc_fsm_wake_path(&f);
	if (w == GMSC_WAKE_NOT_ASLEEP)
		return gf_err(GF_ERR_STATE, "remap: still connected (call gf_gms_unmap() first)");
	if (w == GMSC_WAKE_NO_LAYOUT)
		return gf_err(GF_ERR_STATE, "remap: no committed layout was mapped before");
	int rc;
	/* The first step: over the kept session (its request sent now, or by remap_begin), or a fresh connect. */
	if (w == GMSC_WAKE_SEND) {
		if (send_wake(gms, timeout_ms) < 0) {
			gf_log(GF_LOG_DEBUG, "gms", "wake: kept session to %s is gone (%s); connecting again",
			       gms->uri_text, gf_error_detail());
			drop_parked(gms);
			w = GMSC_WAKE_CONNECT;
		} else {
			w = GMSC_WAKE_READ;
		}
	}
	if (w == GMSC_WAKE_READ && (rc = read_wake(gms)) != 0) {
		if (rc < 0)
			return rc;
		w = GMSC_WAKE_CONNECT;
	}
	if (w == GMSC_WAKE_CONNECT && (rc = connect_for_wake(gms, timeout_ms)) < 0)
		return rc;
	/* The second step: the grant says where the wake goes. */
	const struct grant *gr = &gms->grant;
	pthread_mutex_lock(&gms->kmu);
	enum gmsc_kept kept = gms->fsm.kept;
	enum gmsc_path p = gmsc_fsm_woke(&gms->fsm, gr->mode, gr->has_hash ? gr->hash : NULL, gr->handles_valid);
	pthread_mutex_unlock(&gms->kmu);
	char want[33], got[33] = "none";
	switch (p) {
	case GMSC_PATH_OPEN_IN_PLACE:
		rc = gf_mem_set_accessible(gms->va, 1);
		break;
	case GMSC_PATH_MAP_KEPT:
		rc = map_kept(gms);
		break;
	case GMSC_PATH_LIST:
		release_imports(gms); /* kept ones are stale: the list brings the layout's own */
		rc = remap_list(gms, w == GMSC_WAKE_READ);
		break;
	case GMSC_PATH_STALE:
		gf_hex(f.hash, 16, want);
		gf_hex(gr->hash, 16, got);
		rc = gf_err(GF_ERR_STALE_LAYOUT, "%s holds layout %s, this engine mapped %s", gms->uri_text, got,
			    want);
		break;
	default:
		gf_hex(f.hash, 16, want);
		if (gr->has_hash)
			gf_hex(gr->hash, 16, got);
		rc = gf_err(GF_ERR_PROTOCOL, "wake: %s granted %s on layout %s%s; this client kept %s of layout %s",
			    gms->uri_text, gf_gms_mode_name(gr->mode), got,
			    gr->handles_valid ? " declaring kept handles valid" : "", gmsc_kept_name(kept), want);
		break;
	}
	if (rc < 0) {
		wake_failed(gms); /* all-or-nothing: what was mapped goes */
		return rc;
	}
	if (f.watch && (rc = gf_gms_start_watch(gms)) < 0)
		gf_log(GF_LOG_WARN, "gms", "remap: watcher not restarted: %s", gf_error_detail());
	return 0;
}

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
	struct gmsc_fsm f = fsm_get(gms);
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
	int rc = gmsc_fsm_mode(&gms->fsm) ? watch_set_locked(gms, gms->fd) : 0;
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

/* ---------------------------------------------------------------- groups */

int gf_gms_connect_group(gf_gms **out_array, size_t n, const char *const *uris, gf_mem *const *mems, int role,
			 int64_t timeout_ms)
{
	if (!out_array || !uris || !mems || n == 0)
		return gf_err(GF_ERR_INVALID_ARG, "connect_group: NULL or empty argument");
	int mode;
	if (role == GF_GMS_ROLE_LOADER)
		mode = GF_GMS_RW_OR_RO;
	else if (role == GF_GMS_ROLE_FOLLOWER)
		mode = GF_GMS_RO;
	else
		return gf_err(GF_ERR_INVALID_ARG, "connect_group: unknown role %d", role);
	gf_gms **tmp = calloc(n, sizeof(*tmp));
	if (!tmp)
		return gf_err(GF_ERR_NOMEM, "connect_group: out of memory");
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	int rc = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		int64_t left = -1;
		if (deadline != INT64_MAX) {
			left = (deadline - gf_now_us()) / 1000;
			if (left < 0)
				left = 0;
		}
		rc = gf_gms_connect(&tmp[i], uris[i], mems[i], mode, left);
	}
	if (rc < 0) {
		for (size_t i = 0; i < n; i++)
			gf_gms_free(tmp[i]);
		free(tmp);
		return rc;
	}
	memcpy(out_array, tmp, n * sizeof(*tmp));
	free(tmp);
	return 0;
}
