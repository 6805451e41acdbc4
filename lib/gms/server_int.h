/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GMS server's own state, shared by its files: server.c (requests, the
 * lock FSM's waiters, the weight fence's asks, allocations, metadata,
 * commit, lists, timers) over server_status.c (status and metrics) and
 * server_tiers.c (what the residency tiers ask of it, and the tier
 * requests), all over server_core.c (events, the metadata index, the
 * layout's drop, replies).
 */
#ifndef GF_GMS_SERVER_INT_H
#define GF_GMS_SERVER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fence.h"
#include "fsm.h"
#include "kvpool.h"
#include "mem_int.h"
#include "pins.h"
#include "residency.h"
#include "server.h"

#define GMSD_EVENTS GF_LIMIT_EVENTS /* the ring of recent events */
#define GMSD_OOM_RETRY_US 50000
#define FENCE_QUERY_MS 2000 /* the lock server's answer to the fence, off the loop */
#define GMSD_MAX_ALLOCS 65536
#define GMSD_MAX_META 1000000
#define GMSD_CHUNK_ALLOCS GF_LIMIT_CHUNK_ALLOCS
#define GMSD_CHUNK_META GF_LIMIT_CHUNK_META

enum cphase {
	C_IDLE = 0,   /* no lock (the core did the handshake) */
	C_WAIT,       /* GmsConnect waiting in the server */
	C_WRITER,     /* holds RW */
	C_ALLOC_WAIT, /* holds RW, an allocation is being retried after OUT_OF_MEMORY */
	C_READER,     /* holds RO */
};

/* Per connection (the core's peer data). */
struct client {
	struct gf_srv_peer *p;
	enum cphase phase;
	int mode;               /* requested mode while waiting */
	uint32_t seq;           /* seq of the request being waited on */
	int64_t deadline_us;    /* wait deadline (INT64_MAX: none); by_progress: see wait_deadline() */
	/* The timeout counts only while no writer makes progress (GmsConnect.by_progress). */
	bool by_progress;
	int64_t wait_since_us, wait_timeout_us;
	uint64_t order;         /* FIFO position among waiters */
	const char *peer;       /* the core's sanitised peer id */
	uint32_t pid;
	/* a pending allocation (C_ALLOC_WAIT) */
	uint64_t alloc_size;
	char alloc_tag[GF_LIMIT_TAG];
	int64_t alloc_until_us, alloc_next_us;
	unsigned alloc_tries;
	uint64_t lock_epoch;    /* the lock grant its connect carried (0: none) */
	struct gf_lock_proof lock_proof; /* and that grant's fence proof (epoch 0: none) */
	/* The weight fence (fence.h) and its query of the lock server, off the loop (fence_ask()). */
	enum gms_fence fence;
	gf_lock_query *fence_q;
	struct gf_srv_watch fence_w;
	uint32_t commit_seq;    /* the commit waiting for the fence's answer */
	/* a GmsSnapshot or GmsDemote request its tiers answer later (0: none) */
	enum tiers_residency_wait tier_wait;
	uint32_t tier_seq;
	/* a list reply being streamed (the layout cannot change meanwhile: this client holds a lock) */
	bool listing, list_fds, list_meta, list_blob;
	size_t list_next, list_chunks;
	bool connect_list; /* the pending GmsConnect asked for the list with the grant */
	/* Asleep: a reader that gave the RO lock back (GmsDisconnect) keeps its
	 * session and its imported handles. They pin the layout's memory, so a
	 * drop closes such sessions (the client then lets go of its handles). */
	bool parked;
	bool handles_kept;  /* the pending GmsConnect of a wake says it kept them */
	uint64_t parked_drops; /* d->drops when it parked: its handles are of that layout */
	uint8_t parked_hash[16];
	/* a successful GmsDemote whose answer waits (up to GMS_PINS_SETTLE_US)
	 * for the sleepers it released to let go, so the answer's figures are true */
	bool settling;
	int64_t settle_until_us;
	/* A GmsKvMap whose grant the lock server is being asked about (server_kv.c). */
	bool kv_asking;
	uint32_t kv_seq;
	gf_GmsKvMap kv_req;
	gf_lock_query *kv_q;
	struct gf_srv_watch kv_w;
};

struct galloc {
	uint64_t id;
	gf_mem_alloc *a;
	uint64_t size, requested;
	char tag[GF_LIMIT_TAG];
};

struct gmeta {
	char *key;
	uint64_t alloc_id;
	uint64_t offset;
	uint8_t *value;
	size_t value_len;
};

struct gevent {
	int64_t at_us;
	char what[GF_LIMIT_EVENT_TEXT];
};

struct gf_gmsd {
	struct gf_srv *srv;
	char listen_text[256];
	bool started;
	int device, kind;
	int64_t oom_retry_ms;

	gf_mem *mem;
	char uuid[GF_LIMIT_UUID];
	size_t granularity;
	int64_t started_us;

	bool changed;           /* the lock state changed: settle re-evaluates the waiters */
	uint64_t next_order;
	struct gms_fsm fsm;
	/* The writer's progress, by which waiters by_progress are judged:
	 * wmark_us is its last progress (grant, allocation, metadata entry,
	 * GmsProgress) while one holds RW, else when the last one left. */
	int64_t wmark_us, wmark_wall_us;
	int64_t w_granted_wall_us;
	uint64_t w_done, w_total;
	uint32_t w_reports;

	struct galloc *allocs;
	size_t nallocs, allocs_cap;
	uint64_t next_alloc_id;
	uint64_t alloc_bytes;

	struct gmeta *meta;
	size_t nmeta, meta_cap;
	uint32_t *index;        /* open addressing: meta position + 1, 0 empty */
	size_t index_cap;

	uint64_t generation;
	uint8_t hash[16];
	/* The committed metadata as one sealed memfd for readers (metablob.h),
	 * made once per layout: -1 until then, closed when the layout drops. */
	int mblob_fd;
	uint64_t mblob_size;
	uint8_t mblob_hash[16];
	uint64_t drops; /* layouts dropped since start: kept handles of an earlier one are stale */

	struct gevent events[GMSD_EVENTS];
	size_t ev_next, ev_count;

	gf_Msg *out;
	uint8_t *lc_buf; /* one encoded list chunk (GF_FRAME_MAX_BODY bytes) */

	/* The lock the committed layout is fenced by (gf_gmsd_set_lock). */
	char *lock_uri;
	void *lock_secret;
	size_t lock_secret_len;
	uint64_t fence_refusals;
	/* residency tiers (lib/tiers/residency.h, docs/tiers.md) */
	struct tiers_residency *res;
	struct gf_srv_watch tier_watch;
	/* dropped layouts still held by released sleepers (pins.h) */
	struct gms_pins pins;
	/* The KV pool (server_kv.c): created at the first map, kept until the GMS ends. */
	struct {
		gf_mem_alloc *a;
		uint64_t requested;
		struct client *mapper; /* the connection whose map is current (NULL: none alive) */
		struct gms_kv_dir dir;
		enum gms_kv_start start;
		uint64_t maps, refusals;
	} kv;
};

/* server_core.c: the event ring, the writer's progress, the metadata index, the layout's drop, replies. */
void gmsd_event(gf_gmsd *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gmsd_writer_progress(gf_gmsd *d);
void gmsd_writer_granted(gf_gmsd *d);
uint64_t gmsd_key_hash(const char *k);
void gmsd_index_fill(gf_gmsd *d);
int gmsd_index_rebuild(gf_gmsd *d, size_t cap);
struct gmeta *gmsd_meta_find(gf_gmsd *d, const char *key);
struct galloc *gmsd_alloc_find(gf_gmsd *d, uint64_t id);
/* Whether the holders of a dropped layout are seen exactly (allocations are files). */
bool gmsd_pins_exact(const gf_gmsd *d);
/* The pin watcher's event hook (struct gms_pins.event). */
void gmsd_pins_event(void *ctx, const char *text);
/* Free the layout; @reason names the drop in the pins it leaves (NULL at exit). */
void gmsd_drop_layout(gf_gmsd *d, const char *reason);
struct client *gmsd_writer_client(gf_gmsd *d);
/* The connections in order (NULL: the first). */
struct client *gmsd_next_client(gf_gmsd *d, struct client *prev);
void gmsd_client_close(gf_gmsd *d, struct client *c, const char *why);
int gmsd_send_msg(gf_gmsd *d, struct client *c, const int *fds, size_t nfds);
int gmsd_reply_error(gf_gmsd *d, struct client *c, uint32_t seq, int code, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

/* server_status.c */
void gmsd_handle_status(gf_gmsd *d, struct client *c, const gf_Msg *m);

/* server_kv.c: the KV pool's requests, a connection's end, status. */
void gmsd_handle_kv_map(gf_gmsd *d, struct client *c, const gf_Msg *m);
void gmsd_handle_kv_publish(gf_gmsd *d, struct client *c, const gf_Msg *m);
void gmsd_handle_kv_dir(gf_gmsd *d, struct client *c, const gf_Msg *m);
void gmsd_kv_closed(gf_gmsd *d, struct client *c);
void gmsd_kv_fill_status(gf_gmsd *d, gf_GmsStatus *s);
void gmsd_kv_free(gf_gmsd *d);

/* server_tiers.c: what the residency tiers call, and the tier requests. */
extern const struct tiers_residency_host gmsd_residency_host;
void gmsd_handle_snapshot(gf_gmsd *d, struct client *c, const gf_Msg *m);
void gmsd_handle_restore(gf_gmsd *d, struct client *c, const gf_Msg *m);
void gmsd_handle_demote(gf_gmsd *d, struct client *c, const gf_Msg *m);

#endif
