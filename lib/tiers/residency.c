/* SPDX-License-Identifier: Apache-2.0 */
/* Snapshot jobs, restores and demotion of one GMS's layout (residency.h), around the pure policy of tiers.c. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "residency.h"
#include "tierd.h"

#define MIN_RESIDENT_US (600 * 1000000ll) /* default hysteresis: 10 minutes */
#define PRESSURE_CHECK_US 1000000          /* free memory is looked at once a second */
#define PRESSURE_RETRY_US 30000000         /* after an automatic demotion failed */

struct tiers_residency {
	const struct tiers_residency_host *ops;
	void *host;
	gf_mem *mem;                   /* the GMS's (not ours): restores and free memory */
	int device;
	bool started;
	char *warm_dir, *cold_dir;
	struct tierd *tierd;       /* NULL until needed */
	bool holding;                  /* a snapshot job holds the layout (export_layout) */
	bool restore_from_dir;         /* the restore job reads a named directory, not a kept tier */
	/* a promotion: a reader woke after a demotion, a restore job brings the layout back */
	struct {
		bool active;           /* its restore job is running */
		enum tier tier;    /* the tier that job reads */
		unsigned tried;        /* bit per tier whose restore failed in this promotion */
		int64_t t0_us;
	} promo;
	/* demotion (docs/tiers.md, "Demotion") */
	int64_t min_resident_us;
	bool pinned;
	uint64_t demote_below_free;    /* 0: no automatic pressure */
	enum tier resident;        /* HOT, WARM or COLD after a demotion, LOADER when nothing is kept */
	int64_t resident_since_us;     /* monotonic, when it got there */
	uint8_t demoted_hash[16];      /* the layout a demotion dropped: what a restore must bring back */
	struct {
		bool active;           /* planned, waiting for its snapshot */
		bool requested;        /* a request, not free memory */
		bool wrote;            /* its own snapshot job was started */
		enum tier want;    /* HOT: the policy chooses */
		char why[160];
		int result;            /* how the last one ended: 0 or its error */
		char refusal[256];
	} dem;
	int64_t pressure_next_us;      /* next free-memory check */
	uint64_t demotions;
	bool has_last;
	gf_GmsDemotion last;
};

static void event(struct tiers_residency *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void event(struct tiers_residency *r, const char *fmt, ...)
{
	char text[512];
	va_list ap;
	va_start(ap, fmt);
	gf_log_vformat(text, sizeof(text), fmt, ap); /* values escaped: the host logs the text as is */
	va_end(ap);
	r->ops->event(r->host, text);
}

static void layout(struct tiers_residency *r, struct tiers_host_layout *l)
{
	r->ops->layout(r->host, l);
}

int tiers_residency_new(struct tiers_residency **out, const struct tiers_residency_host *ops, void *host)
{
	struct tiers_residency *r = calloc(1, sizeof(*r));
	if (!r)
		return gf_err(GF_ERR_NOMEM, "tiers: out of memory");
	r->ops = ops;
	r->host = host;
	r->min_resident_us = MIN_RESIDENT_US;
	r->resident = TIER_LOADER;
	*out = r;
	return 0;
}

void tiers_residency_free(struct tiers_residency *r)
{
	if (!r)
		return;
	/* A running snapshot job reads the allocations through its own imports; let it finish. */
	tierd_free(r->tierd);
	free(r->warm_dir);
	free(r->cold_dir);
	free(r);
}

int tiers_residency_set_dirs(struct tiers_residency *r, const char *warm, const char *cold)
{
	char *w = warm && *warm ? strdup(warm) : NULL, *c = cold && *cold ? strdup(cold) : NULL;
	if ((warm && *warm && !w) || (cold && *cold && !c)) {
		free(w);
		free(c);
		return gf_err(GF_ERR_NOMEM, "gmsd: out of memory");
	}
	free(r->warm_dir);
	free(r->cold_dir);
	r->warm_dir = w;
	r->cold_dir = c;
	return 0;
}

int tiers_residency_set_min_resident(struct tiers_residency *r, int64_t ms)
{
	if (ms < 0 || ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "min resident %lldms outside 0..%lldms", (long long)ms,
			      (long long)GF_MAX_DURATION_MS);
	r->min_resident_us = ms * 1000;
	return 0;
}

void tiers_residency_set_pinned(struct tiers_residency *r, bool pinned)
{
	r->pinned = pinned;
}

void tiers_residency_set_demote_below_free(struct tiers_residency *r, uint64_t bytes)
{
	r->demote_below_free = bytes;
}

void tiers_residency_start(struct tiers_residency *r, gf_mem *m, int device)
{
	r->mem = m;
	r->device = device;
	r->started = true;
	r->resident_since_us = gf_now_us();
}

static void set_resident(struct tiers_residency *r, enum tier t)
{
	r->resident = t;
	r->resident_since_us = gf_now_us();
}

/* ---------------------------------------------------------------- snapshot and restore */

static int tierd_ready(struct tiers_residency *r)
{
	if (r->tierd)
		return 0;
	int rc = tierd_new(&r->tierd, gf_mem_kind(r->mem), r->device);
	if (rc == 0)
		rc = tierd_set_dirs(r->tierd, r->warm_dir, r->cold_dir);
	if (rc == 0)
		rc = r->ops->watch(r->host, tierd_get_fd(r->tierd));
	if (rc < 0) {
		tierd_free(r->tierd);
		r->tierd = NULL;
	}
	return rc;
}

bool tiers_residency_kept(const struct tiers_residency *r)
{
	return r && (r->warm_dir || r->cold_dir);
}

bool tiers_residency_is_tier_dir(const struct tiers_residency *r, const char *dir)
{
	return dir && ((r->warm_dir && !strcmp(dir, r->warm_dir)) || (r->cold_dir && !strcmp(dir, r->cold_dir)));
}

int tiers_residency_snapshot(struct tiers_residency *r, const char *dir)
{
	struct tiers_host_layout l;
	layout(r, &l);
	if (!l.hot)
		return gf_err(GF_ERR_STATE, "snapshot: no committed layout (state %s)", l.state);
	if (!dir && !r->warm_dir && !r->cold_dir)
		return gf_err(GF_ERR_INVALID_ARG, "snapshot: no directory given and no --warm/--cold tier kept");
	int rc = tierd_ready(r);
	if (rc < 0)
		return rc;
	if (tierd_busy(r->tierd))
		return gf_err(GF_ERR_BUSY, "snapshot: one is already being written");
	struct tiers_manifest *mf;
	int *fds;
	/* The export holds the layout like a reader until the job ends, so no writer replaces it meanwhile. */
	if ((rc = r->ops->export_layout(r->host, &mf, &fds)) < 0)
		return rc;
	if ((rc = tierd_snapshot_start(r->tierd, dir, mf, fds)) < 0) {
		r->ops->release(r->host);
		return rc;
	}
	r->holding = true;
	event(r, "event=snapshot phase=Pending generation=%llu dir=%s", (unsigned long long)l.generation,
	      dir ? dir : r->warm_dir ? r->warm_dir : r->cold_dir);
	return 0;
}

void tiers_residency_committed(struct tiers_residency *r)
{
	set_resident(r, TIER_HOT);
	/* Keep the tiers current: every new layout goes to WARM, then COLD. */
	if ((r->warm_dir || r->cold_dir) && tiers_residency_snapshot(r, NULL) < 0)
		event(r, "event=snapshot phase=Failed reason=\"%s\"", gf_error_detail());
}

void tiers_residency_dropped(struct tiers_residency *r)
{
	tierd_release_source(r->tierd);
	set_resident(r, TIER_LOADER);
}

static void demote_continue(struct tiers_residency *r);

static void restore_finish(struct tiers_residency *r);
static void promote_next(struct tiers_residency *r);

void tiers_residency_process(struct tiers_residency *r)
{
	if (!r->tierd || !tierd_collect(r->tierd))
		return;
	if (tierd_restoring(r->tierd)) {
		restore_finish(r);
		return;
	}
	struct tiers_op op;
	tierd_op(r->tierd, &op);
	if (r->holding) {
		r->holding = false;
		r->ops->release(r->host);
	}
	event(r, "event=snapshot phase=%s reason=\"%s\"", tiers_phase_name(op.phase), op.reason);
	r->ops->answer(r->host, TIERS_WAIT_SNAPSHOT, op.phase == TIERS_PHASE_CHECKPOINTED ? 0 : GF_ERR_IO, op.reason);
	if (r->dem.active)
		demote_continue(r);
}

/*
 * Memory that released sleepers still pin is not free for a restore: when
 * the snapshot would not fit in what is free, refuse before allocating and
 * say who holds the rest (docs/gms.md, "Memory a sleeper still pins").
 */
static int restore_room(struct tiers_residency *r, const struct tiers_host_layout *l, const char *dir)
{
	if (!l->pinned_bytes)
		return 0;
	const char *dirs[3] = { dir, dir ? NULL : r->warm_dir, dir ? NULL : r->cold_dir };
	uint64_t need = 0, free_b = 0;
	for (int i = 0; i < 3 && !need; i++) {
		struct tiers_snap_probe p;
		if (!dirs[i])
			continue;
		tiers_snapshot_probe(dirs[i], &p);
		need = p.present ? p.bytes : 0;
	}
	if (!need || gf_mem_info(r->mem, &free_b, NULL) < 0 || free_b >= need)
		return 0;
	return gf_err(GF_ERR_OUT_OF_MEMORY, "restore needs %llu bytes and %llu are free: %llu bytes of a dropped layout "
		      "are still pinned by sleepers that did not let go (%s); resume (SIGCONT) or end them",
		      (unsigned long long)need, (unsigned long long)free_b, (unsigned long long)l->pinned_bytes,
		      l->pinned_by);
}

/* The restore checks, shared by both ways to run one. */
static int restore_check(struct tiers_residency *r, const char *dir)
{
	struct tiers_host_layout l;
	layout(r, &l);
	if (!l.empty)
		return gf_err(GF_ERR_STATE, "restore: the GMS is %s, not EMPTY", l.state);
	if (!dir && !r->warm_dir && !r->cold_dir)
		return gf_err(GF_ERR_INVALID_ARG, "restore: no directory given and no --warm/--cold tier kept");
	int rc = tierd_ready(r);
	if (rc < 0)
		return rc;
	if ((rc = restore_room(r, &l, dir)) < 0)
		event(r, "event=restore phase=Failed reason=\"%s\"", gf_error_detail());
	return rc;
}

/* Make a restored layout the GMS's (EMPTY -> COMMITTED). */
static int restore_adopt(struct tiers_residency *r, const char *what, struct tiers_manifest *mf, gf_mem_alloc **allocs)
{
	int rc = r->ops->adopt(r->host, mf, allocs);
	if (rc < 0) {
		tiers_snapshot_restored_free(mf, allocs);
		return rc;
	}
	free(allocs);
	tiers_manifest_free(mf);
	set_resident(r, TIER_HOT);
	struct tiers_host_layout l;
	layout(r, &l);
	char hex[33];
	gf_hex(l.hash, 16, hex);
	event(r, "event=restore phase=Restored tier=%s generation=%llu hash=%s allocations=%zu bytes=%llu", what,
	      (unsigned long long)l.generation, hex, l.allocations, (unsigned long long)l.bytes);
	return 0;
}

int tiers_residency_restore_start(struct tiers_residency *r, const char *dir)
{
	int rc = restore_check(r, dir);
	if (rc == 0)
		rc = tierd_restore_start(r->tierd, dir);
	if (rc < 0)
		return rc;
	r->restore_from_dir = dir != NULL;
	event(r, "event=restore phase=Restoring from=%s", dir ? dir : "best tier");
	return 0;
}

/* A restore job ended: adopt what it read (unless a writer began meanwhile) and answer. */
static void restore_finish(struct tiers_residency *r)
{
	struct tiers_manifest *mf;
	gf_mem_alloc **allocs;
	enum tier from = TIER_LOADER;
	int rc = tierd_restore_result(r->tierd, &mf, &allocs, &from);
	if (rc == 0)
		rc = restore_adopt(r, r->restore_from_dir ? "dir" : tier_name(from), mf, allocs);
	char why[512] = "";
	if (rc < 0) {
		snprintf(why, sizeof(why), "%s", gf_error_detail());
		event(r, "event=restore phase=%s reason=\"%s\"", rc == GF_ERR_NOT_FOUND ? "none" : "Failed", why);
	}
	if (r->promo.active) {
		/* The readers waiting for it are granted by the state change
		 * (COMMITTED), or wait on for a loader: no request to answer. */
		r->promo.active = false;
		if (rc == 0) {
			struct tiers_host_layout l;
			layout(r, &l);
			event(r, "event=promoted from=%s to=hot generation=%llu seconds=%.3f", tier_name(r->promo.tier),
			      (unsigned long long)l.generation, (gf_now_us() - r->promo.t0_us) / 1e6);
		} else if (rc == GF_ERR_OUT_OF_MEMORY) {
			/* The tier is intact, the memory is pinned: the next reader tries again. */
			event(r, "event=promote_waits from=%s reason=\"%s\"", tier_name(r->promo.tier), why);
		} else {
			r->promo.tried |= 1u << r->promo.tier;
			promote_next(r);
		}
		return;
	}
	r->ops->answer(r->host, TIERS_WAIT_RESTORE, rc, why);
}

int tiers_residency_restore(struct tiers_residency *r, const char *dir)
{
	int rc = restore_check(r, dir);
	if (rc < 0)
		return rc;
	struct tiers_manifest *mf;
	gf_mem_alloc **allocs;
	enum tier from = TIER_LOADER;
	event(r, "event=restore phase=Restoring from=%s", dir ? dir : "best tier");
	rc = tierd_restore(r->tierd, dir, r->mem, &mf, &allocs, &from);
	if (rc < 0) {
		event(r, "event=restore phase=%s reason=\"%s\"", rc == GF_ERR_NOT_FOUND ? "none" : "Failed",
		      gf_error_detail());
		return rc;
	}
	/* The allocations are now the GMS's; the array and the manifest are not. */
	return restore_adopt(r, dir ? "dir" : tier_name(from), mf, allocs);
}

/* ---------------------------------------------------------------- demotion */

/* Whether @dir holds a whole snapshot of exactly @hash (probed now: the tier worker's probe may be older). */
static bool tier_holds(const char *dir, const uint8_t hash[16])
{
	struct tiers_snap_probe p;
	if (!dir)
		return false;
	tiers_snapshot_probe(dir, &p);
	return p.present && !memcmp(p.layout_hash, hash, 16);
}

static const char *tier_dir(struct tiers_residency *r, enum tier t)
{
	return t == TIER_WARM ? r->warm_dir : t == TIER_COLD ? r->cold_dir : NULL;
}

/* Answer the waiting request (if any) and end the demotion; an error also goes to the events. */
static void demote_finish(struct tiers_residency *r, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void demote_finish(struct tiers_residency *r, int err, const char *fmt, ...)
{
	char why[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	r->dem.result = err;
	snprintf(r->dem.refusal, sizeof(r->dem.refusal), "%s", err < 0 ? why : "");
	if (err < 0) {
		event(r, "event=demote_refused reason=\"%s\" asked=\"%s\"", why, r->dem.why);
		/* A reader that connected meanwhile is looked at again on the next check; a failure waits longer. */
		if (!r->dem.requested && err != GF_ERR_BUSY)
			r->pressure_next_us = gf_now_us() + PRESSURE_RETRY_US;
	}
	r->dem.active = false;
	r->ops->answer(r->host, TIERS_WAIT_DEMOTION, err, why);
}

/* Free every allocation of the layout now kept in @to: the GMS becomes EMPTY, "demoted to @to". */
static void demote_drop(struct tiers_residency *r, const struct tiers_host_layout *l, enum tier to, const char *policy)
{
	int rc = r->ops->drop(r->host);
	if (rc < 0) {
		demote_finish(r, rc, "%s", gf_error_detail());
		return;
	}
	tierd_release_source(r->tierd);
	memcpy(r->demoted_hash, l->hash, 16);
	set_resident(r, to);
	r->demotions++;
	r->has_last = true;
	gf_GmsDemotion *d = &r->last;
	memset(d, 0, sizeof(*d));
	snprintf(d->from, sizeof(d->from), "%s", tier_name(TIER_HOT));
	snprintf(d->to, sizeof(d->to), "%s", tier_name(to));
	snprintf(d->reason, sizeof(d->reason), "%s", r->dem.requested ? "request" : "free_memory");
	snprintf(d->detail, sizeof(d->detail), "%s; %s", policy, r->dem.why);
	d->at_unix_ms = gf_wall_us() / 1000;
	d->generation = l->generation;
	d->bytes = l->bytes;
	char hex[33];
	gf_hex(r->demoted_hash, 16, hex);
	event(r, "event=demoted from=hot to=%s reason=%s generation=%llu hash=%s allocations=%zu bytes=%llu", d->to,
	      d->reason, (unsigned long long)l->generation, hex, l->allocations, (unsigned long long)l->bytes);
	demote_finish(r, 0, "%s", policy);
}

/* Plan the next step of the active demotion and take it (see tiers_demote_plan()). */
static void demote_continue(struct tiers_residency *r)
{
	struct tiers_host_layout l;
	layout(r, &l);
	struct tiers_demote_facts f = {
		.committed = l.hot,
		.holders = l.readers - (r->holding ? 1 : 0) + l.writer,
		.pinned = r->pinned,
		.pressure = true,
		.resident_us = gf_now_us() - r->resident_since_us,
		.min_resident_us = r->min_resident_us,
		.want = r->dem.want,
		.warm_kept = r->warm_dir != NULL,
		.cold_kept = r->cold_dir != NULL,
	};
	if (l.hot) {
		f.warm_current = tier_holds(r->warm_dir, l.hash);
		f.cold_current = tier_holds(r->cold_dir, l.hash);
		/* WARM has room also when evicting its older snapshot makes it (tier_place()). */
		struct tiers_place_in pin;
		struct tiers_place_out pout;
		tier_place_facts(r->warm_dir, r->cold_dir, l.hash, l.bytes, &pin);
		tier_place(&pin, &pout);
		f.warm_room = f.warm_current || (r->warm_dir && pout.write_warm);
		f.cold_room = f.cold_current || (r->cold_dir && tier_fs_free(r->cold_dir) >= l.bytes);
	}
	struct tiers_demote_plan p;
	tiers_demote_plan(&f, &p);
	if (p.step == TIERS_DEMOTE_STAY) {
		if (p.err == GF_ERR_BUSY)
			demote_finish(r, p.err, "%s (%u readers, %s)", p.reason, f.holders - l.writer,
				      l.writer ? "a writer" : "no writer");
		else if (l.hot && p.err == GF_ERR_STATE)
			demote_finish(r, p.err, "%s (hot for %.1f s, min_resident %.1f s%s)", p.reason, f.resident_us / 1e6,
				      f.min_resident_us / 1e6, r->pinned ? ", pinned" : "");
		else if (!l.hot)
			demote_finish(r, p.err, "%s (state %s)", p.reason, l.state);
		else
			demote_finish(r, p.err, "%s", p.reason);
		return;
	}
	if (r->holding)
		return; /* a snapshot (a commit's) is being written from the layout: plan again when it ends */
	if (p.step == TIERS_DEMOTE_DROP) {
		demote_drop(r, &l, p.to, p.reason);
		return;
	}
	if (r->dem.wrote) {
		/* Never drop what is not safely below: the snapshot failed, the layout stays HOT. */
		struct tiers_op op;
		tierd_op(r->tierd, &op);
		demote_finish(r, GF_ERR_IO, "the snapshot to %s failed, staying hot: %s", tier_name(p.to),
			      op.phase == TIERS_PHASE_FAILED ? op.reason : "the tier does not hold this layout");
		return;
	}
	int rc = tiers_residency_snapshot(r, tier_dir(r, p.to));
	if (rc < 0) {
		demote_finish(r, rc, "snapshot to %s: %s", tier_name(p.to), gf_error_detail());
		return;
	}
	r->dem.wrote = true;
	event(r, "event=demote phase=snapshot to=%s generation=%llu", tier_name(p.to),
	      (unsigned long long)l.generation);
}

/* Start a demotion (pressure once): 0 when it may go on, else the refusal. */
static int demote_begin(struct tiers_residency *r, enum tier want, bool requested, const char *why)
{
	if (r->dem.active)
		return gf_err(GF_ERR_BUSY, "demote: a demotion is already under way (%s)", r->dem.why);
	memset(&r->dem, 0, sizeof(r->dem));
	r->dem.active = true;
	r->dem.requested = requested;
	r->dem.want = want;
	snprintf(r->dem.why, sizeof(r->dem.why), "%s", why);
	return 0;
}

int tiers_residency_demote(struct tiers_residency *r, enum tier want, const char *why)
{
	int rc = demote_begin(r, want, true, why);
	if (rc < 0)
		return rc;
	demote_continue(r);
	if (!r->dem.active && r->dem.result < 0)
		return gf_err(r->dem.result, "demote: %s", r->dem.refusal);
	return 0;
}

/*
 * Start the promotion's restore job from the demoted layout's tier, or else
 * the other one if it holds the same layout, skipping tiers that already
 * failed; the job runs on the tier worker, so the GMS serves its other
 * clients meanwhile. Nothing usable left: readers wait for a loader.
 */
static void promote_next(struct tiers_residency *r)
{
	enum tier from = r->resident, other = from == TIER_WARM ? TIER_COLD : TIER_WARM;
	enum tier order[2] = { from, other };
	for (int i = 0; i < 2; i++) {
		const char *dir = tier_dir(r, order[i]);
		if ((r->promo.tried & (1u << order[i])) || !tier_holds(dir, r->demoted_hash))
			continue;
		int rc = tiers_residency_restore_start(r, dir);
		if (rc == 0) {
			r->promo.active = true;
			r->promo.tier = order[i];
			return;
		}
		if (rc == GF_ERR_OUT_OF_MEMORY) {
			/* The tier is intact, the memory is pinned: the next reader tries again. */
			event(r, "event=promote_waits from=%s reason=\"%s\"", tier_name(order[i]), gf_error_detail());
			return;
		}
		r->promo.tried |= 1u << order[i];
	}
	event(r, "event=promote_failed from=%s reason=\"no tier holds the demoted layout intact\" detail=\"%s\"",
	      tier_name(from), gf_error_detail());
	set_resident(r, TIER_LOADER);
}

/* A reader connects to a demoted GMS: bring the dropped layout back from its tier (promote_next). */
void tiers_residency_reader_connects(struct tiers_residency *r)
{
	struct tiers_host_layout l;
	layout(r, &l);
	/* A restore job on its way brings a layout (and the readers their grant) when it ends. */
	if (!l.empty || (r->resident != TIER_WARM && r->resident != TIER_COLD) ||
	    (r->tierd && tierd_busy(r->tierd)))
		return;
	r->promo.tried = 0;
	r->promo.t0_us = gf_now_us();
	promote_next(r);
}

int64_t tiers_residency_deadline(struct tiers_residency *r)
{
	if (!r->demote_below_free || r->pinned || r->resident != TIER_HOT || r->dem.active)
		return INT64_MAX;
	int64_t at = r->resident_since_us + r->min_resident_us;
	return at > r->pressure_next_us ? at : r->pressure_next_us;
}

/* Free memory below the threshold is pressure: demote once min_resident passed and nobody holds the lock. */
void tiers_residency_timer(struct tiers_residency *r, int64_t now)
{
	if (now < tiers_residency_deadline(r))
		return;
	r->pressure_next_us = now + PRESSURE_CHECK_US;
	struct tiers_host_layout l;
	layout(r, &l);
	if (!l.hot || l.readers > 0)
		return; /* readers hold the layout (or a snapshot is written): look again later */
	uint64_t free_b = 0;
	if (gf_mem_info(r->mem, &free_b, NULL) < 0) {
		gf_log(GF_LOG_WARN, "gms", "msg=\"free memory unknown: no automatic demotion\" detail=\"%s\"",
		       gf_error_detail());
		return;
	}
	if (free_b >= r->demote_below_free)
		return;
	char why[160];
	snprintf(why, sizeof(why), "free memory %llu bytes below %llu", (unsigned long long)free_b,
		 (unsigned long long)r->demote_below_free);
	if (demote_begin(r, TIER_HOT, false, why) == 0)
		demote_continue(r);
}

/* ---------------------------------------------------------------- status and metrics */

void tiers_residency_status(struct tiers_residency *r, gf_GmsStatus *s)
{
	snprintf(s->resident_tier, sizeof(s->resident_tier), "%s", tier_name(r->resident));
	s->resident_seconds = r->started ? (gf_now_us() - r->resident_since_us) / 1e6 : 0;
	s->pinned = r->pinned;
	s->min_resident_seconds = r->min_resident_us / 1e6;
	s->demote_below_free_bytes = r->demote_below_free;
	s->demotions = r->demotions;
	s->has_last_demotion = r->has_last;
	if (r->has_last)
		s->last_demotion = r->last;
	if (!r->tierd)
		return;
	for (int i = TIER_WARM; i <= TIER_COLD; i++) {
		const char *dir = tierd_dir(r->tierd, (enum tier)i);
		if (!dir)
			continue;
		struct tiers_snap_probe p;
		tierd_probe(r->tierd, (enum tier)i, &p);
		gf_GmsTier *t = &s->tiers[s->tiers_count++];
		snprintf(t->name, sizeof(t->name), "%s", tier_name((enum tier)i));
		snprintf(t->dir, sizeof(t->dir), "%s", dir);
		t->present = p.present;
		t->bytes = p.bytes;
		t->allocations = p.allocations;
		t->generation = p.generation;
		int64_t ms = gf_wall_us() / 1000 - p.created_unix_ms;
		t->age_seconds = p.present && ms > 0 ? ms / 1000.0 : 0;
		snprintf(t->error, sizeof(t->error), "%s", p.error);
	}
	struct tiers_op op;
	tierd_op(r->tierd, &op);
	if (op.phase == TIERS_PHASE_NONE)
		return;
	s->has_operation = true;
	snprintf(s->operation.kind, sizeof(s->operation.kind), "%s", tiers_op_name(op.kind));
	snprintf(s->operation.phase, sizeof(s->operation.phase), "%s", tiers_phase_name(op.phase));
	snprintf(s->operation.reason, sizeof(s->operation.reason), "%s", op.reason);
	s->operation.bytes = op.bytes;
	s->operation.seconds = ((op.ended_us ? op.ended_us : gf_wall_us()) - op.started_us) / 1e6;
}

void tiers_residency_metrics(struct tiers_residency *r, const gf_GmsStatus *s, FILE *f)
{
	fputs("# HELP gf_gms_resident_tier Where the layout is: 1 for the current tier (loader: nowhere).\n"
	      "# TYPE gf_gms_resident_tier gauge\n", f);
	for (int t = TIER_HOT; t <= TIER_LOADER; t++)
		fprintf(f, "gf_gms_resident_tier{tier=\"%s\"} %d\n", tier_name((enum tier)t),
			!strcmp(s->resident_tier, tier_name((enum tier)t)));
	fprintf(f, "# HELP gf_gms_resident_seconds Time the layout has been at its resident tier.\n"
		   "# TYPE gf_gms_resident_seconds gauge\ngf_gms_resident_seconds %.3f\n"
		   "# HELP gf_gms_pinned 1 when the layout is never demoted (gf-gmsd --pin).\n"
		   "# TYPE gf_gms_pinned gauge\ngf_gms_pinned %d\n"
		   "# HELP gf_gms_min_resident_seconds No demotion before the layout was HOT this long.\n"
		   "# TYPE gf_gms_min_resident_seconds gauge\ngf_gms_min_resident_seconds %.3f\n"
		   "# HELP gf_gms_demote_below_free_bytes Free device memory below which the GMS demotes (0: off).\n"
		   "# TYPE gf_gms_demote_below_free_bytes gauge\ngf_gms_demote_below_free_bytes %llu\n"
		   "# HELP gf_gms_demotions_total Demotions done (layout dropped to a lower tier).\n"
		   "# TYPE gf_gms_demotions_total counter\ngf_gms_demotions_total %llu\n",
		s->resident_seconds, s->pinned ? 1 : 0, s->min_resident_seconds,
		(unsigned long long)s->demote_below_free_bytes, (unsigned long long)s->demotions);
	if (s->has_last_demotion) {
		const gf_GmsDemotion *l = &s->last_demotion;
		fprintf(f, "# HELP gf_gms_last_demotion_timestamp_seconds When the last demotion happened (unix time).\n"
			   "# TYPE gf_gms_last_demotion_timestamp_seconds gauge\n"
			   "gf_gms_last_demotion_timestamp_seconds{from=\"%s\",to=\"%s\",reason=\"%s\"} %.3f\n",
			l->from, l->to, l->reason, l->at_unix_ms / 1e3);
	}
	if (r->tierd) {
		char tiers[4096];
		size_t tl = 0;
		tierd_metrics(r->tierd, tiers, sizeof(tiers), &tl);
		fwrite(tiers, 1, tl, f);
	}
}
