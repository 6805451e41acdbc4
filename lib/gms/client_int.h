/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GMS client's own state, shared by its files: client.c (connect, the
 * session watcher, the writer's calls, the reader's list and map) and
 * client_wake.c (sleep and wake: unmap, park, the wake's request and its
 * paths). Where the client stands is client_fsm.c's.
 */
#ifndef GF_GMS_CLIENT_INT_H
#define GF_GMS_CLIENT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpufailover/gms.h"
#include "gpufailover/lock.h"
#include "mem_int.h"
#include "client_fsm.h"
#include "wire.h"

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
	/* The server said at a connect that it keeps no tier to restore from:
	 * once it is gone, a wake cannot get these weights back (decision 6). */
	bool no_restore;
	uint64_t lock_epoch;        /* sent with every connect: the fence of a GMS tied to a lock */
	bool has_proof;             /* and the fence proof of that grant */
	uint8_t lock_proof[GF_LOCK_PROOF_LEN];

	uint64_t round_trips;
	int64_t progress_sent_us; /* the last GmsProgress sent (0: none) */
};

/* A list reply as it is read. */
struct listed {
	struct calloc_entry *allocs;
	size_t n, cap;
	int *fds;
	size_t nfds;
	uint8_t hash[16];
	uint64_t generation;
	size_t total; /* allocations the server announced */
};

/* Called by gms_client_list_all() after each chunk with the index of its first allocation. */
typedef int (*chunk_fn)(gf_gms *g, struct listed *l, size_t first);

/* client.c, for client_wake.c: the FSM (a copy, read under its lock), the session, the list. */
struct gmsc_fsm gms_client_fsm_get(const gf_gms *g);
void gms_client_close_conn(gf_gms *g);
int gms_client_take_connected(gf_gms *g);
void gms_client_fill_connect(gf_gms *g, int mode, int64_t timeout_ms, bool with_list, bool handles_kept,
			     bool by_progress);
int gms_client_do_connect(gf_gms *g, int mode, int64_t timeout_ms, bool by_progress, int cancel_fd);
void gms_client_release_imports(gf_gms *g);
int gms_client_watch_set_locked(gf_gms *g, int fd);
void gms_client_drop_parked(gf_gms *g);
struct gf_mem_mapping *gms_client_mapping_list(gf_gms *g);
void gms_client_listed_free(struct listed *l);
/* One request/reply on the session (@g->msg both ways), and whether it is connected; for client_kv.c. */
int gms_client_request(gf_gms *g, int **fds, size_t *nfds, int64_t deadline);
int gms_client_check_usable(const gf_gms *g);
int gms_client_list_all(gf_gms *g, bool with_meta, struct listed *l, chunk_fn on_chunk, bool already_asked);

#endif
