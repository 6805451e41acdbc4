/* SPDX-License-Identifier: Apache-2.0 */
/* The GMS's tier worker (tierd.h): snapshot jobs on a thread, restore from the best tier, status. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common.h"
#include "mem_int.h"
#include "tierd.h"
#include "xfer.h"

struct tierd {
	gf_mem *m;     /* the worker's own backend handle: imports never share objects with the server's */
	int efd;
	char *dir[3];  /* indexed by enum tier: WARM, COLD */
	pthread_mutex_t lock;
	struct tiers_op op;        /* under lock */
	/* A job's last phase (Checkpointed, Restored, Failed), set on its thread
	 * and published by the loop when it collects the job (under lock). */
	bool final_held;
	enum tiers_phase final_phase;
	uint64_t final_bytes;
	char final_reason[256];
	char op_dir[512];        /* under lock */
	struct tiers_snap_probe probe[3]; /* under lock */
	bool running;            /* a thread was started and not joined (loop thread only) */
	pthread_t thread;
	/* the job */
	char *job_dir;
	struct tiers_manifest *job_mf;
	int *job_fds;
	/* a restore job (tierd_restore_start): its result until tierd_restore_result() */
	bool job_restore;
	int res_rc;
	char res_detail[512];
	struct tiers_manifest *res_mf;
	gf_mem_alloc **res_allocs;
	enum tier res_from;
	/* Host: the committed layout mapped read-only back to back from the
	 * job's fds, page tables filled, made by the first job after a commit
	 * and kept for the next ones (both tiers, a later GmsSnapshot), so no
	 * snapshot faults its source in. A plain mapping: it holds no fd (the
	 * GMS's fd budget is one per allocation) but keeps the memory alive, so
	 * it goes when the GMS drops the layout. Used by the job thread while
	 * one runs. */
	uint8_t *src;
	size_t src_len;
	ino_t *src_ino; /* the memfds it maps: a later job's layout is the same only with the same memory */
	size_t src_n;
};

static void release_source(struct tierd *t)
{
	if (t->src)
		munmap(t->src, t->src_len);
	free(t->src_ino);
	t->src = NULL;
	t->src_ino = NULL;
	t->src_len = t->src_n = 0;
}

/* Whether the kept source maps exactly the memfds @fds (@n of them). */
static bool same_source(const struct tierd *t, const int *fds, size_t n)
{
	struct stat st;
	if (!t->src || t->src_n != n)
		return false;
	for (size_t i = 0; i < n; i++)
		if (fstat(fds[i], &st) < 0 || st.st_ino != t->src_ino[i])
			return false;
	return true;
}

void tierd_release_source(struct tierd *t)
{
	if (t && !t->running)
		release_source(t);
}

/*
 * Map @fds (the files of @mf's allocations) read-only back to back and
 * fill the page tables, on the job's thread; kept for the layout's later
 * snapshots. 0 when not kept (allocations that are not files, or mmap
 * failed: the snapshot then maps its own as before).
 */
static uint64_t keep_source(struct tierd *t, const struct tiers_manifest *mf, const int *fds)
{
	struct stat st;
	ino_t *ino = (gf_mem_caps(t->m) & GF_MEM_CAP_FILES) ? calloc(mf->nallocs ? mf->nallocs : 1, sizeof(*ino)) : NULL;
	size_t total = 0;
	for (size_t i = 0; ino && i < mf->nallocs; i++) {
		total += mf->allocs[i].size;
		if (fstat(fds[i], &st) < 0) {
			free(ino);
			return 0;
		}
		ino[i] = st.st_ino;
	}
	if (!ino)
		return 0;
	uint8_t *p = mmap(NULL, total ? total : 1, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED) {
		free(ino);
		return 0;
	}
	size_t at = 0;
	for (size_t i = 0; i < mf->nallocs; i++) {
		if (mmap(p + at, mf->allocs[i].size, PROT_READ, MAP_SHARED | MAP_FIXED, fds[i], 0) == MAP_FAILED) {
			munmap(p, total);
			free(ino);
			return 0;
		}
		at += mf->allocs[i].size;
	}
	gf_mem_populate((uint64_t)(uintptr_t)p, total, false);
	t->src = p;
	t->src_len = total ? total : 1;
	t->src_ino = ino;
	t->src_n = mf->nallocs;
	return (uint64_t)(uintptr_t)p;
}

/* Set on a job's own thread: its last phase waits for the loop (set_phase). */
static _Thread_local bool on_job_thread;

static void publish_phase(struct tierd *t, enum tiers_phase to, uint64_t bytes, const char *reason)
{
	pthread_mutex_lock(&t->lock);
	tiers_op_step(&t->op, to, reason, gf_wall_us());
	if (bytes)
		t->op.bytes = bytes;
	pthread_mutex_unlock(&t->lock);
	gf_log(to == TIERS_PHASE_FAILED ? GF_LOG_WARN : GF_LOG_INFO, "gms",
	       "event=operation_phase operation=%s phase=%s reason=\"%s\"", tiers_op_name(t->op.kind),
	       tiers_phase_name(to), reason);
}

/*
 * A job's last phase is published by the loop when it collects the job
 * (tierd_collect()), not by the job's thread: until then the loop has
 * not adopted a restore nor let go of the layout a snapshot held, and a
 * status that said Restored or Checkpointed would be ahead of the GMS.
 */
static void set_phase(struct tierd *t, enum tiers_phase to, uint64_t bytes, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void set_phase(struct tierd *t, enum tiers_phase to, uint64_t bytes, const char *fmt, ...)
{
	char reason[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	bool last = to == TIERS_PHASE_CHECKPOINTED || to == TIERS_PHASE_RESTORED || to == TIERS_PHASE_FAILED;
	if (on_job_thread && last) {
		pthread_mutex_lock(&t->lock);
		t->final_held = true;
		t->final_phase = to;
		t->final_bytes = bytes;
		snprintf(t->final_reason, sizeof(t->final_reason), "%s", reason);
		pthread_mutex_unlock(&t->lock);
		return;
	}
	publish_phase(t, to, bytes, reason);
}

/* Begin an operation (Pending); false when one is still running. */
static bool begin(struct tierd *t, enum tiers_op_kind kind, const char *dir)
{
	pthread_mutex_lock(&t->lock);
	bool ok = tiers_op_begin(&t->op, kind, gf_wall_us());
	if (ok)
		snprintf(t->op_dir, sizeof(t->op_dir), "%s", dir ? dir : "");
	pthread_mutex_unlock(&t->lock);
	return ok;
}

static void reprobe(struct tierd *t)
{
	for (int i = TIER_WARM; i <= TIER_COLD; i++) {
		struct tiers_snap_probe p;
		memset(&p, 0, sizeof(p));
		if (t->dir[i])
			tiers_snapshot_probe(t->dir[i], &p);
		pthread_mutex_lock(&t->lock);
		t->probe[i] = p;
		pthread_mutex_unlock(&t->lock);
	}
}

int tierd_new(struct tierd **out, int kind, int device)
{
	struct tierd *t = calloc(1, sizeof(*t));
	if (!t)
		return gf_err(GF_ERR_NOMEM, "tiers: out of memory");
	int rc = gf_mem_open(&t->m, kind, device);
	if (rc < 0) {
		free(t);
		return rc;
	}
	t->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (t->efd < 0) {
		rc = gf_err_errno(GF_ERR_IO, errno, "tiers: eventfd");
		gf_mem_free(t->m);
		free(t);
		return rc;
	}
	pthread_mutex_init(&t->lock, NULL);
	*out = t;
	return 0;
}

void tierd_wait(struct tierd *t)
{
	if (t->running) {
		pthread_join(t->thread, NULL);
		t->running = false;
	}
}

void tierd_free(struct tierd *t)
{
	if (!t)
		return;
	tierd_wait(t);
	if (t->res_mf)
		tiers_snapshot_restored_free(t->res_mf, t->res_allocs);
	release_source(t);
	for (int i = 0; i < 3; i++)
		free(t->dir[i]);
	close(t->efd);
	pthread_mutex_destroy(&t->lock);
	gf_mem_free(t->m);
	free(t);
}

int tierd_set_dirs(struct tierd *t, const char *warm, const char *cold)
{
	if (t->running)
		return gf_err(GF_ERR_BUSY, "tiers: a snapshot is being written");
	char *w = warm && *warm ? strdup(warm) : NULL, *c = cold && *cold ? strdup(cold) : NULL;
	if ((warm && *warm && !w) || (cold && *cold && !c)) {
		free(w);
		free(c);
		return gf_err(GF_ERR_NOMEM, "tiers: out of memory");
	}
	free(t->dir[TIER_WARM]);
	free(t->dir[TIER_COLD]);
	t->dir[TIER_WARM] = w;
	t->dir[TIER_COLD] = c;
	reprobe(t);
	return 0;
}

const char *tierd_dir(const struct tierd *t, enum tier tier)
{
	return tier == TIER_WARM || tier == TIER_COLD ? t->dir[tier] : NULL;
}

int tierd_get_fd(const struct tierd *t)
{
	return t->efd;
}

bool tierd_busy(struct tierd *t)
{
	return t->running;
}

/* Free bytes in @dir's file system, or its parent's while it does not exist yet (0 when neither can be asked). */
uint64_t tier_fs_free(const char *dir)
{
	struct statvfs v;
	char parent[4096];
	if (statvfs(dir, &v) != 0) {
		snprintf(parent, sizeof(parent), "%s", dir);
		char *slash = strrchr(parent, '/');
		if (slash == parent)
			slash[1] = 0;
		else if (slash)
			*slash = 0;
		else
			snprintf(parent, sizeof(parent), ".");
		if (statvfs(parent, &v) != 0)
			return 0;
	}
	return (uint64_t)v.f_bavail * v.f_frsize;
}

void tier_place_facts(const char *warm, const char *cold, const uint8_t hash[16], uint64_t bytes,
		      struct tiers_place_in *in)
{
	struct tiers_snap_probe p;
	memset(&p, 0, sizeof(p));
	if (warm)
		tiers_snapshot_probe(warm, &p);
	*in = (struct tiers_place_in){
		.bytes = bytes,
		.warm_kept = warm != NULL,
		.cold_kept = cold != NULL,
		.warm_current = p.present && !memcmp(p.layout_hash, hash, 16),
		.warm_free = warm ? tier_fs_free(warm) : 0,
		.warm_other = p.present && memcmp(p.layout_hash, hash, 16) != 0,
		.warm_other_bytes = p.bytes,
	};
}

/* Before writing to WARM: where the snapshot goes (tier_place()); WARM's older snapshot is evicted when told. */
static void place(struct tierd *t, const struct tiers_manifest *mf, struct tiers_place_out *out)
{
	uint64_t bytes = 0;
	for (size_t i = 0; i < mf->nallocs; i++)
		bytes += mf->allocs[i].size;
	struct tiers_place_in in;
	tier_place_facts(t->dir[TIER_WARM], t->dir[TIER_COLD], mf->layout_hash, bytes, &in);
	tier_place(&in, out);
	if (!out->evict_warm)
		return;
	gf_log(GF_LOG_INFO, "gms", "tier=warm msg=\"evicting the older snapshot\" reason=\"%s\" bytes=%" PRIu64
				  " needed=%" PRIu64 " free=%" PRIu64, out->reason, in.warm_other_bytes, bytes, in.warm_free);
	if (tiers_snapshot_remove(t->dir[TIER_WARM]) < 0)
		gf_log(GF_LOG_WARN, "gms", "tier=warm msg=\"eviction failed\" reason=\"%s\"", gf_error_detail());
}

static void *job_main(void *arg)
{
	struct tierd *t = arg;
	on_job_thread = true;
	struct tiers_manifest *mf = t->job_mf;
	gf_mem_alloc **allocs = calloc(mf->nallocs ? mf->nallocs : 1, sizeof(*allocs));
	int rc = allocs ? 0 : gf_err(GF_ERR_NOMEM, "tiers: out of memory");
	set_phase(t, TIERS_PHASE_CHECKPOINTING, 0, "writing %" PRIu64 " bytes in %zu allocations", mf->total_bytes,
		  mf->nallocs);
	for (size_t i = 0; rc == 0 && i < mf->nallocs; i++)
		rc = gf_mem_import(&allocs[i], t->m, t->job_fds[i], mf->allocs[i].size);
	/* The same memfds in the same order (the committed bytes are sealed): the kept source is this layout's. */
	uint64_t src = (uint64_t)(uintptr_t)t->src;
	if (rc == 0 && !same_source(t, t->job_fds, mf->nallocs)) {
		release_source(t);
		src = keep_source(t, mf, t->job_fds);
	}
	const char *targets[2] = { t->job_dir, NULL };
	struct tiers_place_out pl = { .write_warm = true, .reason = "" };
	bool to_warm = t->dir[TIER_WARM] && (!t->job_dir || !strcmp(t->job_dir, t->dir[TIER_WARM]));
	if (rc == 0 && to_warm)
		place(t, mf, &pl);
	if (!t->job_dir) {
		/* WARM first, then COLD; a full WARM spills to COLD alone. */
		int n = 0;
		if (t->dir[TIER_WARM] && pl.write_warm)
			targets[n++] = t->dir[TIER_WARM];
		if (t->dir[TIER_COLD])
			targets[n++] = t->dir[TIER_COLD];
		if (n == 0)
			rc = gf_err(GF_ERR_IO, "snapshot: %s", pl.reason);
	}
	struct tiers_snap_stats st = { 0 };
	int64_t us = 0;
	for (int i = 0; rc == 0 && i < 2 && targets[i]; i++) {
		rc = tiers_snapshot_write_from(targets[i], t->m, mf, allocs, src, &st);
		us += st.elapsed_us;
	}
	bool placed = to_warm && strcmp(pl.reason, "warm has room") != 0;
	if (rc == 0)
		set_phase(t, TIERS_PHASE_CHECKPOINTED, mf->total_bytes, "generation %" PRIu64 " written to %s%s%s in %.3f s%s%s",
			  mf->generation, targets[0], targets[1] ? " and " : "", targets[1] ? targets[1] : "", us / 1e6,
			  placed ? "; " : "", placed ? pl.reason : "");
	else
		set_phase(t, TIERS_PHASE_FAILED, 0, "%s", gf_error_detail());
	for (size_t i = 0; allocs && i < mf->nallocs; i++)
		gf_mem_alloc_free(allocs[i]);
	free(allocs);
	for (size_t i = 0; i < mf->nallocs; i++)
		gf_close(t->job_fds[i]);
	free(t->job_fds);
	tiers_manifest_free(mf);
	free(t->job_dir);
	t->job_fds = NULL;
	t->job_mf = NULL;
	t->job_dir = NULL;
	reprobe(t);
	uint64_t one = 1;
	if (write(t->efd, &one, sizeof(one)) < 0)
		gf_log(GF_LOG_WARN, "gms", "msg=\"tiers: cannot signal the end of a snapshot\"");
	return NULL;
}

int tierd_snapshot_start(struct tierd *t, const char *dir, struct tiers_manifest *mf, int *fds)
{
	int rc = 0;
	if (t->running)
		rc = gf_err(GF_ERR_BUSY, "tiers: a snapshot is already being written");
	else if (!dir && !t->dir[TIER_WARM] && !t->dir[TIER_COLD])
		rc = gf_err(GF_ERR_INVALID_ARG, "tiers: no directory given and no WARM or COLD directory kept");
	else if (!begin(t, TIERS_OP_SNAPSHOT, dir ? dir : t->dir[TIER_WARM] ? t->dir[TIER_WARM] : t->dir[TIER_COLD]))
		rc = gf_err(GF_ERR_BUSY, "tiers: another operation is running");
	if (rc == 0) {
		t->job_dir = dir ? strdup(dir) : NULL;
		t->job_mf = mf;
		t->job_fds = fds;
		if (dir && !t->job_dir)
			rc = gf_err(GF_ERR_NOMEM, "tiers: out of memory");
		else if (pthread_create(&t->thread, NULL, job_main, t) != 0)
			rc = gf_err(GF_ERR_NOMEM, "tiers: cannot start the snapshot thread");
		if (rc < 0) {
			free(t->job_dir);
			t->job_dir = NULL;
			t->job_mf = NULL;
			t->job_fds = NULL;
			set_phase(t, TIERS_PHASE_FAILED, 0, "%s", gf_error_detail());
		}
	}
	if (rc < 0) {
		for (size_t i = 0; i < mf->nallocs; i++)
			gf_close(fds[i]);
		free(fds);
		tiers_manifest_free(mf);
		return rc;
	}
	t->running = true;
	return 0;
}

bool tierd_collect(struct tierd *t)
{
	uint64_t n;
	if (read(t->efd, &n, sizeof(n)) != sizeof(n))
		return false;
	tierd_wait(t);
	pthread_mutex_lock(&t->lock);
	bool held = t->final_held;
	enum tiers_phase to = t->final_phase;
	uint64_t bytes = t->final_bytes;
	char reason[sizeof(t->final_reason)];
	memcpy(reason, t->final_reason, sizeof(reason));
	t->final_held = false;
	pthread_mutex_unlock(&t->lock);
	if (held)
		publish_phase(t, to, bytes, reason);
	return true;
}

static int restore_run(struct tierd *t, const char *dir, gf_mem *m, struct tiers_manifest **mf_out,
		       gf_mem_alloc ***allocs_out, enum tier *from)
{
	const char *cands[2];
	enum tier tiers[2];
	int n = 0;
	if (dir) {
		cands[n] = dir;
		tiers[n++] = TIER_LOADER; /* an explicit directory belongs to no kept tier */
	} else {
		reprobe(t);
		/* Best first: WARM, then COLD (tier_restore_source's order). */
		for (int i = TIER_WARM; i <= TIER_COLD; i++) {
			struct tiers_snap_probe p;
			tierd_probe(t, (enum tier)i, &p);
			if (p.present) {
				cands[n] = t->dir[i];
				tiers[n++] = (enum tier)i;
			}
		}
		if (n == 0)
			return gf_err(GF_ERR_NOT_FOUND, "tiers: no usable snapshot in WARM (%s) or COLD (%s): wait for the loader",
				      t->dir[TIER_WARM] ? t->dir[TIER_WARM] : "not kept",
				      t->dir[TIER_COLD] ? t->dir[TIER_COLD] : "not kept");
	}
	if (!begin(t, TIERS_OP_RESTORE, cands[0]))
		return gf_err(GF_ERR_BUSY, "tiers: another operation is running");
	set_phase(t, TIERS_PHASE_RESTORING, 0, "from %s", cands[0]);
	char refused[256] = "";
	int rc = 0;
	for (int i = 0; i < n; i++) {
		struct tiers_snap_stats st = { 0 };
		rc = tiers_snapshot_restore(cands[i], m, mf_out, allocs_out, &st);
		if (rc == 0) {
			if (from)
				*from = tiers[i];
			set_phase(t, TIERS_PHASE_RESTORED, st.bytes, "generation %" PRIu64 " from %s%s in %.3f s%s%s",
				  (*mf_out)->generation, cands[i], i ? " (fallback)" : "", st.elapsed_us / 1e6,
				  *refused ? "; refused before: " : "", refused);
			return 0;
		}
		snprintf(refused, sizeof(refused), "%s", gf_error_detail());
		gf_log(GF_LOG_WARN, "gms", "snapshot=%s msg=\"restore refused\" reason=\"%s\"", cands[i], refused);
	}
	set_phase(t, TIERS_PHASE_FAILED, 0, "%s", refused);
	gf_err(rc, "%s", refused);
	return rc;
}

int tierd_restore(struct tierd *t, const char *dir, gf_mem *m, struct tiers_manifest **mf_out,
		  gf_mem_alloc ***allocs_out, enum tier *from)
{
	if (t->running)
		return gf_err(GF_ERR_BUSY, "tiers: a snapshot or restore job is running");
	return restore_run(t, dir, m, mf_out, allocs_out, from);
}

static void *restore_main(void *arg)
{
	struct tierd *t = arg;
	on_job_thread = true;
	t->res_rc = restore_run(t, t->job_dir, t->m, &t->res_mf, &t->res_allocs, &t->res_from);
	if (t->res_rc < 0) {
		snprintf(t->res_detail, sizeof(t->res_detail), "%s", gf_error_detail());
		t->res_mf = NULL;
		t->res_allocs = NULL;
	}
	free(t->job_dir);
	t->job_dir = NULL;
	uint64_t one = 1;
	if (write(t->efd, &one, sizeof(one)) < 0)
		gf_log(GF_LOG_WARN, "gms", "msg=\"tiers: cannot signal the end of a restore\"");
	return NULL;
}

int tierd_restore_start(struct tierd *t, const char *dir)
{
	if (t->running)
		return gf_err(GF_ERR_BUSY, "tiers: a snapshot or restore job is running");
	t->job_dir = dir ? strdup(dir) : NULL;
	if (dir && !t->job_dir)
		return gf_err(GF_ERR_NOMEM, "tiers: out of memory");
	t->res_rc = 0;
	t->res_mf = NULL;
	t->res_allocs = NULL;
	if (pthread_create(&t->thread, NULL, restore_main, t) != 0) {
		free(t->job_dir);
		t->job_dir = NULL;
		return gf_err(GF_ERR_NOMEM, "tiers: cannot start the restore thread");
	}
	t->job_restore = true;
	t->running = true;
	return 0;
}

bool tierd_restoring(const struct tierd *t)
{
	return t->job_restore;
}

int tierd_restore_result(struct tierd *t, struct tiers_manifest **mf_out, gf_mem_alloc ***allocs_out,
			 enum tier *from)
{
	t->job_restore = false;
	if (t->res_rc < 0)
		return gf_err(t->res_rc, "%s", t->res_detail);
	*mf_out = t->res_mf;
	*allocs_out = t->res_allocs;
	if (from)
		*from = t->res_from;
	t->res_mf = NULL;
	t->res_allocs = NULL;
	return 0;
}

void tierd_op(struct tierd *t, struct tiers_op *out)
{
	pthread_mutex_lock(&t->lock);
	*out = t->op;
	pthread_mutex_unlock(&t->lock);
}

void tierd_probe(struct tierd *t, enum tier tier, struct tiers_snap_probe *out)
{
	pthread_mutex_lock(&t->lock);
	if (tier == TIER_WARM || tier == TIER_COLD)
		*out = t->probe[tier];
	else
		memset(out, 0, sizeof(*out));
	pthread_mutex_unlock(&t->lock);
}

/* Age at the time of asking: probes are refreshed only after jobs, not per status request. */
static double age_seconds(const struct tiers_snap_probe *p)
{
	int64_t ms = gf_wall_us() / 1000 - p->created_unix_ms;
	return p->present && ms > 0 ? ms / 1000.0 : 0;
}

json_t *tierd_status_json(struct tierd *t)
{
	json_t *o = json_object();
	if (!o)
		return NULL;
	int bad = 0;
	for (int i = TIER_WARM; i <= TIER_COLD; i++) {
		struct tiers_snap_probe p;
		tierd_probe(t, (enum tier)i, &p);
		json_t *tj = t->dir[i] ? json_pack("{s:s, s:b, s:I, s:I, s:I, s:f, s:s}", "dir", t->dir[i], "present",
						   p.present, "bytes", (json_int_t)p.bytes, "allocations",
						   (json_int_t)p.allocations, "generation", (json_int_t)p.generation,
						   "age_seconds", age_seconds(&p), "error", p.error)
				       : json_null();
		bad |= json_object_set_new(o, tier_name((enum tier)i), tj);
	}
	struct tiers_op op;
	char dir[512];
	pthread_mutex_lock(&t->lock);
	op = t->op;
	snprintf(dir, sizeof(dir), "%s", t->op_dir);
	pthread_mutex_unlock(&t->lock);
	int64_t end = op.ended_us ? op.ended_us : gf_wall_us();
	json_t *oj = op.phase == TIERS_PHASE_NONE
			     ? json_null()
			     : json_pack("{s:s, s:s, s:s, s:s, s:I, s:f}", "kind", tiers_op_name(op.kind), "phase",
					 tiers_phase_name(op.phase), "reason", op.reason, "dir", dir, "bytes",
					 (json_int_t)op.bytes, "seconds", (end - op.started_us) / 1e6);
	bad |= json_object_set_new(o, "operation", oj);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static void add(char *buf, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
	if (*len >= cap)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
	va_end(ap);
	*len = n < 0 ? *len : *len + (size_t)n > cap ? cap : *len + (size_t)n;
}

void tierd_metrics(struct tierd *t, char *buf, size_t cap, size_t *len)
{
	add(buf, cap, len, "# HELP gf_gms_tier_present Whether the tier holds a usable snapshot.\n"
			   "# TYPE gf_gms_tier_present gauge\n");
	struct tiers_snap_probe p[3];
	for (int i = TIER_WARM; i <= TIER_COLD; i++) {
		tierd_probe(t, (enum tier)i, &p[i]);
		if (t->dir[i])
			add(buf, cap, len, "gf_gms_tier_present{tier=\"%s\"} %d\n", tier_name((enum tier)i), p[i].present);
	}
	add(buf, cap, len, "# HELP gf_gms_tier_bytes Size of the tier's snapshot.\n# TYPE gf_gms_tier_bytes gauge\n");
	for (int i = TIER_WARM; i <= TIER_COLD; i++)
		if (t->dir[i])
			add(buf, cap, len, "gf_gms_tier_bytes{tier=\"%s\"} %" PRIu64 "\n", tier_name((enum tier)i),
			    p[i].bytes);
	add(buf, cap, len, "# HELP gf_gms_tier_age_seconds Age of the tier's snapshot.\n"
			   "# TYPE gf_gms_tier_age_seconds gauge\n");
	for (int i = TIER_WARM; i <= TIER_COLD; i++)
		if (t->dir[i])
			add(buf, cap, len, "gf_gms_tier_age_seconds{tier=\"%s\"} %.3f\n", tier_name((enum tier)i),
			    age_seconds(&p[i]));
	struct tiers_op op;
	tierd_op(t, &op);
	if (op.phase == TIERS_PHASE_NONE)
		return;
	add(buf, cap, len, "# HELP gf_gms_operation_phase Phase of the current or last snapshot or restore (1 = current).\n"
			   "# TYPE gf_gms_operation_phase gauge\n");
	for (int ph = TIERS_PHASE_PENDING; ph <= TIERS_PHASE_FAILED; ph++)
		add(buf, cap, len, "gf_gms_operation_phase{operation=\"%s\",phase=\"%s\"} %d\n", tiers_op_name(op.kind),
		    tiers_phase_name((enum tiers_phase)ph), op.phase == (enum tiers_phase)ph);
	int64_t end = op.ended_us ? op.ended_us : gf_wall_us();
	add(buf, cap, len, "# HELP gf_gms_operation_bytes Bytes moved by the last completed operation.\n"
			   "# TYPE gf_gms_operation_bytes gauge\ngf_gms_operation_bytes %" PRIu64 "\n"
			   "# HELP gf_gms_operation_seconds Duration of the current or last operation.\n"
			   "# TYPE gf_gms_operation_seconds gauge\ngf_gms_operation_seconds %.6f\n",
	    op.bytes, (end - op.started_us) / 1e6);
}
