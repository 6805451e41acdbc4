/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gpufailover/gms.h
 * @brief GPU Memory Service client: the connection is the RW/RO lock.
 *
 * One GMS serves one device, owns the allocations and never maps them. A
 * writer (RW) allocates, maps read-write, writes, puts metadata and commits;
 * readers (RO) import every allocation and map it read-only. unmap()
 * (sleep) and remap() (wake) keep the virtual addresses stable.
 */
#ifndef GPUFAILOVER_GMS_H
#define GPUFAILOVER_GMS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base.h"
#include "mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup gms GMS client
 *  @{ */

/** Connect modes. */
enum gf_gms_mode {
	GF_GMS_RW = 1,       /**< exclusive writer; drops an old committed layout */
	GF_GMS_RO = 2,       /**< shared reader; needs a committed layout and no waiting writer */
	GF_GMS_RW_OR_RO = 3, /**< RO if committed, else RW if free, else wait */
};

/** States of a GMS's lock FSM (docs/gms.md); the one definition, the wire and the server use these values. */
enum gf_gms_state {
	GF_GMS_STATE_EMPTY = 0,     /**< nothing loaded, no writer */
	GF_GMS_STATE_RW = 1,        /**< a writer is loading */
	GF_GMS_STATE_COMMITTED = 2, /**< a layout is committed, nobody maps it */
	GF_GMS_STATE_RO = 3,        /**< a committed layout with readers */
};

/** Where a demotion takes the committed layout (gf_gms_demote(), gf_gmsd_demote(); docs/tiers.md). */
enum gf_gms_tier {
	GF_GMS_TIER_ANY = 0,  /**< the policy chooses: WARM, or COLD when WARM is not kept or has no room */
	GF_GMS_TIER_WARM = 1, /**< the WARM tier (gf-gmsd --warm) */
	GF_GMS_TIER_COLD = 2, /**< the COLD tier (gf-gmsd --cold) */
};

/** "EMPTY", "RW", "COMMITTED", "RO"; "?" for other values. Static string. */
GF_EXPORT const char *gf_gms_state_name(int state);
/** "RW", "RO", "RW_OR_RO"; "?" for other values. Static string. */
GF_EXPORT const char *gf_gms_mode_name(int mode);

typedef struct gf_gms gf_gms;

/** One allocation as the client sees it. */
struct gf_gms_alloc_info {
	uint64_t id;
	uint64_t size;   /**< granularity-rounded */
	uint64_t addr;   /**< where it is (or will be again after remap) mapped; 0 if never mapped */
	char tag[64];
};

/** One metadata entry. @c value points into the client; valid until the next call on it. */
struct gf_gms_meta {
	const char *key;
	uint64_t alloc_id;
	uint64_t offset;
	uint64_t addr;   /**< allocation address + offset */
	const void *value;
	size_t value_len;
};

/** Called once when the GMS connection is lost while connected (@p err GF_ERR_GMS_LOST). */
typedef void (*gf_gms_lost_fn)(gf_gms *gms, int err, const char *detail, void *userdata);

struct gf_lock_proof;

/**
 * What a connect carries besides its mode and timeout (gf_gms_connect()).
 * Zero-initialise it and set what applies; NULL options are all zero.
 */
struct gf_gms_connect_opts {
	/**
	 * The fence proof of the caller's current lock grant
	 * (gf_lock_grant_proof(); NULL: none; copied). A GMS tied to a lock
	 * server (gf_gmsd_set_lock(), `gf-gmsd --lock`) grants an RW request
	 * that would drop a committed layout only when the lock server
	 * confirms that the proof is its current holder's; otherwise the
	 * connect fails with GF_ERR_PERMISSION (or GF_ERR_UNREACHABLE when
	 * the lock server does not answer).
	 */
	const struct gf_lock_proof *proof;
	/**
	 * Without @c proof: the caller's lock grant by its epoch alone
	 * (gf_lock_epoch(); 0: no grant). The epoch is public (gfctl lock
	 * status shows it), so a fenced GMS refuses a drop on it alone.
	 */
	uint64_t lock_epoch;
	/**
	 * Nonzero: @p timeout_ms counts only while no writer makes progress
	 * (docs/gms.md, "Waiting for a loader"): the wait goes on as long as a
	 * writer holds RW and makes progress (its grant, each allocation it
	 * asks for, each metadata entry, each gf_gms_report_progress()),
	 * however long the load takes, and fails with GF_ERR_TIMEOUT once no
	 * writer has been connected for @p timeout_ms (detail "no writer
	 * connected for N s") or the connected writer has made no progress for
	 * @p timeout_ms (detail "writer connected but made no progress for N
	 * s", naming the writer and its figures). Both count from the later of
	 * the request and the event (the writer's last progress, or the last
	 * writer's leaving). For a follower waiting for its loader's commit;
	 * the wake path keeps an absolute bound (gf_gms_remap()). Since the GMS
	 * decides when the wait ends, the client sets no deadline of its own
	 * on the answer: a stopped GMS keeps it waiting (as with @p timeout_ms
	 * < 0). A GMS older than this option counts @p timeout_ms from the
	 * request.
	 */
	int by_progress;
	/**
	 * With @c by_progress: an fd (> 0; 0 or negative: none) that ends the
	 * wait early: once it is readable (e.g. an eventfd written from a
	 * signal handler) the request is withdrawn and the connect returns
	 * GF_ERR_INTERRUPTED. It is only polled: the caller drains it.
	 */
	int cancel_fd;
};

/**
 * Connect to the GMS at @p uri in @p mode, waiting in the server up to
 * @p timeout_ms (< 0: forever; 0: only if grantable now; the wake path must
 * pass a finite timeout), carrying @p opts (may be NULL: no lock grant, an
 * absolute timeout). @p mem is borrowed and must outlive the client;
 * it must be the same backend and device as the server's (checked:
 * GF_ERR_INVALID_ARG). When granted RW, the client reserves one address
 * range of the device's total memory for the allocations to come; a reader
 * reserves the layout's size at gf_gms_map_all(). Blocks. Free with
 * gf_gms_free(). Errors: GF_ERR_TIMEOUT, GF_ERR_UNREACHABLE,
 * GF_ERR_PROTOCOL, GF_ERR_PERMISSION, GF_ERR_INVALID_ARG (also for a proof
 * of epoch 0), GF_ERR_INTERRUPTED (@c opts->cancel_fd).
 */
GF_EXPORT int gf_gms_connect(gf_gms **out, const char *uri, gf_mem *mem, int mode, int64_t timeout_ms,
			     const struct gf_gms_connect_opts *opts);
/** Stop the watcher, unmap, release the imports, give back the address range, close (releasing the lock). NULL is a no-op. */
GF_EXPORT void gf_gms_free(gf_gms *gms);
/**
 * The lock grant this client's later connects carry (a wake's, gf_gms_remap()):
 * @p proof (copied; NULL: none from now on). An engine that connected before
 * it held the lock sets it once granted. Not thread-safe against a connect or
 * wake of the same client. Errors: GF_ERR_INVALID_ARG (NULL client, proof of epoch 0).
 */
GF_EXPORT int gf_gms_set_lock_proof(gf_gms *gms, const struct gf_lock_proof *proof);
/** Mode granted: GF_GMS_RW, or GF_GMS_RO (also after commit); 0 while disconnected (asleep). */
GF_EXPORT int gf_gms_granted_mode(const gf_gms *gms);

/* ---- writer ---- */
/**
 * Allocate @p size bytes in the GMS (the server creates it, retrying for its
 * --oom-retry time on OUT_OF_MEMORY), import it and map it read-write at the
 * next granularity-aligned offset of the reservation. Fills @p id (may be
 * NULL). Needs RW. Blocks for one round trip. Errors: GF_ERR_STATE (not
 * RW), GF_ERR_OUT_OF_MEMORY, GF_ERR_GMS_LOST, GF_ERR_INVALID_ARG (size 0,
 * tag over 63 bytes).
 */
GF_EXPORT int gf_gms_allocate(gf_gms *gms, uint64_t size, const char *tag, uint64_t *id);
/**
 * Put a metadata entry (key unique, 1..255 bytes; value up to 1024 bytes,
 * copied). Needs RW. One round trip. Errors: GF_ERR_STATE,
 * GF_ERR_NOT_FOUND (unknown allocation id), GF_ERR_INVALID_ARG (offset
 * outside the allocation, duplicate key, sizes), GF_ERR_GMS_LOST.
 */
GF_EXPORT int gf_gms_put_meta(gf_gms *gms, const char *key, uint64_t alloc_id, uint64_t offset,
			      const void *value, size_t value_len);
/**
 * Synchronize the device, then validate, hash the layout and commit in the
 * server; the connection becomes a reader (no reconnect) and the mappings
 * are re-made read-only in place (same addresses). @p generation may be
 * NULL. Errors: GF_ERR_STATE (not RW), GF_ERR_INVALID_ARG, GF_ERR_GMS_LOST.
 */
GF_EXPORT int gf_gms_commit(gf_gms *gms, uint64_t *generation);
/**
 * Writer: tell the GMS how far the load is, @p done_bytes written into its
 * allocations so far out of @p total_bytes (0: unknown). It is the writer's
 * progress that readers waiting by progress (gf_gms_connect_opts.by_progress)
 * are judged by: a loader that writes for longer than their timeout without
 * allocating or putting metadata (copying a large model from disk) calls
 * this as it goes. The status shows the figures (`writer_progress`).
 * Sends at most one report per 100 ms (later calls within that time only
 * return 0), one round trip each; nothing to a GMS that does not take
 * reports (older servers). Not thread-safe against other calls on @p gms.
 * Errors: GF_ERR_INVALID_ARG (NULL), GF_ERR_STATE (not the writer),
 * GF_ERR_GMS_LOST.
 */
GF_EXPORT int gf_gms_report_progress(gf_gms *gms, uint64_t done_bytes, uint64_t total_bytes);

/* ---- reader ---- */
/**
 * Fetch all allocations (with their fds, in batches) and metadata in one
 * round trip, import and map read-only at granularity-aligned offsets of one
 * reservation; all-or-nothing. Needs RO; a no-op for a writer that
 * committed. Errors: GF_ERR_STATE, GF_ERR_PROTOCOL, GF_ERR_GMS_LOST,
 * GF_ERR_DRIVER.
 */
GF_EXPORT int gf_gms_map_all(gf_gms *gms);

/* ---- both ---- */
/** Number of allocations known to this client (kept while asleep). */
GF_EXPORT size_t gf_gms_alloc_count(const gf_gms *gms);
/** Allocation @p index in allocation order. GF_ERR_INVALID_ARG when out of range. */
GF_EXPORT int gf_gms_alloc_at(const gf_gms *gms, size_t index, struct gf_gms_alloc_info *out);
/** Number of metadata entries known to this client. */
GF_EXPORT size_t gf_gms_meta_count(const gf_gms *gms);
/**
 * Entry @p index: in put order for a writer before commit, sorted by key
 * after commit and for readers. Strings point into the client (valid until
 * the next call on it).
 */
GF_EXPORT int gf_gms_meta_at(const gf_gms *gms, size_t index, struct gf_gms_meta *out);
/** Look up @p key (binary search once committed). GF_ERR_NOT_FOUND when absent. */
GF_EXPORT int gf_gms_meta_get(const gf_gms *gms, const char *key, struct gf_gms_meta *out);
/** Layout hash (16 bytes) and generation of the committed layout this client maps. GF_ERR_STATE before one is known. */
GF_EXPORT int gf_gms_layout(const gf_gms *gms, uint8_t hash[16], uint64_t *generation);

/* ---- sleep / wake ---- */
/**
 * Sleep: synchronize, unmap all, keep the address range, give the lock back.
 * A reader keeps its session (handshaken, no lock) and, unless
 * gf_gms_set_keep_handles(gms, 0), its imported handles, unmapped: a wake
 * into the same layout then maps them with no list and no fd passing. They
 * pin the layout's memory; when the GMS drops that layout (a new load, a
 * demotion) or goes away it closes the session, and a thread of this client
 * releases them at once. A writer, or a reader whose session cannot be kept,
 * releases its imports and closes the connection.
 */
GF_EXPORT int gf_gms_unmap(gf_gms *gms);
/**
 * Whether gf_gms_unmap() keeps a reader's imported handles: nonzero (the default) keeps them.
 * 0 releases them at every sleep, so a sleeping engine holds nothing of
 * the GMS's memory even for the moment a drop takes; each wake then receives
 * every fd again. Takes effect at the next gf_gms_unmap(). Errors:
 * GF_ERR_INVALID_ARG (NULL).
 */
GF_EXPORT int gf_gms_set_keep_handles(gf_gms *gms, int keep);
/**
 * Wake: connect RO within @p timeout_ms (finite; an unreachable GMS, e.g.
 * one restarting from a snapshot, is retried every 50 ms until then), check
 * the layout hash, re-import and map at the same addresses; all-or-nothing.
 * Errors: GF_ERR_TIMEOUT (e.g. a fresh GMS with no commit),
 * GF_ERR_STALE_LAYOUT (another layout was committed), GF_ERR_UNREACHABLE.
 * With kept handles of an unchanged layout it maps those instead (the GMS
 * says so in its grant); otherwise it releases them and imports the list.
 */
GF_EXPORT int gf_gms_remap(gf_gms *gms, int64_t timeout_ms);
/**
 * The first half of a wake, for callers with other wake work to do: send
 * the request for the RO lock and the allocation list over the session kept
 * since gf_gms_unmap(), and return without waiting, so the GMS answers
 * while the caller works; gf_gms_remap() then reads the answer and maps.
 * The GMS may grant the RO lock as soon as it reads the request: follow
 * with gf_gms_remap() (or gf_gms_free()) soon. Without a kept session (it
 * broke, or none was kept) this sends nothing and gf_gms_remap() connects
 * as usual. Does not block beyond one send. Errors: GF_ERR_INVALID_ARG
 * (NULL, negative @p timeout_ms), GF_ERR_STATE (connected, or nothing
 * mapped before).
 */
GF_EXPORT int gf_gms_remap_begin(gf_gms *gms, int64_t timeout_ms);
/**
 * Take back a gf_gms_remap_begin() no gf_gms_remap() will follow (the
 * caller did not get the lock after all): the kept session is closed, so the
 * GMS lets go of the RO lock it may have granted (a reader that never maps
 * must not hold back a writer), and the kept handles are released; the next
 * gf_gms_remap() connects afresh and imports the list. A no-op (0) when no
 * request is out. Errors: GF_ERR_INVALID_ARG (NULL).
 */
GF_EXPORT int gf_gms_remap_cancel(gf_gms *gms);
/**
 * Fill the page tables of every mapped allocation now (host backend, one
 * call per allocation), so the first reads take no page faults; a no-op on
 * device memory. A hint: where the kernel cannot, the faults come later as
 * usual. Blocks for the work only. Errors: GF_ERR_INVALID_ARG (NULL),
 * GF_ERR_STATE (nothing mapped: asleep, or no committed layout yet).
 */
GF_EXPORT int gf_gms_prefault(gf_gms *gms);

/* ---- KV pool ---- */
/** One finished block of the KV pool's directory (gf_gms_kv_publish(), gf_gms_kv_directory()). */
struct gf_gms_kv_block {
	uint32_t index;    /**< the block's number in the pool: 0 .. size / block_bytes - 1 */
	uint32_t hash_len; /**< 1..48 */
	uint8_t hash[48];  /**< the framework's hash of the block's content (its tokens and their prefix) */
};

/** What gf_gms_kv_map() found. */
struct gf_gms_kv_map_info {
	uint64_t size;           /**< the pool's size (granularity-rounded) */
	uint64_t previous_epoch; /**< the directory's owner before this map (0: nobody) */
	uint32_t blocks;         /**< directory blocks adopted (0: it starts empty) */
	int created;             /**< 1 when this map created the pool */
	char start[8];           /**< "adopted", or why it starts empty: "first", "layout", "chain" */
};

/**
 * Map the device's KV pool (docs/gms.md, "The KV pool"): the GMS creates it
 * at the first map, with @p size bytes, and keeps it for later holders;
 * every later map must ask the same size. Only the lock's current holder
 * may: the GMS checks @p proof (gf_lock_grant_proof() of the caller's grant)
 * with the lock server first, so a standby, a stale epoch or a forged proof
 * is refused. The map's connection owns the mapping until it closes (the
 * holder's death) or a newer holder maps. The directory of finished blocks
 * is adopted when @p layout_hash (the caller's KV layout, 16 bytes) and
 * @p block_bytes are the directory's and the epochs chain (@p previous_epoch,
 * when nonzero, must be the directory's owner); otherwise it starts empty.
 * Fills *@p fd with the pool's memory (caller owns; import it with
 * gf_mem_import() or gf_mem_region_back_fd()) and @p info (may be NULL).
 * The content is not zeroed. Needs a connected client (any mode). Blocks
 * for one round trip and the GMS's question to the lock server.
 * Errors: GF_ERR_PERMISSION (not the current holder), GF_ERR_NOT_SUPPORTED
 * (a GMS not fenced by a lock), GF_ERR_INVALID_ARG (NULL, epoch 0, sizes,
 * another size than the pool's), GF_ERR_OUT_OF_MEMORY (creating it),
 * GF_ERR_UNREACHABLE (the lock server did not answer the GMS),
 * GF_ERR_STATE (asleep), GF_ERR_GMS_LOST, GF_ERR_PROTOCOL.
 */
GF_EXPORT int gf_gms_kv_map(gf_gms *gms, const struct gf_lock_proof *proof, uint64_t size, uint64_t block_bytes,
			    const uint8_t layout_hash[16], uint64_t previous_epoch, int *fd,
			    struct gf_gms_kv_map_info *info);
/**
 * Publish to the pool's directory, fenced by @p epoch (the caller's map's):
 * first, when @p clear, empty it; then drop the blocks at @p remove (blocks
 * about to be written again: call before writing them), then record
 * @p add (blocks whose content is finished: call after writing them). A
 * holder that dies between the two leaves no block in the directory whose
 * content is half written. Sent in batches of up to 256 entries, each
 * applied whole. Blocks for one round trip per batch. Errors:
 * GF_ERR_PERMISSION (this connection's map is not the current one, or
 * another epoch), GF_ERR_INVALID_ARG (an index outside the pool, a hash of 0
 * or more than 48 bytes, epoch 0), GF_ERR_STATE, GF_ERR_GMS_LOST.
 */
GF_EXPORT int gf_gms_kv_publish(gf_gms *gms, uint64_t epoch, int clear, const struct gf_gms_kv_block *add, size_t nadd,
				const uint32_t *remove, size_t nremove);
/**
 * The pool's directory in index order: *@p blocks (caller frees with free();
 * NULL when empty), *@p n, and @p epoch (may be NULL: its owner, 0 before
 * any map). Any connected client may read it. Blocks for one round trip per
 * 256 blocks. Errors: GF_ERR_INVALID_ARG, GF_ERR_STATE, GF_ERR_GMS_LOST,
 * GF_ERR_NOMEM.
 */
GF_EXPORT int gf_gms_kv_directory(gf_gms *gms, struct gf_gms_kv_block **blocks, size_t *n, uint64_t *epoch);

/* ---- loss detection ---- */
/**
 * Install the hook called once per connection when the GMS is lost. With no
 * hook the client only reports (a warning log and GF_ERR_GMS_LOST from later
 * calls); the engine layer installs a terminating default. The hook runs on
 * the watcher thread or inside the call that noticed the loss; it must not
 * free the client (gf_gms_free() joins the watcher thread).
 */
GF_EXPORT void gf_gms_set_lost_fn(gf_gms *gms, gf_gms_lost_fn fn, void *userdata);
/** Socket to poll for readability/hangup, then call gf_gms_process(). GF_ERR_STATE while asleep. */
GF_EXPORT int gf_gms_get_fd(const gf_gms *gms);
/** Notice a hangup; returns GF_ERR_GMS_LOST (after the hook) once lost, else 0. */
GF_EXPORT int gf_gms_process(gf_gms *gms);
/**
 * Built-in watcher thread calling the hook within milliseconds of a loss.
 * Stopped by gf_gms_unmap() and started again by gf_gms_remap(). The
 * thread is the one that watches a sleeping reader's kept session (see
 * gf_gms_set_keep_handles()): a wake on that session starts no thread and
 * wakes none.
 */
GF_EXPORT int gf_gms_start_watch(gf_gms *gms);
/**
 * Stop watching for a loss (no-op when not watching): when this returns no
 * hook runs (called from the hook itself, it does not wait). The thread
 * stays, parked, until gf_gms_free().
 */
GF_EXPORT void gf_gms_stop_watch(gf_gms *gms);

/* ---- fault reporter ---- */
/**
 * Optional diagnosis for writes to read-only weights (frameworks such as
 * torch ignore DLPack's read-only flag): installs, once per process, a
 * SIGSEGV/SIGBUS handler (SA_SIGINFO) and records @p gms's current mappings
 * (allocation ids, tags, addresses, metadata keys); calling it again for the
 * same client refreshes them, for another client adds them. On a fault inside
 * a recorded allocation the handler writes one line to stderr, e.g.
 * `gpufailover: SIGSEGV: write to read-only GMS mapping at 0x...: allocation 1
 * tag "weights.0" offset 0x100, key "layers.0.weight" +0x0 (...)`, with the
 * key being the last metadata entry at or below the address. It then restores
 * the previous handler and the fault repeats, so the process dies with the
 * usual signal (or a previous handler, e.g. Python's faulthandler, runs).
 * Faults elsewhere only pass through. The handler uses write(2) only.
 * Addresses stay valid across unmap()/remap(); call
 * gf_gms_fault_reporter_remove() before gf_gms_free(). Install and remove
 * may run on any threads, but not during another call on @p gms (its tables
 * are read). Does not block. Errors: GF_ERR_INVALID_ARG (NULL), GF_ERR_STATE (nothing mapped
 * yet), GF_ERR_NOMEM, GF_ERR_IO (sigaction failed).
 */
GF_EXPORT int gf_gms_fault_reporter_install(gf_gms *gms);
/**
 * Forget @p gms's mappings (NULL: every client's). When none are left the
 * previous SIGSEGV/SIGBUS handlers are restored (unless someone replaced
 * ours since). Thread-safe; not to be called from a signal handler.
 */
GF_EXPORT void gf_gms_fault_reporter_remove(const gf_gms *gms);

/** One-shot status query as JSON (state, generation, layout hash, readers, waiters, allocations, recent events). free() it. */
GF_EXPORT int gf_gms_status_json(const char *uri, int64_t timeout_ms, char **json);

/** Roles for tensor-parallel engines (docs/design.md, decision 5): the mode each connect of a rank asks for (gf_engine_set_role()). */
enum gf_gms_role {
	GF_GMS_ROLE_LOADER = 1,   /**< RW_OR_RO on every device: loads where nothing is committed */
	GF_GMS_ROLE_FOLLOWER = 2, /**< RO only: never holds a writer lock, so TP > 1 cannot deadlock */
};

/**
 * Round trip to the GMS at @p uri (handshake + status) within @p timeout_ms.
 * @p rtt_us (may be NULL) receives the time taken. Errors: GF_ERR_UNREACHABLE,
 * GF_ERR_TIMEOUT, GF_ERR_PROTOCOL, GF_ERR_PERMISSION.
 */
GF_EXPORT int gf_gms_ping(const char *uri, int64_t timeout_ms, int64_t *rtt_us);

/**
 * Wait until the GMS at @p uri holds a committed layout (state COMMITTED or
 * RO), polling its status every 50 ms and retrying while it is unreachable
 * (for startup probes). Takes no lock. @p generation (may be NULL) receives
 * the committed generation. Errors: GF_ERR_TIMEOUT (it answered, nothing
 * committed in time), GF_ERR_UNREACHABLE (it was still unreachable when the
 * time was up), GF_ERR_PERMISSION, GF_ERR_PROTOCOL.
 */
GF_EXPORT int gf_gms_wait_committed(const char *uri, int64_t timeout_ms, uint64_t *generation);

/**
 * Ask the GMS at @p uri to snapshot its committed layout to directory @p dir
 * (on the GMS's host), or to its kept WARM and COLD tiers when @p dir is NULL
 * or empty (docs/tiers.md), and wait for it to be written, within
 * @p timeout_ms. Any allowed client may ask for the kept tiers; only root
 * or the GMS's own uid may name another @p dir. Takes no lock; the GMS keeps
 * serving meanwhile (the layout cannot be replaced until it is written).
 * Errors: GF_ERR_PERMISSION (@p dir is not a kept tier and the caller not an
 * admin uid), GF_ERR_STATE (nothing committed), GF_ERR_BUSY (a snapshot is being
 * written), GF_ERR_INVALID_ARG (no directory and no tier kept, path too
 * long), GF_ERR_IO (the write failed: detail names why), GF_ERR_TIMEOUT,
 * GF_ERR_UNREACHABLE. Blocks.
 */
GF_EXPORT int gf_gms_snapshot(const char *uri, const char *dir, int64_t timeout_ms);
/**
 * Ask an EMPTY GMS at @p uri to restore the snapshot in @p dir, or from its
 * best kept tier (WARM, then COLD) when @p dir is NULL or empty: every
 * checksum is verified before it becomes COMMITTED with the snapshot's layout
 * hash and generation, so sleeping readers remap without a reload. Blocks
 * (the GMS restores before it answers). Only root or the GMS's own uid may
 * name a @p dir that is not a kept tier. Errors: GF_ERR_PERMISSION (that),
 * GF_ERR_STATE (not EMPTY),
 * GF_ERR_NOT_FOUND (no snapshot), GF_ERR_VERSION, GF_ERR_PROTOCOL (corrupt or
 * truncated), GF_ERR_INVALID_ARG (other backend or granularity),
 * GF_ERR_TIMEOUT, GF_ERR_UNREACHABLE; on any error the GMS stays EMPTY.
 */
GF_EXPORT int gf_gms_restore(const char *uri, const char *dir, int64_t timeout_ms);
/**
 * Admin request: ask the GMS at @p uri to demote its committed layout to the
 * tier @p to (enum gf_gms_tier) — pressure once; the GMS's policy decides
 * (docs/tiers.md). When it agrees and no client holds the RO or RW lock, the
 * GMS writes the layout to that tier unless it already holds it, then frees
 * every allocation and becomes EMPTY, "demoted"; the next reader that
 * connects gets the same layout back, restored from the tier. Returns once
 * the layout was dropped or the demotion refused. Allowed for root and the
 * GMS's own uid only. Takes no lock. Blocks up to @p timeout_ms.
 * Errors: GF_ERR_PERMISSION (not an admin uid), GF_ERR_STATE (nothing
 * committed, pinned, before min_resident, no room in a lower tier: the
 * detail says which), GF_ERR_BUSY (a client holds the lock, or a demotion is
 * under way), GF_ERR_INVALID_ARG (unknown @p to, the tier is not kept),
 * GF_ERR_IO (the snapshot failed: the layout stays), GF_ERR_TIMEOUT,
 * GF_ERR_UNREACHABLE.
 */
GF_EXPORT int gf_gms_demote(const char *uri, int to, int64_t timeout_ms);

/** @} */

/** @defgroup gmsd GMS server
 *  One instance serves one device: it creates allocations, exports them as
 *  fds, keeps the metadata table and runs the RW/RO lock FSM. Event-driven
 *  (epoll, non-blocking, one thread, the same server core as gf_lockd):
 *  run it with gf_gmsd_run() or drive it from your own loop with
 *  gf_gmsd_get_fd() / gf_gmsd_get_timeout_ms() / gf_gmsd_process(). Setters
 *  are valid only before gf_gmsd_start() (GF_ERR_STATE after). Only
 *  gf_gmsd_stop() may be called from another thread (or a signal handler).
 *
 *  Connections: a peer that does not finish its handshake, or a frame it
 *  began, within the handshake timeout is dropped; a peer whose socket
 *  buffer stays full for 50 ms while a reply waits is dropped (one slow
 *  reader never holds up the others); at most 16 messages are read from one
 *  peer before the others are served.
 *  @{ */
typedef struct gf_gmsd gf_gmsd;

/** New server with defaults: device 0, backend auto, no OOM retry, handshake timeout 3000 ms, allowed uids: the server's own and root. Errors: GF_ERR_NOMEM, GF_ERR_IO. */
GF_EXPORT int gf_gmsd_new(gf_gmsd **out);
/** Listen on @p uri (unix:// only: fds cannot cross hosts; GF_ERR_INVALID_ARG otherwise); repeatable, at least one required. */
GF_EXPORT int gf_gmsd_add_listen(gf_gmsd *d, const char *uri);
/** Device index for the backend. */
GF_EXPORT int gf_gmsd_set_device(gf_gmsd *d, int index);
/** Backend kind (enum gf_mem_kind). */
GF_EXPORT int gf_gmsd_set_backend(gf_gmsd *d, int kind);
/**
 * Keep retrying an allocation that failed with GF_ERR_OUT_OF_MEMORY every
 * 50 ms for up to @p ms milliseconds while the writer stays connected
 * (0: fail at once; at most a year, GF_ERR_INVALID_ARG beyond). The event
 * loop keeps serving meanwhile.
 */
GF_EXPORT int gf_gmsd_set_oom_retry(gf_gmsd *d, int64_t ms);
/**
 * Allow peers with uid @p uid (SO_PEERCRED; repeatable, at most 64). With an
 * empty list the server's own uid and root may connect; once any uid is
 * added, exactly the listed uids may. A refused peer gets
 * GF_ERR_PERMISSION in answer to its hello.
 */
GF_EXPORT int gf_gmsd_add_allow_uid(gf_gmsd *d, uint32_t uid);
/** A connection that has not finished its handshake, or a frame it began, after @p ms is dropped (default 3000; 1..86400000). */
GF_EXPORT int gf_gmsd_set_handshake_timeout(gf_gmsd *d, int64_t ms);
/**
 * Tie the GMS to the lock server at @p uri (secret for tcp://, or NULL): an RW
 * request that would drop the committed layout is granted only to a client
 * whose connect carries the fence proof of the lock's current grant
 * (gf_gms_connect_opts.proof), so a stray or revoked writer cannot destroy the
 * weights a standby is about to map. The check asks the lock server (one
 * status round trip on a thread of its own, so the other clients are served
 * meanwhile; at most 2 s, refused with GF_ERR_UNREACHABLE when it does not
 * answer). A writer whose connect carried a grant commits only while that
 * grant is current (else its commit fails with GF_ERR_PERMISSION and the load
 * is abandoned). RW on an EMPTY
 * GMS (the first load) is not affected. Before gf_gmsd_start(); copies
 * @p uri and the secret. Errors: GF_ERR_INVALID_ARG, GF_ERR_STATE, GF_ERR_NOMEM.
 */
GF_EXPORT int gf_gmsd_set_lock(gf_gmsd *d, const char *uri, const void *secret, size_t secret_len);
/**
 * Keep residency tiers: snapshot every committed layout to @p warm_dir (a
 * tmpfs directory, e.g. under /dev/shm) and then @p cold_dir (on disk);
 * either may be NULL. Restoring from them is gf_gmsd_restore(). Before
 * gf_gmsd_start() only (GF_ERR_STATE after).
 */
GF_EXPORT int gf_gmsd_set_tiers(gf_gmsd *d, const char *warm_dir, const char *cold_dir);
/**
 * Anti-thrash hysteresis: the committed layout is not demoted before it has
 * been HOT (committed or restored) for @p ms milliseconds (default 600000,
 * 10 minutes; 0..a year, GF_ERR_INVALID_ARG beyond). Before gf_gmsd_start()
 * only (GF_ERR_STATE after).
 */
GF_EXPORT int gf_gmsd_set_min_resident(gf_gmsd *d, int64_t ms);
/** Never demote the committed layout when @p pinned is non-zero (default 0). Before gf_gmsd_start() only. */
GF_EXPORT int gf_gmsd_set_pinned(gf_gmsd *d, int pinned);
/**
 * Automatic pressure: once a second, while the layout is HOT, past
 * min_resident and nobody holds the RO or RW lock, the server reads the
 * device's free memory (gf_mem_info()) and demotes when it is below
 * @p bytes (0, the default: never on its own). An automatic demotion that
 * fails is tried again after 30 s. Before gf_gmsd_start() only.
 */
GF_EXPORT int gf_gmsd_set_demote_below_free(gf_gmsd *d, uint64_t bytes);
/**
 * The server's status as JSON (the same object gf_gms_status_json() returns
 * over the wire). *json is malloc'd; free() it. On the thread that drives the
 * server only. Errors: GF_ERR_INVALID_ARG, GF_ERR_NOMEM.
 */
GF_EXPORT int gf_gmsd_status_json(gf_gmsd *d, char **json);
/**
 * Prometheus text of the server: lock state, generation, readers, waiters,
 * allocations, connections, fd limit, the lock fence, and the residency
 * tiers (presence, bytes, age, the last operation's phase) when kept.
 * *text is malloc'd; free() it. On the thread that drives the server only.
 * Errors: GF_ERR_INVALID_ARG, GF_ERR_NOMEM.
 */
GF_EXPORT int gf_gmsd_metrics(gf_gmsd *d, char **text);
/**
 * Open the backend and listen; raises the process's soft RLIMIT_NOFILE to
 * its hard limit (peers and host allocations are fds). The socket accepts
 * connections when this returns 0.
 */
GF_EXPORT int gf_gmsd_start(gf_gmsd *d);
/**
 * Restore into this EMPTY, started server from the snapshot in @p dir, or
 * from the best kept tier (WARM, then COLD; a refused WARM copy falls back to
 * COLD) when @p dir is NULL: allocate, fill, verify every checksum, then
 * become COMMITTED with the snapshot's layout hash and generation. Blocks the
 * server's loop for the copy. On any error nothing is kept and the server
 * stays EMPTY (the loader path still works). Errors: GF_ERR_STATE (not
 * started, not EMPTY), GF_ERR_NOT_FOUND (no usable snapshot), GF_ERR_VERSION,
 * GF_ERR_PROTOCOL, GF_ERR_INVALID_ARG, GF_ERR_OUT_OF_MEMORY, GF_ERR_DRIVER.
 */
GF_EXPORT int gf_gmsd_restore(gf_gmsd *d, const char *dir);
/**
 * Start a snapshot of the committed layout to @p dir (NULL: the kept tiers)
 * on a thread of the server; returns once started. Progress and the result
 * are in the status (operation phase) and the events. While it runs the
 * snapshot counts as a reader, so no writer replaces the layout. Errors:
 * GF_ERR_STATE (not started, nothing committed), GF_ERR_BUSY,
 * GF_ERR_INVALID_ARG (no directory and no tier kept).
 */
GF_EXPORT int gf_gmsd_snapshot(gf_gmsd *d, const char *dir);
/**
 * Demote the committed layout to tier @p to (enum gf_gms_tier), as
 * gf_gms_demote() asks over the wire: returns 0 once the layout was dropped,
 * or when the drop waits for a snapshot: the tier lacked the layout and its
 * snapshot was started, or a snapshot being written (a commit's) still holds
 * the layout (status state RO, operation phase possibly Checkpointed already:
 * the loop ends the job on a later gf_gmsd_process()). The drop follows when
 * that snapshot ends; status "resident_tier" and the events tell. Else the
 * refusal with the policy's reason (errors as gf_gms_demote()). On the thread
 * that drives the server only.
 */
GF_EXPORT int gf_gmsd_demote(gf_gmsd *d, int to);
/** The backend opened by gf_gmsd_start() (borrowed; NULL before). */
GF_EXPORT gf_mem *gf_gmsd_mem(gf_gmsd *d);
/** An fd that becomes readable when gf_gmsd_process() has work (an epoll fd). */
GF_EXPORT int gf_gmsd_get_fd(const gf_gmsd *d);
/** Milliseconds until gf_gmsd_process() must run even without events (-1: none). */
GF_EXPORT int gf_gmsd_get_timeout_ms(const gf_gmsd *d);
/** Handle every pending event and timer without blocking. Returns 0, 1 once stopped, or an error for a failure of the server itself. */
GF_EXPORT int gf_gmsd_process(gf_gmsd *d);
/** Run the event loop until gf_gmsd_stop(). Blocks. Returns 0 or a negative error. */
GF_EXPORT int gf_gmsd_run(gf_gmsd *d);
/** Make gf_gmsd_run() return soon. Thread-safe and async-signal-safe. */
GF_EXPORT void gf_gmsd_stop(gf_gmsd *d);
/** Close every connection and drop every allocation (importers keep theirs alive). NULL is a no-op. */
GF_EXPORT void gf_gmsd_free(gf_gmsd *d);

/** @} */


/** @defgroup torch PyTorch pluggable allocator
 *  `torch.cuda.memory.CUDAPluggableAllocator(path, "gf_torch_malloc", "gf_torch_free")`
 *  loads these by name from libgpufailover (or the Python extension, which
 *  contains the library); used with `torch.cuda.MemPool` so that only
 *  allocations inside the pool come here.
 *  @{ */
/**
 * Route gf_torch_malloc() to the GMS writer @p writer (borrowed; must stay
 * connected as writer until gf_torch_pool_end()). One pool per process.
 * Errors: GF_ERR_STATE (not the writer), GF_ERR_BUSY (a pool is active).
 */
GF_EXPORT int gf_torch_pool_begin(gf_gms *writer);
/** End the pool begun by gf_torch_pool_begin(). GF_ERR_STATE when none is active. */
GF_EXPORT int gf_torch_pool_end(void);
/**
 * CUDAPluggableAllocator malloc: allocates @p size bytes as a new GMS
 * allocation of the active pool's writer, mapped read-write, and returns its
 * address; NULL (PyTorch reports out of memory) outside a pool or on failure.
 * Thread-safe. @p stream is ignored: the memory is ready on return.
 */
GF_EXPORT void *gf_torch_malloc(ssize_t size, int device, void *stream);
/**
 * CUDAPluggableAllocator free: a no-op. GMS allocations live as long as the
 * committed layout (weights are never freed piecemeal); they go when a new
 * writer replaces the layout or the GMS exits.
 */
GF_EXPORT void gf_torch_free(void *ptr, ssize_t size, int device, void *stream);
/** @} */

#ifdef __cplusplus
}
#endif

#endif
