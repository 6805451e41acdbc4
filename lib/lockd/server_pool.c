/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock server's standby pool at work (pool.c has the rule): what each
 * engine declared, when each was last Active, the evictions a newcomer
 * causes, and the pool's part of the status.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server_int.h"

static struct seen *seen_find(gf_lockd *d, const char *id)
{
	for (size_t i = 0; i < d->nseen; i++)
		if (!strcmp(d->seen[i].id, id))
			return &d->seen[i];
	return NULL;
}

/* The start time of process @pid (clock ticks since boot, /proc/PID/stat
 * field 22), or 0: with the pid it names one process for good. */
static uint64_t proc_start_time(uint32_t pid)
{
	char path[32], buf[1024];
	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* The command name may hold spaces and parentheses: count from its last ')'. */
	char *p = strrchr(buf, ')');
	for (int field = 2; p && field < 22; field++)
		p = strchr(p + 1, ' ');
	return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* @c is Active now (granted) or was until now (its grant ends). */
void lockd_pool_active_now(gf_lockd *d, struct conn *c)
{
	int64_t now = gf_wall_us();
	c->last_active_us = now;
	struct seen *e = seen_find(d, c->peer->id);
	if (!e) {
		if (!d->seen && !(d->seen = calloc(SEEN_MAX, sizeof(*d->seen))))
			return; /* the LRU order then only knows live connections */
		if (d->nseen < SEEN_MAX) {
			e = &d->seen[d->nseen++];
		} else {
			e = &d->seen[0];
			for (size_t i = 1; i < d->nseen; i++)
				if (d->seen[i].last_active_us < e->last_active_us)
					e = &d->seen[i];
		}
		snprintf(e->id, sizeof(e->id), "%s", c->peer->id);
	}
	e->last_active_us = now;
	e->pid = c->peer->pid;
	e->proc_start = c->proc_start;
}

/* Take the acquire's declaration; GF_ERR_INVALID_ARG (detail set) when it is malformed. */
int lockd_pool_take_decl(gf_lockd *d, struct conn *c, const gf_LockAcquire *a)
{
	(void)d;
	struct gf_pool_decl tmp;
	int rc = gf_pool_decl_from_acquire(a, &tmp);
	if (rc < 0)
		return rc;
	c->reports_serving = a->reports_serving;
	c->takes_next = a->takes_next;
	/* Only a holder reclaiming its grant already serves. */
	c->serving = a->serving && a->session_token.size > 0;
	/* A pinned standby is never evicted, so the next one on its GPU is:
	 * pinning is the operator's decision, not any allowed engine's. */
	if (tmp.pinned && !lockd_is_admin(c->peer)) {
		gf_log(GF_LOG_WARN, "lock", "msg=\"pin refused: not an admin uid\" id=%.127s uid=%u", a->engine_id,
		       c->peer->uid);
		return gf_err(GF_ERR_PERMISSION, "acquire: only root or the server's own uid may pin a standby");
	}
	bool empty = !tmp.ngpus && !tmp.pinned && !tmp.model[0] && !tmp.wake_bytes && !tmp.asleep_bytes;
	if (empty) {
		free(c->decl);
		c->decl = NULL;
		return 0;
	}
	if (!c->decl && !(c->decl = malloc(sizeof(*c->decl))))
		return gf_err(GF_ERR_NOMEM, "acquire: out of memory for the engine's declaration");
	*c->decl = tmp;
	return 0;
}

/* A new standby joined the FIFO: keep every GPU it declared within budget. */
void lockd_pool_registered(gf_lockd *d, struct conn *c)
{
	c->since_mono = gf_now_us();
	/* An id is a name anyone may give: its past counts only for the process
	 * that was Active under it (a unix peer: pid and start time, which no
	 * other process can have; a TCP peer proves neither), or registering
	 * under a recently Active engine's id would shield a newcomer and evict
	 * an older standby in its place. Read here, not at the grant: a
	 * failover does not wait on /proc. */
	if (!c->peer->tcp && c->peer->pid && !c->proc_start)
		c->proc_start = proc_start_time(c->peer->pid);
	struct seen *e = seen_find(d, c->peer->id);
	bool same = e && e->proc_start && e->proc_start == c->proc_start && e->pid == c->peer->pid;
	c->last_active_us = same ? e->last_active_us : 0;
	if (d->pool.max_standby_per_gpu == 0)
		return;
	if (!c->decl || !c->decl->ngpus) {
		/* The budget is per GPU UUID: engines on the host backend (HOST-…
		 * device ids) declare none unless told, and would escape it silently. */
		if (!d->warned_no_gpu)
			gf_log(GF_LOG_WARN, "lock",
			       "msg=\"a standby declared no GPU: the standby budget does not apply to it (engines on the host backend declare none unless given --gpu / gf_engine_set_gpus)\" id=%s pid=%u budget=%u",
			       c->peer->id, c->peer->pid, d->pool.max_standby_per_gpu);
		d->warned_no_gpu = true;
		return;
	}
	/* The common case, every GPU within budget, costs one pass and no allocation. */
	bool over = false;
	for (size_t g = 0; g < c->decl->ngpus && !over; g++) {
		uint32_t count = 0;
		for (struct conn *w = d->whead; w && !over; w = w->wnext)
			over = gf_pool_on_gpu(w->decl, c->decl->gpus[g]) && ++count > d->pool.max_standby_per_gpu;
	}
	if (!over)
		return;
	/* The newcomer itself may be evicted (and its declaration freed): keep what the log lines need. */
	const struct gf_pool_decl nd = *c->decl;
	char nid[GF_LOCK_ID_MAX];
	snprintf(nid, sizeof(nid), "%s", c->peer->id);
	struct gf_pool_member *m = malloc(d->nwaiters * sizeof(*m));
	struct conn **who = malloc(d->nwaiters * sizeof(*who));
	size_t *victims = malloc(d->nwaiters * sizeof(*victims));
	if (!m || !who || !victims) {
		gf_log(GF_LOG_ERR, "lock", "msg=\"out of memory: standby budget not enforced\" id=%s", nid);
		goto out;
	}
	size_t n = 0, self = 0;
	for (struct conn *w = d->whead; w; w = w->wnext) {
		if (w == c)
			self = n;
		who[n] = w;
		m[n++] = (struct gf_pool_member){ .decl = w->decl, .since_us = w->since_mono,
						  .last_active_us = w->last_active_us };
	}
	size_t short_by;
	size_t nv = gf_pool_choose_evictions(m, n, self, &d->pool, c->since_mono, victims, n, &short_by);
	for (size_t i = 0; i < nv; i++) {
		struct conn *v = who[victims[i]];
		char det[400];
		const char *gpu = "?";
		for (size_t g = 0; g < nd.ngpus; g++)
			if (gf_pool_on_gpu(v->decl, nd.gpus[g])) {
				gpu = nd.gpus[g];
				break;
			}
		snprintf(det, sizeof(det),
			 "evicted from the standby pool: GPU %s was over its budget of %u standbys when %.127s registered; "
			 "this engine was the least recently Active there (last_active_us=%lld)",
			 gpu, d->pool.max_standby_per_gpu, nid, (long long)v->last_active_us);
		gf_log(GF_LOG_WARN, "lock",
		       "msg=\"evicted\" id=%s pid=%u gpu=%s last_active_us=%lld budget=%u newcomer=%s reason=\"least recently Active standby over the GPU's budget\"",
		       v->peer->id, v->peer->pid, gpu, (long long)v->last_active_us, d->pool.max_standby_per_gpu, nid);
		d->evicted++;
		lockd_waiter_unlink(d, v);
		lockd_reply_error(d, v, GF_ERR_EVICTED, det, true);
	}
	if (short_by) {
		d->over_budget++;
		gf_log(GF_LOG_WARN, "lock",
		       "msg=\"standby budget exceeded: nothing evictable (holder, pinned or younger than min_standby_age)\" id=%s over_by=%zu budget=%u",
		       nid, short_by, d->pool.max_standby_per_gpu);
	}
out:
	free(m);
	free(who);
	free(victims);
}

struct pool_slot {
	const char *uuid;
	const struct gf_pool_decl *decl;
	bool holder;
};

static int slot_cmp(const void *a, const void *b)
{
	return strcmp(((const struct pool_slot *)a)->uuid, ((const struct pool_slot *)b)->uuid);
}

static size_t add_slots(struct pool_slot *sl, size_t k, const struct conn *c, bool holder)
{
	for (size_t g = 0; c->decl && g < c->decl->ngpus; g++)
		sl[k++] = (struct pool_slot){ c->decl->gpus[g], c->decl, holder };
	return k;
}

/*
 * Per GPU, sorted by UUID: every (GPU, engine) pair sorted once, then folded,
 * so 1,000 standbys on 8 GPUs each cost a sort of 8,000 pairs, not a scan of
 * the table per pair (the /metrics scrape runs on the server's loop).
 */
int lockd_pool_gpus(gf_lockd *d, struct pool_gpu **out, size_t *nout)
{
	size_t ns = d->holder && d->holder->decl ? d->holder->decl->ngpus : 0;
	for (struct conn *w = d->whead; w; w = w->wnext)
		ns += w->decl ? w->decl->ngpus : 0;
	struct pool_slot *sl = malloc((ns ? ns : 1) * sizeof(*sl));
	struct pool_gpu *t = calloc(ns ? ns : 1, sizeof(*t));
	if (!sl || !t) {
		free(sl);
		free(t);
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	}
	size_t k = d->holder ? add_slots(sl, 0, d->holder, true) : 0;
	for (struct conn *w = d->whead; w; w = w->wnext)
		k = add_slots(sl, k, w, false);
	qsort(sl, k, sizeof(*sl), slot_cmp);
	size_t n = 0;
	for (size_t i = 0; i < k; i++) {
		if (n == 0 || strcmp(t[n - 1].uuid, sl[i].uuid))
			t[n++].uuid = sl[i].uuid;
		struct pool_gpu *e = &t[n - 1];
		if (sl[i].holder) {
			e->active = true;
			continue;
		}
		e->standbys++;
		/* Declared by each client: the sum saturates rather than wraps. */
		if (__builtin_add_overflow(e->asleep_bytes, sl[i].decl->asleep_bytes, &e->asleep_bytes))
			e->asleep_bytes = UINT64_MAX;
		if (sl[i].decl->wake_bytes > e->wake_bytes_max)
			e->wake_bytes_max = sl[i].decl->wake_bytes;
	}
	free(sl);
	*out = t;
	*nout = n;
	return 0;
}

static void pool_fill_entry(gf_LockWaiter *o, const struct conn *c)
{
	const struct gf_pool_decl *decl = c->decl;
	if (!decl)
		return;
	o->gpus_count = decl->ngpus;
	for (size_t g = 0; g < decl->ngpus; g++)
		memcpy(o->gpus[g], decl->gpus[g], sizeof(o->gpus[g]));
	o->wake_bytes = decl->wake_bytes;
	o->asleep_bytes = decl->asleep_bytes;
	o->pinned = decl->pinned;
	memcpy(o->model, decl->model, sizeof(o->model));
}

void lockd_pool_fill_status(gf_lockd *d, gf_LockStatus *s)
{
	s->max_standby_per_gpu = d->pool.max_standby_per_gpu;
	s->min_standby_age_ms = d->pool.min_standby_age_us / 1000;
	s->evicted = d->evicted;
	s->over_budget = d->over_budget;
	size_t i = 0;
	for (struct conn *w = d->whead; w && i < s->waiters_count; w = w->wnext, i++) {
		pool_fill_entry(&s->waiters[i], w);
		s->waiters[i].last_active_us = w->last_active_us;
		s->waiters[i].pids = (uint32_t)w->npids;
	}
	if (d->holder) {
		gf_LockWaiter *h = &s->holder_info;
		s->has_holder_info = true;
		snprintf(h->engine_id, sizeof(h->engine_id), "%s", d->holder->peer->id);
		h->pid = d->holder->peer->pid;
		h->since_us = d->granted_at_wall;
		h->last_active_us = gf_wall_us();
		h->pids = (uint32_t)d->holder->npids;
		pool_fill_entry(h, d->holder);
	}
	struct pool_gpu *t;
	size_t n;
	if (lockd_pool_gpus(d, &t, &n) < 0)
		return;
	for (size_t g = 0; g < n && s->gpus_count < GF_ARRAY_SIZE(s->gpus); g++) {
		gf_LockGpu *o = &s->gpus[s->gpus_count++];
		snprintf(o->uuid, sizeof(o->uuid), "%s", t[g].uuid);
		o->standbys = t[g].standbys;
		o->asleep_bytes = t[g].asleep_bytes;
		o->wake_bytes_max = t[g].wake_bytes_max;
		o->active = t[g].active;
	}
	free(t);
}
