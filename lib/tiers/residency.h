/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where one GMS's weights reside (docs/tiers.md): the snapshot jobs that keep
 * the WARM and COLD tiers current, the restore into an EMPTY GMS, demotion
 * (the plan from tiers.c, then its I/O) and what status and metrics report
 * about them. This header is the whole interface between the GMS server and
 * its tiers, both ways:
 *
 *   GMS -> tiers  the tiers_residency_* calls below, made where the server's
 *                 state changes (a commit, a drop, a reader connecting, a
 *                 request, its timer, the worker's fd turning readable);
 *   tiers -> GMS  only struct tiers_residency_host, which the server fills:
 *                 look at the layout, export it (held until released), adopt
 *                 a restored one, drop it; and three notifications (an event
 *                 line, the answer to a request waiting on a job, an fd to
 *                 watch).
 *
 * The manifest is the exchange format in both directions: an export fills
 * one, a restore adopts one. lib/tiers has no include root for lib/gms, so
 * reaching the server any other way does not compile (lib/meson.build).
 * Everything here runs on the server's loop thread; only a snapshot, and a
 * restore a client asked for, run on the tier worker's thread (tierd.h).
 */
#ifndef GF_TIERS_RESIDENCY_H
#define GF_TIERS_RESIDENCY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "gpufailover.pb.h"
#include "snapshot.h"
#include "tiers.h"

/* What the GMS holds now, as its tiers need to see it. */
struct tiers_host_layout {
	bool empty;         /* EMPTY: a restore may be adopted */
	bool hot;           /* COMMITTED or RO: a layout to snapshot or demote */
	bool writer;        /* RW: a writer is loading */
	unsigned readers;   /* connections holding RO, an export's hold included */
	const char *state;  /* the lock state's name, for messages */
	uint64_t generation;
	uint8_t hash[16];   /* the committed layout hash */
	size_t allocations;
	uint64_t bytes;     /* sum of the allocation sizes */
	/* dropped layouts that released sleepers still hold (docs/gms.md): the
	 * memory a restore cannot have, and who holds it ("pid 12 (peer) N bytes, ...") */
	uint64_t pinned_bytes;
	char pinned_by[256];
};

/* Which request an answer is for. */
enum tiers_residency_wait {
	TIERS_WAIT_SNAPSHOT = 1, /* GmsSnapshot: answered when the snapshot job ends */
	TIERS_WAIT_DEMOTION = 2, /* GmsDemote: answered when the layout is dropped or the demotion refused */
	TIERS_WAIT_RESTORE = 3,  /* GmsRestore: answered when the restore job ends (adopted or refused) */
};

/* What the tiers may do to the GMS: the server implements these on its loop thread. */
struct tiers_residency_host {
	/* Fill @out (never fails). */
	void (*layout)(void *host, struct tiers_host_layout *out);
	/*
	 * The committed layout as a snapshot job: a manifest with allocation
	 * ids, sizes, tags, metadata (in layout-hash order), generation and
	 * layout hash, and one exported fd per allocation (*@fds malloc'd); both
	 * the caller's. On success the GMS holds the layout like a reader, so
	 * it cannot change, until release(). GF_ERR_STATE when nothing is
	 * committed, else GF_ERR_NOMEM or gf_mem_export()'s errors.
	 */
	int (*export_layout)(void *host, struct tiers_manifest **mf, int **fds);
	/* End the hold of the last successful export_layout(). */
	void (*release)(void *host);
	/*
	 * Make a verified restore the committed layout of the EMPTY GMS, with
	 * @mf's generation and layout hash (EMPTY -> COMMITTED). On success the
	 * allocations and the metadata's keys and values are the GMS's (set to
	 * NULL in @mf); @mf and the @allocs array stay the caller's. On failure
	 * nothing was taken over. GF_ERR_STATE (not EMPTY), GF_ERR_NOMEM, or
	 * gf_mem_seal()'s errors.
	 */
	int (*adopt)(void *host, struct tiers_manifest *mf, gf_mem_alloc **allocs);
	/*
	 * Free the committed layout, which a lower tier now holds (COMMITTED ->
	 * EMPTY). GF_ERR_BUSY, with the detail set, while anyone holds the lock.
	 */
	int (*drop)(void *host);
	/* One line ("event=... key=value") for the GMS's recent events. */
	void (*event)(void *host, const char *text);
	/* Answer every request waiting on @what: 0 (done) or @err with @detail. */
	void (*answer)(void *host, enum tiers_residency_wait what, int err, const char *detail);
	/* Watch @fd in the loop; when readable, call tiers_residency_process(). 0 or the loop's error. */
	int (*watch)(void *host, int fd);
};

struct tiers_residency;

/*
 * Tiers for the GMS @host, reached through @ops (kept, not copied). Nothing
 * is kept and demotion needs a request until configured. 0 or GF_ERR_NOMEM.
 */
int tiers_residency_new(struct tiers_residency **out, const struct tiers_residency_host *ops, void *host);
/* Waits for a running snapshot job, then frees; calls nothing in the host. NULL is a no-op. */
void tiers_residency_free(struct tiers_residency *r);

/* Settings, before tiers_residency_start(): the WARM and COLD directories (NULL or "": not kept). 0 or GF_ERR_NOMEM. */
int tiers_residency_set_dirs(struct tiers_residency *r, const char *warm, const char *cold);
/* No demotion before the layout was HOT this long (default 10 minutes). GF_ERR_INVALID_ARG outside 0..GF_MAX_DURATION_MS. */
int tiers_residency_set_min_resident(struct tiers_residency *r, int64_t ms);
/* A pinned layout is never demoted. */
void tiers_residency_set_pinned(struct tiers_residency *r, bool pinned);
/* Free device memory below @bytes is pressure to demote (0: only requests). */
void tiers_residency_set_demote_below_free(struct tiers_residency *r, uint64_t bytes);
/* The GMS started on @m, device @device: the worker opens its own handle to the same device when first needed. */
void tiers_residency_start(struct tiers_residency *r, gf_mem *m, int device);

/* A writer committed a new layout: it is HOT; write it to the kept tiers (a failure is an event). */
void tiers_residency_committed(struct tiers_residency *r);
/* A writer replaced the committed layout: no tier is resident until the next commit or restore. */
void tiers_residency_dropped(struct tiers_residency *r);
/* A reader asks for the layout: when a demotion emptied the GMS, start a
 * restore job that brings that layout back from its tier (on the tier
 * worker; the reader is granted when the layout is adopted). Returns at once. */
void tiers_residency_reader_connects(struct tiers_residency *r);

/* Whether @dir names one of the kept tiers, as configured (byte for byte). */
/* Whether a WARM or COLD tier is kept (a restarted GMS may restore from it). */
bool tiers_residency_kept(const struct tiers_residency *r);
bool tiers_residency_is_tier_dir(const struct tiers_residency *r, const char *dir);

/*
 * Start writing the committed layout to @dir (NULL: the kept tiers) on the
 * worker's thread; the end comes as answer(TIERS_WAIT_SNAPSHOT). Errors:
 * GF_ERR_STATE (nothing committed), GF_ERR_INVALID_ARG (no directory at
 * all), GF_ERR_BUSY (a snapshot is being written), GF_ERR_NOMEM, the
 * worker's start errors.
 */
int tiers_residency_snapshot(struct tiers_residency *r, const char *dir);
/*
 * Restore the EMPTY GMS from @dir (NULL: the best kept tier) and adopt it.
 * Blocks. Errors: GF_ERR_STATE (not EMPTY), GF_ERR_INVALID_ARG (no
 * directory at all), GF_ERR_NOT_FOUND (no tier holds a usable snapshot),
 * else as tierd_restore() and adopt().
 */
int tiers_residency_restore(struct tiers_residency *r, const char *dir);
/*
 * The same for a client's request, on the tier worker's thread (the loop
 * keeps serving; the GMS stays EMPTY meanwhile, so a writer granted RW in
 * the meantime wins and the restore is then refused as not EMPTY). Its end
 * comes as answer(TIERS_WAIT_RESTORE). Errors before it starts: as
 * tiers_residency_restore()'s checks, GF_ERR_BUSY (a job runs).
 */
int tiers_residency_restore_start(struct tiers_residency *r, const char *dir);
/*
 * Demote the HOT layout to @want (TIER_HOT: the policy chooses), asked
 * for by a request described by @why. 0 when it is done or waits for its
 * snapshot; either way its end comes as answer(TIERS_WAIT_DEMOTION), which
 * may happen before this returns. Errors: GF_ERR_BUSY when another demotion
 * is under way (no answer: a request marked as waiting before the call is
 * still waiting after it), or the refusal it ended with (answered).
 */
int tiers_residency_demote(struct tiers_residency *r, enum tier want, const char *why);

/* The watched fd is readable: finish a snapshot job, answer its waiters, continue a demotion. */
void tiers_residency_process(struct tiers_residency *r);
/* When tiers_residency_timer() wants to look at free memory next (INT64_MAX: never), monotonic µs. */
int64_t tiers_residency_deadline(struct tiers_residency *r);
/* The loop's timer at @now: demote under free-memory pressure. */
void tiers_residency_timer(struct tiers_residency *r, int64_t now);

/* The tiers, the last operation and the demotion fields of the GMS's status. */
void tiers_residency_status(struct tiers_residency *r, gf_GmsStatus *s);
/* Prometheus text for the residency (@s as filled by tiers_residency_status()) and the tiers. */
void tiers_residency_metrics(struct tiers_residency *r, const gf_GmsStatus *s, FILE *f);

#endif
