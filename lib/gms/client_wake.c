/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GMS client's sleep and wake, the I/O: unmap (keeping what the FSM
 * says a sleep keeps), park the session, send the wake's request and read
 * its grant, then map kept handles in place or list and map afresh. Every
 * decision is client_fsm.c's.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_int.h"
#include "client_session.h"
#include "metablob.h"
#include "xfer.h"

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
		gms_client_close_conn(g);
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
	gms_client_fill_connect(g, GF_GMS_RO, timeout_ms, true, handles_kept, false);
	g->msg->seq = ++g->seq;
	return gf_msg_send(g->parked_fd, g->msg, NULL, 0, g->wake_reply_deadline);
}

/* Everything of a failed wake goes; the layout stays known, so the call can be retried. */
static void wake_failed(gf_gms *g)
{
	gms_client_release_imports(g);
	gms_client_close_conn(g);
	pthread_mutex_lock(&g->kmu);
	gmsc_fsm_dropped(&g->fsm);
	pthread_mutex_unlock(&g->kmu);
}

/*
 * How long a wake waits for the GMS's answer awake before it sleeps in
 * the read. The answer is usually due within tens of microseconds (asked
 * for when the lock server said this engine was next); a thread asleep
 * when it comes takes as long again to run, longer on a busy machine.
 * Awake, the thread yields its CPU each time round, which is what lets the
 * GMS answer on a machine with no CPU free.
 */
#define WAKE_ANSWER_SPIN_US 200

/* Until @fd is readable (or hung up) or WAKE_ANSWER_SPIN_US passed: the read that follows may still wait. */
static void await_answer_awake(int fd)
{
	int64_t until = gf_now_us() + WAKE_ANSWER_SPIN_US;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	while (poll(&p, 1, 0) == 0 && gf_now_us() < until)
		sched_yield();
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
	gf_frame_reader_init(&g->parked_rd, 0); /* its buffers are g->rd's now */
	/* Usually there already (asked for before the grant): read, and wait
	 * only when it is not. */
	int rc = gf_msg_try_recv(&g->rd, g->fd, g->msg, NULL, NULL);
	if (rc == GF_ERR_AGAIN) {
		await_answer_awake(g->fd);
		rc = gf_msg_recv(&g->rd, g->fd, g->msg, NULL, NULL, g->wake_reply_deadline);
	}
	if (rc < 0) {
		gf_log(GF_LOG_DEBUG, "gms", "event=kept_session_gone phase=wake gms=%s detail=\"%s\" next=connect",
		       g->uri_text,
		       gf_error_detail());
		wake_failed(g); /* kept handles included: nobody vouches for them now */
		return 1;
	}
	g->round_trips++;
	if ((rc = gf_msg_error_code(g->msg)) < 0 || (rc = gms_client_take_connected(g)) < 0) {
		wake_failed(g);
		return rc;
	}
	return 0;
}

/* Wait, remap, serve: a GMS that crashed may be restarting (and restoring
 * the layout from a snapshot), so an absent socket is retried until the
 * deadline instead of failing the wake at once. A GMS that said it keeps
 * no tier to restore from cannot come back with the weights: the wake
 * fails at once, and the engine hands the lock on (decision 6). */
static int connect_for_wake(gf_gms *g, int64_t timeout_ms)
{
	int64_t deadline = gf_deadline_from_ms(timeout_ms);
	for (;;) {
		int64_t left = (deadline - gf_now_us()) / 1000;
		int rc = gms_client_do_connect(g, GF_GMS_RO, left > 0 ? left : 0, false, -1);
		if (rc == GF_ERR_UNREACHABLE && g->no_restore)
			return gf_err(GF_ERR_GMS_LOST,
				      "wake: %s is gone and keeps no residency tier to restore the weights from (%s)",
				      g->uri_text, gf_error_detail());
		if (rc != GF_ERR_UNREACHABLE || gf_now_us() + 50000 > deadline)
			return rc;
		usleep(50000);
	}
}

/* Fill the page tables of every mapping, where the backend's mappings have page tables to fill. */
static void populate_all(gf_gms *g)
{
	if (!(gf_mem_caps(g->mem) & GF_MEM_CAP_HOST_PAGES))
		return;
	for (size_t i = 0; i < g->nallocs; i++)
		gf_mem_populate(gf_mem_va_addr(g->va) + g->allocs[i].offset, g->allocs[i].size, false);
}

int gf_gms_prefault(gf_gms *gms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	struct gmsc_fsm f = gms_client_fsm_get(gms);
	if (!gmsc_fsm_mapped(&f) || !gms->va)
		return gf_err(GF_ERR_STATE, "prefault: nothing mapped");
	/* Host pages fault per 64 KiB on first touch, unless the wake opened the
	 * mappings in place (page tables kept); device memory takes no faults. */
	if (f.in_place)
		return 0;
	populate_all(gms);
	return 0;
}

/* The wake's grant said the kept, unmapped handles are this layout's: map them at their offsets. */
static int map_kept(gf_gms *g)
{
	struct gf_mem_mapping *maps = gms_client_mapping_list(g);
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
	struct gmsc_fsm f = gms_client_fsm_get(gms);
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
		gf_log(GF_LOG_DEBUG, "gms", "event=kept_session_gone phase=wake gms=%s detail=\"%s\" next=remap",
		       gms->uri_text, gf_error_detail());
		gms_client_drop_parked(gms);
	}
	return 0;
}

int gf_gms_remap_cancel(gf_gms *gms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	struct gmsc_fsm f = gms_client_fsm_get(gms);
	if (gmsc_fsm_wake_path(&f) != GMSC_WAKE_READ)
		return 0;
	gf_log(GF_LOG_INFO, "gms", "event=wake_request_withdrawn gms=%s next=connect", gms->uri_text);
	gms_client_drop_parked(gms);
	return 0;
}

int gf_gms_unmap(gf_gms *gms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "gms is NULL");
	struct gmsc_fsm f = gms_client_fsm_get(gms);
	if (!gmsc_fsm_mode(&f))
		return gf_err(GF_ERR_STATE, "already unmapped");
	/* No hook from here on, and no hangup changes the FSM; loss watching resumes after the wake. */
	bool watch = f.watch;
	gf_gms_stop_watch(gms);
	f = gms_client_fsm_get(gms);
	/* Kernels still running on the weights must finish before the mappings go. */
	int rc = gf_mem_synchronize(gms->mem);
	char why[512] = "";
	if (rc < 0)
		snprintf(why, sizeof(why), "%s", gf_error_detail()); /* the fence must not hide it */
	/* Kept handles stay mapped, fenced, where the backend can: as
	 * unreadable as unmapped, and the wake is one mprotect, without faults:
	 * the page tables are filled now, while nobody waits, not at the wake. */
	enum gmsc_kept kept = gmsc_fsm_sleep_plan(&f, gms->keep_handles, gf_mem_caps(gms->mem) & GF_MEM_CAP_FENCE);
	if (kept == GMSC_KEPT_MAPPED) {
		populate_all(gms);
		if (gf_mem_set_accessible(gms->va, 0) < 0)
			kept = GMSC_KEPT_HANDLES;
	}
	if (kept == GMSC_KEPT_HANDLES)
		gf_mem_unmap_all(gms->va);
	else if (kept < GMSC_KEPT_HANDLES)
		gms_client_release_imports(gms);
	if (kept == GMSC_KEPT_NOTHING)
		gms_client_close_conn(gms);
	else if (park_conn(gms) < 0) {
		gms_client_release_imports(gms);
		kept = GMSC_KEPT_NOTHING;
	}
	pthread_mutex_lock(&gms->kmu);
	gmsc_fsm_slept(&gms->fsm, kept);
	gms->fsm.watch = watch;
	/* Kept handles go to the watcher's care: it releases them when the GMS closes the session. */
	if (kept >= GMSC_KEPT_HANDLES && gms_client_watch_set_locked(gms, gms->parked_fd) < 0) {
		gf_log(GF_LOG_WARN, "gms", "event=kept_handles_released phase=sleep detail=\"%s\"", gf_error_detail());
		gms_client_release_imports(gms);
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
	int rc = gms_client_list_all(g, false, &l, remap_chunk, already_asked);
	if (rc == 0 && !gmsc_fsm_same_layout(&g->fsm, l.hash, l.n))
		rc = gf_err(GF_ERR_STALE_LAYOUT, "remap: the GMS lists a different set of allocations");
	if (rc < 0) {
		gms_client_listed_free(&l); /* list_all() left it empty or whole */
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
	struct gmsc_fsm f = gms_client_fsm_get(gms);
	enum gmsc_wake w = gmsc_fsm_wake_path(&f);
	if (w == GMSC_WAKE_NOT_ASLEEP)
		return gf_err(GF_ERR_STATE, "remap: still connected (call gf_gms_unmap() first)");
	if (w == GMSC_WAKE_NO_LAYOUT)
		return gf_err(GF_ERR_STATE, "remap: no committed layout was mapped before");
	int rc;
	/* The first step: over the kept session (its request sent now, or by remap_begin), or a fresh connect. */
	if (w == GMSC_WAKE_SEND) {
		if (send_wake(gms, timeout_ms) < 0) {
			gf_log(GF_LOG_DEBUG, "gms", "event=kept_session_gone phase=wake gms=%s detail=\"%s\" next=connect",
			       gms->uri_text, gf_error_detail());
			gms_client_drop_parked(gms);
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
		gms_client_release_imports(gms); /* kept ones are stale: the list brings the layout's own */
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
		gf_log(GF_LOG_WARN, "gms", "event=remap_watcher_not_restarted detail=\"%s\"", gf_error_detail());
	return 0;
}
