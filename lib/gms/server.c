/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GMS server's policy on the shared server core (lib/wire/server.h):
 * one device. Owns the allocations (never maps them), the metadata table
 * and the lock FSM (fsm.c). Clients wait in the server with their own
 * timeout; every state change marks the waiters for re-evaluation, which
 * the core's settle step runs in FIFO order.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "mem_int.h"
#include "client_session.h"
#include "fsm.h"
#include "layout.h"
#include "listchunk.h"
#include "metablob.h"
#include "residency.h"
#include "server.h"

#define GMSD_EVENTS GF_LIMIT_EVENTS /* the ring of recent events */
#define GMSD_OOM_RETRY_US 50000
#define FENCE_QUERY_MS 2000 /* the lock server's answer to the fence, off the loop */
#define GMSD_MAX_ALLOCS 65536
#define GMSD_MAX_META 1000000
#define GMSD_CHUNK_ALLOCS GF_LIMIT_CHUNK_ALLOCS
#define GMSD_CHUNK_META GF_LIMIT_CHUNK_META
#define GMSD_RETIRED_MAX 16           /* dropped layouts whose released sleepers are watched */
#define GMSD_PIN_SCAN_US 1000000      /* how often they are looked at */
#define GMSD_PIN_SETTLE_US 1000000    /* a demotion's answer waits this long for them to let go */
#define GMSD_PIN_SETTLE_STEP_US 20000

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
	/* The fence's query of the lock server, off the loop (fence_step()). */
	gf_lock_query *fence_q;
	struct gf_srv_watch fence_w;
	bool fence_passed;      /* the answer came and named this client's grant: grant once */
	/* A waiting RW on a fenced, committed GMS: its admission is asked (the
	 * query in flight checks it, not a grant), or was given. Only an
	 * admitted RW holds new readers back (writer priority). */
	bool fence_admission, fence_admitted;
	bool commit_pending;    /* a writer's commit waits for the fence's answer */
	uint32_t commit_seq;
	/* a GmsSnapshot or GmsDemote request its tiers answer later (0: none) */
	enum gms_residency_wait tier_wait;
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
	/* a successful GmsDemote whose answer waits (up to GMSD_PIN_SETTLE_US)
	 * for the sleepers it released to let go, so the answer's figures are true */
	bool settling;
	int64_t settle_until_us;
};

/*
 * A dropped layout that sleepers released by the drop may still hold
 * (docs/gms.md, "Memory a sleeper still pins"): the GMS freed its own
 * references, but a sleeper that is stopped or hung never lets go of its
 * imported handles. Host backend, exactly: each allocation is known by its
 * memfd's inode, and each released sleeper's /proc/PID/fd and
 * /proc/PID/maps say whether it still holds it. Other backends (cuda: the
 * driver does not say who holds an import), a lower bound: a sleeper none
 * of whose threads has run since its session was closed cannot have let go.
 */
struct pin_holder {
	uint32_t pid;
	char peer[GF_ID_MAX];
	uint64_t bytes;     /* seen held at the last look */
	uint32_t allocs;
	bool reported;      /* its event=still_pinned was logged */
	uint64_t ran0;      /* not exact: its threads' context switches before the drop */
	int ran0_err;       /* ...or why they could not be read */
};

struct retired {
	uint64_t generation;
	int64_t at_unix_ms;
	const char *reason;  /* static: "new_load", "demotion", "abort" */
	bool exact;          /* held allocations are seen (host), else inferred from activity */
	uint64_t bytes;      /* the layout's size and allocations */
	uint32_t allocs;
	dev_t dev;           /* exact: the memfds' file system */
	size_t n;
	struct retired_alloc {
		uint64_t ino, size;
	} *ids;              /* sorted by inode */
	size_t nholders;
	struct pin_holder *h;
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
	struct gms_residency *res;
	struct gf_srv_watch tier_watch;
	/* dropped layouts still held by released sleepers (oldest first) */
	struct retired *retired;
	size_t nretired;
	int64_t pin_next_us;    /* next look at them */
};

/* ---------------------------------------------------------------- events */

static void event(gf_gmsd *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void event(gf_gmsd *d, const char *fmt, ...)
{
	struct gevent *e = &d->events[d->ev_next];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->what, sizeof(e->what), fmt, ap);
	va_end(ap);
	e->at_us = gf_wall_us();
	d->ev_next = (d->ev_next + 1) % GMSD_EVENTS;
	if (d->ev_count < GMSD_EVENTS)
		d->ev_count++;
	gf_log(GF_LOG_INFO, "gms", "%s", e->what);
}

/* ---------------------------------------------------------------- writer progress */

/* The writer did something (or came, or left): waiters by progress wait on from now. */
static void writer_progress(gf_gmsd *d)
{
	d->wmark_us = gf_now_us();
	d->wmark_wall_us = gf_wall_us();
}

static void writer_granted(gf_gmsd *d)
{
	writer_progress(d);
	d->w_granted_wall_us = d->wmark_wall_us;
	d->w_done = d->w_total = 0;
	d->w_reports = 0;
}

/* The writer holding RW, or NULL. */
static struct client *writer_client(gf_gmsd *d);

/* ---------------------------------------------------------------- metadata table */

static uint64_t key_hash(const char *k)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a: short keys, no need for more */
	for (; *k; k++)
		h = (h ^ (uint8_t)*k) * 1099511628211ull;
	return h;
}

/* Enter every metadata entry into the index, which has room (at most half full). */
static void index_fill(gf_gmsd *d)
{
	memset(d->index, 0, d->index_cap * sizeof(*d->index));
	for (size_t i = 0; i < d->nmeta; i++) {
		size_t p = key_hash(d->meta[i].key) & (d->index_cap - 1);
		while (d->index[p])
			p = (p + 1) & (d->index_cap - 1);
		d->index[p] = (uint32_t)(i + 1);
	}
}

static int index_rebuild(gf_gmsd *d, size_t cap)
{
	uint32_t *idx = calloc(cap, sizeof(*idx));
	if (!idx)
		return gf_err(GF_ERR_NOMEM, "metadata index: out of memory");
	free(d->index);
	d->index = idx;
	d->index_cap = cap;
	index_fill(d);
	return 0;
}

static struct gmeta *meta_find(gf_gmsd *d, const char *key)
{
	if (!d->index_cap)
		return NULL;
	size_t p = key_hash(key) & (d->index_cap - 1);
	while (d->index[p]) {
		struct gmeta *m = &d->meta[d->index[p] - 1];
		if (!strcmp(m->key, key))
			return m;
		p = (p + 1) & (d->index_cap - 1);
	}
	return NULL;
}

static struct galloc *alloc_find(gf_gmsd *d, uint64_t id)
{
	/* ids are 1..n in allocation order within one layout */
	if (id == 0 || id > d->nallocs || d->allocs[id - 1].id != id)
		return NULL;
	return &d->allocs[id - 1];
}

static struct client *next_client(gf_gmsd *d, struct client *prev);
static void client_close(gf_gmsd *d, struct client *c, const char *why);

/* ---------------------------------------------------------------- memory a released sleeper still pins */

static int retired_alloc_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct retired_alloc *)a)->ino, y = ((const struct retired_alloc *)b)->ino;
	return x < y ? -1 : x > y;
}

static void retired_free(struct retired *r)
{
	free(r->ids);
	free(r->h);
}

/* Whether the dropped layouts' holders can be seen exactly: the host backend's memfds are files in /proc. */
static bool pins_exact(const gf_gmsd *d)
{
	return d->mem && gf_mem_kind(d->mem) == GF_MEM_HOST;
}

/*
 * Context switches of every thread of process @pid so far, in *@out. A
 * process whose sum has not moved has not run, so it has not let go of
 * anything. GF_ERR_NOT_FOUND when it is gone.
 */
static int task_switches(uint32_t pid, uint64_t *out)
{
	char path[96], line[128];
	if (!pid)
		return gf_err(GF_ERR_NOT_SUPPORTED, "its pid is not visible in the GMS's pid namespace");
	snprintf(path, sizeof(path), "/proc/%u/task", pid);
	DIR *dir = opendir(path);
	if (!dir)
		return errno == ENOENT ? gf_err(GF_ERR_NOT_FOUND, "gone")
				       : gf_err_errno(GF_ERR_PERMISSION, errno, "open %s", path);
	uint64_t sum = 0;
	for (struct dirent *e; (e = readdir(dir));) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%u/task/%.20s/status", pid, e->d_name);
		FILE *f = fopen(path, "re");
		while (f && fgets(line, sizeof(line), f)) {
			unsigned long long v;
			if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1 ||
			    sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1)
				sum += v;
		}
		if (f)
			fclose(f);
	}
	closedir(dir);
	*out = sum;
	return 0;
}

/* Before @d frees the layout: remember its allocations and the sleepers @h released, to watch them let go. */
static void retire(gf_gmsd *d, const char *reason, struct pin_holder *h, size_t nh)
{
	struct retired r = { .generation = d->generation, .at_unix_ms = gf_wall_us() / 1000, .reason = reason,
			     .h = h, .nholders = nh, .exact = pins_exact(d), .bytes = d->alloc_bytes,
			     .allocs = (uint32_t)d->nallocs };
	if (!d->nallocs || (r.exact && !(r.ids = calloc(d->nallocs, sizeof(*r.ids))))) {
		retired_free(&r);
		return;
	}
	for (size_t i = 0; r.exact && i < d->nallocs; i++) {
		int fd;
		bool owned;
		struct stat st;
		if (gf_mem_export_borrowed(d->allocs[i].a, &fd, &owned) < 0)
			continue;
		if (fstat(fd, &st) == 0) {
			r.dev = st.st_dev;
			r.ids[r.n++] = (struct retired_alloc){ (uint64_t)st.st_ino, d->allocs[i].size };
		}
		if (owned)
			gf_close(fd);
	}
	if (r.n)
		qsort(r.ids, r.n, sizeof(*r.ids), retired_alloc_cmp);
	if (d->nretired == GMSD_RETIRED_MAX) {
		/* Bounded: the oldest record stops being watched, and says so. */
		event(d, "event=pins_untracked generation=%llu holders=%zu reason=\"more than %d dropped layouts watched\"",
		      (unsigned long long)d->retired[0].generation, d->retired[0].nholders, GMSD_RETIRED_MAX);
		retired_free(&d->retired[0]);
		memmove(d->retired, d->retired + 1, (d->nretired - 1) * sizeof(*d->retired));
		d->nretired--;
	}
	struct retired *n = realloc(d->retired, (d->nretired + 1) * sizeof(*n));
	if (!n) {
		retired_free(&r);
		return;
	}
	d->retired = n;
	d->retired[d->nretired++] = r;
	/* A sleeper that works lets go within milliseconds of its hangup: look then. */
	d->pin_next_us = gf_now_us() + GMSD_PIN_SETTLE_STEP_US;
}

static void mark_held(const struct retired *r, uint64_t ino, bool *seen)
{
	struct retired_alloc key = { .ino = ino };
	const struct retired_alloc *a = bsearch(&key, r->ids, r->n, sizeof(*r->ids), retired_alloc_cmp);
	if (a)
		seen[a - r->ids] = true;
}

/*
 * What process @h->pid still holds of @r, through an fd or a mapping (a
 * fenced mapping counts: it keeps the pages as much as an fd does): 0 and
 * the figures set, 0 with none when the process is gone, or an error when it
 * cannot be told (no pid in this namespace, /proc not readable).
 */
static int scan_holder(const struct retired *r, struct pin_holder *h)
{
	h->bytes = 0;
	h->allocs = 0;
	if (!h->pid)
		return gf_err(GF_ERR_NOT_SUPPORTED, "its pid is not visible in the GMS's pid namespace");
	if (!r->exact) {
		uint64_t now = 0;
		int rc = h->ran0_err ? h->ran0_err : task_switches(h->pid, &now);
		if (rc == GF_ERR_NOT_FOUND)
			return 0;
		if (rc < 0)
			return h->ran0_err ? gf_err(rc, "its threads could not be looked at") : rc;
		if (now == h->ran0) {
			h->bytes = r->bytes;
			h->allocs = r->allocs;
		}
		return 0; /* it ran: it may have let go, and is no longer counted */
	}
	char path[64];
	snprintf(path, sizeof(path), "/proc/%u/fd", h->pid);
	int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return errno == ENOENT || errno == ESRCH ? 0 : gf_err_errno(GF_ERR_PERMISSION, errno, "open %s", path);
	bool *seen = calloc(r->n ? r->n : 1, sizeof(*seen));
	DIR *dir = fdopendir(dfd);
	if (!seen || !dir) {
		free(seen);
		if (dir)
			closedir(dir);
		else
			close(dfd);
		return gf_err(GF_ERR_NOMEM, "pins: out of memory");
	}
	for (struct dirent *e; (e = readdir(dir));) {
		struct stat st;
		if (e->d_name[0] != '.' && fstatat(dfd, e->d_name, &st, 0) == 0 && st.st_dev == r->dev)
			mark_held(r, (uint64_t)st.st_ino, seen);
	}
	closedir(dir);
	snprintf(path, sizeof(path), "/proc/%u/maps", h->pid);
	FILE *f = fopen(path, "re");
	char line[512];
	bool line_start = true;
	while (f && fgets(line, sizeof(line), f)) {
		unsigned maj, mnr;
		unsigned long long ino;
		if (line_start && sscanf(line, "%*s %*s %*s %x:%x %llu", &maj, &mnr, &ino) == 3 && ino &&
		    makedev(maj, mnr) == r->dev)
			mark_held(r, ino, seen);
		line_start = strchr(line, '\n') != NULL; /* a long line's rest is not a new mapping */
	}
	if (f)
		fclose(f);
	for (size_t i = 0; i < r->n; i++)
		if (seen[i]) {
			h->bytes += r->ids[i].size;
			h->allocs++;
		}
	free(seen);
	return 0;
}

/* Look at every released sleeper again: forget those that let go (or exited), report those that still hold. */
static void pin_scan(gf_gmsd *d)
{
	int64_t now_ms = gf_wall_us() / 1000;
	for (size_t i = 0; i < d->nretired;) {
		struct retired *r = &d->retired[i];
		for (size_t k = 0; k < r->nholders;) {
			struct pin_holder *h = &r->h[k];
			int rc = scan_holder(r, h);
			if (rc == 0 && h->bytes) {
				if (!h->reported && now_ms - r->at_unix_ms >= GMSD_PIN_SETTLE_US / 1000) {
					h->reported = true;
					event(d, "event=still_pinned pid=%u peer=%s bytes=%llu allocations=%u generation=%llu "
						 "dropped_for=%s", h->pid, h->peer, (unsigned long long)h->bytes, h->allocs,
					      (unsigned long long)r->generation, r->reason);
				}
				k++;
				continue;
			}
			if (rc < 0)
				event(d, "event=pin_unknown pid=%u peer=%s generation=%llu reason=\"%s\"", h->pid, h->peer,
				      (unsigned long long)r->generation, gf_error_detail());
			else if (h->reported)
				event(d, "event=pin_released pid=%u peer=%s generation=%llu", h->pid, h->peer,
				      (unsigned long long)r->generation);
			r->h[k] = r->h[--r->nholders];
		}
		if (r->nholders) {
			i++;
			continue;
		}
		retired_free(r);
		memmove(r, r + 1, (d->nretired - i - 1) * sizeof(*r));
		d->nretired--;
	}
	d->pin_next_us = gf_now_us() + GMSD_PIN_SCAN_US;
}

static uint64_t pinned_bytes(const gf_gmsd *d)
{
	uint64_t b = 0;
	for (size_t i = 0; i < d->nretired; i++)
		for (size_t k = 0; k < d->retired[i].nholders; k++)
			b += d->retired[i].h[k].bytes;
	return b;
}

/* Add @c to the sleepers a drop releases: before its session is closed, so that any run after it shows. */
static void note_holder(gf_gmsd *d, struct pin_holder **h, size_t *n, const struct client *c)
{
	struct pin_holder *g = realloc(*h, (*n + 1) * sizeof(**h));
	if (!g)
		return; /* not watched: the figure is then low, never wrongly high */
	*h = g;
	g[*n] = (struct pin_holder){ .pid = c->pid };
	if (!pins_exact(d))
		g[*n].ran0_err = task_switches(c->pid, &g[*n].ran0);
	snprintf(g[*n].peer, sizeof(g[*n].peer), "%s", c->peer);
	(*n)++;
}

/* Free the layout. @reason ("new_load", "demotion", "abort", NULL at exit) names the drop in the pins it leaves. */
static void drop_layout(gf_gmsd *d, const char *reason)
{
	d->drops++;
	/* Sleeping readers (and wakes that said they kept handles) hold this
	 * layout's memory through their handles: closing their sessions is
	 * what tells them to let go (docs/gms.md, "Sleep and wake"). One that
	 * is stopped or hung does not: the GMS watches them (retire()). */
	struct pin_holder *held = NULL;
	size_t nheld = 0;
	for (struct client *c = d->srv ? next_client(d, NULL) : NULL, *n; c; c = n) {
		n = next_client(d, c);
		if (c->parked || (c->phase == C_WAIT && c->handles_kept)) {
			event(d, "event=sleeper_released peer=%s pid=%u reason=layout_dropped", c->peer, c->pid);
			note_holder(d, &held, &nheld, c);
			client_close(d, c, "layout dropped: a sleeping reader lets go of its handles");
		}
	}
	if (nheld && reason)
		retire(d, reason, held, nheld);
	else
		free(held);
	for (size_t i = 0; i < d->nallocs; i++)
		gf_mem_alloc_free(d->allocs[i].a); /* importers keep the memory alive (driver refcount) */
	for (size_t i = 0; i < d->nmeta; i++) {
		free(d->meta[i].key);
		free(d->meta[i].value);
	}
	gf_close(d->mblob_fd);
	d->mblob_fd = -1;
	d->nallocs = 0;
	d->nmeta = 0;
	d->alloc_bytes = 0;
	d->next_alloc_id = 1;
	if (d->index)
		memset(d->index, 0, d->index_cap * sizeof(*d->index));
	memset(d->hash, 0, sizeof(d->hash));
}

/* ---------------------------------------------------------------- replies */

static struct client *writer_client(gf_gmsd *d)
{
	for (struct client *c = next_client(d, NULL); c; c = next_client(d, c))
		if (c->phase == C_WRITER || c->phase == C_ALLOC_WAIT)
			return c;
	return NULL;
}

/* Open peers that finished the handshake, in no particular order: first with NULL. */
static struct client *next_client(gf_gmsd *d, struct client *prev)
{
	struct gf_srv_peer *p = prev ? prev->p : NULL;
	while ((p = gf_srv_next_peer(d->srv, p)))
		if (p->ready)
			return p->data;
	return NULL;
}

static void client_close(gf_gmsd *d, struct client *c, const char *why)
{
	gf_srv_close(d->srv, c->p, why);
}

/* Send d->out; a peer that does not take it within the core's send deadline is closed. */
static int send_msg(gf_gmsd *d, struct client *c, const int *fds, size_t nfds)
{
	return gf_srv_send(d->srv, c->p, d->out, fds, nfds);
}

static int reply_error(gf_gmsd *d, struct client *c, uint32_t seq, int code, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static int reply_error(gf_gmsd *d, struct client *c, uint32_t seq, int code, const char *fmt, ...)
{
	char detail[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = seq;
	gf_msg_set_error(d->out, code, detail);
	gf_log(GF_LOG_DEBUG, "gms", "error to peer=%s code=%s detail=\"%s\"", c->peer, gf_error_name(code),
	       detail);
	return send_msg(d, c, NULL, 0);
}

static void fill_connected(gf_gmsd *d, gf_GmsConnected *g, int granted)
{
	g->granted = (gf_GmsMode)granted;
	g->state = (gf_GmsState)d->fsm.state;
	g->generation = d->generation;
	if (d->fsm.state == GMS_COMMITTED || d->fsm.state == GMS_RO) {
		memcpy(g->layout_hash.bytes, d->hash, 16);
		g->layout_hash.size = 16;
	}
	snprintf(g->backend, sizeof(g->backend), "%s", gf_mem_kind_name(gf_mem_kind(d->mem)));
	g->device = (uint32_t)d->device;
	snprintf(g->device_uuid, sizeof(g->device_uuid), "%s", d->uuid);
	g->granularity = d->granularity;
	g->oom_retry_ms = d->oom_retry_ms;
	g->takes_progress = true;
}

/* ---------------------------------------------------------------- waiting */

static bool other_rw_waiting(gf_gmsd *d, struct client *self)
{
	/* A fenced GMS with a committed layout: an RW not proven the holder's
	 * yet must not keep readers out (a stray writer would, until its timeout). */
	bool proven_only = d->lock_uri && gms_fsm_rw_would_drop(&d->fsm);
	for (struct client *c = next_client(d, NULL); c; c = next_client(d, c))
		if (c != self && c->phase == C_WAIT && c->mode == GMS_MODE_RW && (!proven_only || c->fence_admitted))
			return true;
	return false;
}

/*
 * A GMS fenced by a lock drops its committed layout only for the lock's
 * current holder, proven by the fence proof of its grant (gf_lock_grant_proof()):
 * the epoch alone is public. The lock server is asked each time (a drop is
 * rare: a new load replacing the weights), so a refusal is based on the
 * grant as it is now, revocations included. The query runs on a thread of
 * the lock client and its end is an fd in this loop: the other peers are
 * served meanwhile, and the writer waits in its queue position.
 */
static void fence_cancel(gf_gmsd *d, struct client *c)
{
	if (!c->fence_q)
		return;
	gf_srv_watch_del(d->srv, gf_lock_query_get_fd(c->fence_q));
	gf_lock_query_free(c->fence_q);
	c->fence_q = NULL;
}

static void fence_refuse(gf_gmsd *d, struct client *c, uint64_t current)
{
	d->fence_refusals++;
	event(d, "event=rw_refused peer=%s pid=%u epoch=%llu lock_epoch=%llu", c->peer, c->pid,
	      (unsigned long long)c->lock_epoch, (unsigned long long)current);
	c->phase = C_IDLE;
	/* A leaving RW waiter may unblock readers (writer priority). */
	d->changed = true;
}

static void do_commit(gf_gmsd *d, struct client *c, uint32_t seq);

/*
 * The fence holds at commit too: a writer that came with a lock grant
 * commits only while that grant is still the lock's current one, so a writer
 * revoked mid-load cannot publish its layout. Refused, its load is abandoned
 * as if it had left (the layout dropped), and its session stays.
 */
static void commit_fenced(gf_gmsd *d, struct client *c, int rc, const struct gf_lock_holder *h)
{
	if (rc == 0 && h->epoch == c->lock_epoch && h->proof_valid) {
		do_commit(d, c, c->commit_seq);
		return;
	}
	if (rc < 0)
		reply_error(d, c, c->commit_seq, GF_ERR_UNREACHABLE, "commit: the lock server (%s) did not confirm the "
			    "writer's grant: %s; the load is abandoned", d->lock_uri, gf_error_detail());
	else
		reply_error(d, c, c->commit_seq, GF_ERR_PERMISSION, "commit: the writer's lock grant (epoch %llu%s) is "
			    "not the lock's current one (epoch %llu); the load is abandoned",
			    (unsigned long long)c->lock_epoch, c->lock_proof.epoch ? "" : ", without a proof",
			    (unsigned long long)h->epoch);
	d->fence_refusals++;
	event(d, "event=commit_refused peer=%s pid=%u epoch=%llu lock_epoch=%llu allocations=%zu", c->peer, c->pid,
	      (unsigned long long)c->lock_epoch, rc == 0 ? (unsigned long long)h->epoch : 0ull, d->nallocs);
	gms_fsm_writer_left(&d->fsm);
	drop_layout(d, "abort");
	c->phase = C_IDLE;
	writer_progress(d); /* no writer from now on */
	d->changed = true;
}

static void on_fence_answer(void *ctx, struct gf_srv_watch *w)
{
	gf_gmsd *d = ctx;
	struct client *c = (struct client *)((char *)w - offsetof(struct client, fence_w));
	struct gf_lock_holder h;
	int rc = gf_lock_query_result(c->fence_q, &h);
	if (rc == GF_ERR_AGAIN)
		return;
	fence_cancel(d, c);
	if (c->phase == C_WRITER && c->commit_pending) {
		c->commit_pending = false;
		commit_fenced(d, c, rc, &h);
		return;
	}
	if (c->phase != C_WAIT)
		return;
	bool admission = c->fence_admission;
	c->fence_admission = false;
	if (rc < 0) {
		reply_error(d, c, c->seq, GF_ERR_UNREACHABLE, "RW would drop the committed layout and the lock server "
			    "(%s) did not answer: %s", d->lock_uri, gf_error_detail());
		fence_refuse(d, c, 0);
	} else if (c->lock_epoch == 0 || h.epoch != c->lock_epoch || !h.proof_valid) {
		reply_error(d, c, c->seq, GF_ERR_PERMISSION, "RW would drop the committed layout: only the lock's current "
			    "holder may, with its grant's proof (connect epoch %llu%s, lock epoch %llu%s)",
			    (unsigned long long)c->lock_epoch, c->lock_proof.epoch ? "" : " without a proof",
			    (unsigned long long)h.epoch, h.epoch ? "" : ", no holder");
		fence_refuse(d, c, h.epoch);
	} else {
		/* An admission lets it wait ahead of readers; the grant is asked again. */
		if (admission)
			c->fence_admitted = true;
		else
			c->fence_passed = true;
		d->changed = true;
	}
}

/* Ask the lock server whether @c's grant is the current one; on_fence_answer() gets the answer. */
static int fence_ask(gf_gmsd *d, struct client *c)
{
	int rc = gf_lock_query_start(&c->fence_q, d->lock_uri, d->lock_secret, d->lock_secret_len,
				     c->lock_proof.epoch ? &c->lock_proof : NULL, FENCE_QUERY_MS);
	if (rc < 0)
		return rc;
	c->fence_w.fn = on_fence_answer;
	rc = gf_srv_watch_add(d->srv, gf_lock_query_get_fd(c->fence_q), &c->fence_w);
	if (rc < 0) {
		gf_lock_query_free(c->fence_q);
		c->fence_q = NULL;
	}
	return rc;
}

/* 1: @c may drop the layout now; 0: the lock server is being asked (or
 * refused @c: its phase is then C_IDLE and the reply sent). */
static int fence_step(gf_gmsd *d, struct client *c)
{
	if (c->fence_passed) {
		c->fence_passed = false;
		return 1;
	}
	if (c->fence_q)
		return 0;
	if (c->lock_epoch == 0) {
		reply_error(d, c, c->seq, GF_ERR_PERMISSION, "RW would drop the committed layout: only the lock's current "
			    "holder may (the connect carried no lock grant)");
		fence_refuse(d, c, 0);
		return 0;
	}
	int rc = fence_ask(d, c);
	if (rc < 0) {
		reply_error(d, c, c->seq, GF_ERR_UNREACHABLE, "RW would drop the committed layout and the lock "
			    "server could not be asked: %s", gf_error_detail());
		fence_refuse(d, c, 0);
	}
	return 0;
}

/*
 * A fenced GMS with a committed layout: a waiting RW would drop it, and an
 * RW waiting ahead of readers holds every new one back. So each is checked
 * when it arrives, or when the load it waited on commits, not only at its
 * grant: without a grant it is refused at once; with one, the lock server
 * is asked (off the loop) and only an admitted RW holds readers back
 * (other_rw_waiting()). The fence runs again at the grant.
 */
static void fence_waiting_writers(gf_gmsd *d)
{
	if (!d->lock_uri || !gms_fsm_rw_would_drop(&d->fsm))
		return;
	/* A refusal may close its peer (a failed send): walk afresh after each one. */
	for (;;) {
		struct client *c = next_client(d, NULL);
		while (c && (c->phase != C_WAIT || c->mode != GMS_MODE_RW || c->fence_admitted || c->fence_passed ||
			     c->fence_q))
			c = next_client(d, c);
		if (!c)
			return;
		if (c->lock_epoch == 0) {
			reply_error(d, c, c->seq, GF_ERR_PERMISSION, "RW would drop the committed layout: only the lock's "
				    "current holder may (the connect carried no lock grant)");
			fence_refuse(d, c, 0);
			continue;
		}
		if (fence_ask(d, c) < 0) {
			reply_error(d, c, c->seq, GF_ERR_UNREACHABLE, "RW would drop the committed layout and the lock "
				    "server could not be asked: %s", gf_error_detail());
			fence_refuse(d, c, 0);
			continue;
		}
		c->fence_admission = true;
	}
}

static void start_list(gf_gmsd *d, struct client *c, uint32_t seq, bool with_fds, bool with_meta, bool blob);

/* Try to grant @c now. Returns 1 granted, 0 still waiting, <0 the client was dropped. */
static int try_grant(gf_gmsd *d, struct client *c)
{
	enum gms_decision dec = gms_fsm_decide(&d->fsm, c->mode, other_rw_waiting(d, c));
	if (dec == GMS_WAIT || dec == GMS_INVALID)
		return 0;
	if (dec == GMS_GRANT_RW_DROP && d->lock_uri && !fence_step(d, c))
		return c->phase == C_WAIT ? 0 : -1;
	c->fence_passed = false;
	if (dec == GMS_GRANT_RW_DROP) {
		event(d, "event=layout_dropped generation=%llu by=%s", (unsigned long long)d->generation,
		      c->peer);
		drop_layout(d, "new_load");
		gms_residency_dropped(d->res);
	}
	gms_fsm_apply(&d->fsm, dec);
	int granted = dec == GMS_GRANT_RO ? GMS_MODE_RO : GMS_MODE_RW;
	c->phase = granted == GMS_MODE_RO ? C_READER : C_WRITER;
	if (granted == GMS_MODE_RW)
		writer_granted(d);
	gf_msg_start(d->out, gf_Msg_gms_connected_tag);
	d->out->seq = c->seq;
	fill_connected(d, &d->out->body.gms_connected, granted);
	/* A wake whose handles are this very layout's (no drop since it slept) maps them: no list. */
	bool valid = granted == GMS_MODE_RO && c->handles_kept && c->parked_drops == d->drops &&
		     !memcmp(c->parked_hash, d->hash, 16);
	d->out->body.gms_connected.handles_valid = valid;
	c->handles_kept = false;
	int sent = send_msg(d, c, NULL, 0);
	/* Logged once the answer is on its way: a wake waits on it. */
	event(d, "event=connect peer=%s pid=%u mode=%s granted=%s state=%s readers=%u lock_epoch=%llu proof=%d", c->peer,
	      c->pid, gms_mode_name(c->mode), gms_mode_name(granted), gms_state_name(d->fsm.state), d->fsm.readers,
	      (unsigned long long)c->lock_epoch, c->lock_proof.epoch != 0);
	if (sent < 0)
		return -1;
	/* A reader waking asked for the list with the grant: no second round trip. */
	if (c->connect_list && granted == GMS_MODE_RO && !valid)
		start_list(d, c, c->seq, true, false, false);
	c->connect_list = false;
	return 1;
}

/* Every state change: walk the waiters in FIFO order and grant whoever can go now. */
static void reevaluate(gf_gmsd *d)
{
	d->changed = false;
	fence_waiting_writers(d);
	for (;;) {
		struct client *best = NULL;
		bool progressed = false;
		/* Waiters in FIFO order: find the oldest not yet examined in this pass. */
		uint64_t after = 0;
		for (;;) {
			best = NULL;
			for (struct client *c = next_client(d, NULL); c; c = next_client(d, c))
				if (c->phase == C_WAIT && c->order > after && (!best || c->order < best->order))
					best = c;
			if (!best)
				break;
			after = best->order;
			int r = try_grant(d, best);
			if (r != 0) {
				/* A grant or a drop changed the state (or the list): start a fresh pass. */
				progressed = true;
				break;
			}
		}
		if (!progressed)
			return;
	}
}

/* ---------------------------------------------------------------- handlers */

static void handle_connect(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const gf_GmsConnect *r = &m->body.gms_connect;
	if (c->phase != C_IDLE) {
		reply_error(d, c, m->seq, GF_ERR_STATE, "already connected in this session");
		return;
	}
	if ((int)r->mode != GMS_MODE_RW && (int)r->mode != GMS_MODE_RO && (int)r->mode != GMS_MODE_RW_OR_RO) {
		reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "unknown mode %d", (int)r->mode);
		return;
	}
	c->mode = r->mode;
	c->lock_epoch = r->lock_epoch;
	memset(&c->lock_proof, 0, sizeof(c->lock_proof));
	if (r->lock_proof.size == GF_LOCK_PROOF_LEN) {
		c->lock_proof.epoch = r->lock_epoch;
		memcpy(c->lock_proof.token, r->lock_proof.bytes, GF_LOCK_PROOF_LEN);
	}
	fence_cancel(d, c);
	c->fence_passed = false;
	c->fence_admission = c->fence_admitted = false;
	c->commit_pending = false;
	c->connect_list = r->with_list;
	/* Only a session that slept here can have kept this server's handles. */
	c->handles_kept = r->handles_kept && c->parked;
	c->parked = false;
	c->seq = m->seq;
	c->deadline_us = gf_deadline_from_ms(r->timeout_ms);
	c->by_progress = r->by_progress;
	c->wait_since_us = gf_now_us();
	c->wait_timeout_us = r->timeout_ms < 0 ? -1
			     : r->timeout_ms > GF_MAX_DURATION_MS ? GF_MAX_DURATION_MS * 1000
								 : r->timeout_ms * 1000;
	c->order = ++d->next_order;
	c->phase = C_WAIT;
	/* A reader waking after a demotion: bring the same layout back from its tier, then grant. */
	if (c->mode != GMS_MODE_RW)
		gms_residency_reader_connects(d->res);
	int g = try_grant(d, c);
	if (g != 0)
		return;
	fence_waiting_writers(d);
	if (c->phase != C_WAIT)
		return;
	if (r->timeout_ms == 0) {
		c->phase = C_IDLE;
		reply_error(d, c, m->seq, GF_ERR_TIMEOUT, "%s not grantable now (state %s)",
			    gms_mode_name(c->mode), gms_state_name(d->fsm.state));
		return;
	}
	gf_log(GF_LOG_DEBUG, "gms", "peer=%s waits mode=%s state=%s", c->peer, gms_mode_name(c->mode),
	       gms_state_name(d->fsm.state));
	/* A new RW waiter holds back RO requests (writer priority); nothing else to re-check. */
}

static int do_allocate(gf_gmsd *d, struct client *c, uint32_t seq)
{
	gf_mem_alloc *a;
	int rc = gf_mem_create(&a, d->mem, c->alloc_size);
	if (rc == GF_ERR_OUT_OF_MEMORY && gf_now_us() < c->alloc_until_us) {
		if (c->alloc_tries++ == 0)
			event(d, "event=oom_retry peer=%s size=%llu for_ms=%lld", c->peer,
			      (unsigned long long)c->alloc_size, (long long)d->oom_retry_ms);
		c->phase = C_ALLOC_WAIT;
		c->seq = seq;
		c->alloc_next_us = gf_now_us() + GMSD_OOM_RETRY_US;
		return 0;
	}
	c->phase = C_WRITER;
	if (rc < 0) {
		if (rc == GF_ERR_OUT_OF_MEMORY)
			event(d, "event=oom peer=%s size=%llu tries=%u", c->peer,
			      (unsigned long long)c->alloc_size, c->alloc_tries + 1);
		return reply_error(d, c, seq, rc, "allocate %llu bytes: %s",
				   (unsigned long long)c->alloc_size, gf_error_detail());
	}
	int fd = -1;
	if (d->nallocs == d->allocs_cap) {
		size_t cap = d->allocs_cap ? d->allocs_cap * 2 : 64;
		struct galloc *n = realloc(d->allocs, cap * sizeof(*n));
		if (!n) {
			gf_mem_alloc_free(a);
			return reply_error(d, c, seq, GF_ERR_NOMEM, "allocation table: out of memory");
		}
		d->allocs = n;
		d->allocs_cap = cap;
	}
	rc = gf_mem_export(a, &fd);
	if (rc < 0) {
		gf_mem_alloc_free(a);
		return reply_error(d, c, seq, rc, "export: %s", gf_error_detail());
	}
	struct galloc *g = &d->allocs[d->nallocs++];
	g->id = d->next_alloc_id++;
	g->a = a;
	g->size = gf_mem_alloc_size(a);
	g->requested = c->alloc_size;
	snprintf(g->tag, sizeof(g->tag), "%s", c->alloc_tag);
	d->alloc_bytes += g->size;
	writer_progress(d);
	if (c->alloc_tries)
		event(d, "event=oom_recovered peer=%s size=%llu tries=%u", c->peer,
		      (unsigned long long)c->alloc_size, c->alloc_tries + 1);
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = seq;
	d->out->which_body = gf_Msg_gms_allocated_tag;
	d->out->body.gms_allocated.has_allocation = true;
	gf_GmsAllocation *o = &d->out->body.gms_allocated.allocation;
	o->id = g->id;
	o->size = g->size;
	o->requested = g->requested;
	snprintf(o->tag, sizeof(o->tag), "%s", g->tag);
	rc = send_msg(d, c, &fd, 1);
	gf_close(fd);
	return rc;
}

static void handle_allocate(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const gf_GmsAllocate *r = &m->body.gms_allocate;
	if (c->phase != C_WRITER) {
		reply_error(d, c, m->seq, GF_ERR_STATE, "allocate needs the RW lock");
		return;
	}
	if (r->size == 0) {
		reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "allocate: size 0");
		return;
	}
	if (d->nallocs >= GMSD_MAX_ALLOCS) {
		reply_error(d, c, m->seq, GF_ERR_TOO_BIG, "allocate: more than %d allocations", GMSD_MAX_ALLOCS);
		return;
	}
	writer_progress(d);
	c->alloc_size = r->size;
	snprintf(c->alloc_tag, sizeof(c->alloc_tag), "%s", r->tag);
	c->alloc_tries = 0;
	c->alloc_until_us = gf_now_us() + d->oom_retry_ms * 1000;
	do_allocate(d, c, m->seq);
}

static void handle_meta_put(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const gf_GmsMetaPut *r = &m->body.gms_meta_put;
	if (c->phase != C_WRITER) {
		reply_error(d, c, m->seq, GF_ERR_STATE, "put metadata needs the RW lock");
		return;
	}
	if (!r->key[0]) {
		reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "metadata: empty key");
		return;
	}
	struct galloc *a = alloc_find(d, r->allocation_id);
	if (!a) {
		reply_error(d, c, m->seq, GF_ERR_NOT_FOUND, "metadata %s: unknown allocation id %llu", r->key,
			    (unsigned long long)r->allocation_id);
		return;
	}
	if (r->offset >= a->size) {
		reply_error(d, c, m->seq, GF_ERR_INVALID_ARG,
			    "metadata %s: offset %llu outside allocation %llu of %llu bytes", r->key,
			    (unsigned long long)r->offset, (unsigned long long)a->id,
			    (unsigned long long)a->size);
		return;
	}
	if (meta_find(d, r->key)) {
		reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "metadata key %s already exists", r->key);
		return;
	}
	if (d->nmeta >= GMSD_MAX_META) {
		reply_error(d, c, m->seq, GF_ERR_TOO_BIG, "more than %d metadata entries", GMSD_MAX_META);
		return;
	}
	if (d->nmeta == d->meta_cap) {
		size_t cap = d->meta_cap ? d->meta_cap * 2 : 256;
		struct gmeta *n = realloc(d->meta, cap * sizeof(*n));
		if (!n) {
			reply_error(d, c, m->seq, GF_ERR_NOMEM, "metadata: out of memory");
			return;
		}
		d->meta = n;
		d->meta_cap = cap;
	}
	/* Keep the index at most half full. */
	if ((d->nmeta + 1) * 2 > d->index_cap &&
	    index_rebuild(d, d->index_cap ? d->index_cap * 2 : 512) < 0) {
		reply_error(d, c, m->seq, GF_ERR_NOMEM, "metadata: out of memory");
		return;
	}
	struct gmeta *e = &d->meta[d->nmeta];
	e->key = strdup(r->key);
	e->value = malloc(r->value.size ? r->value.size : 1);
	if (!e->key || !e->value) {
		free(e->key);
		free(e->value);
		reply_error(d, c, m->seq, GF_ERR_NOMEM, "metadata: out of memory");
		return;
	}
	memcpy(e->value, r->value.bytes, r->value.size);
	e->value_len = r->value.size;
	e->alloc_id = r->allocation_id;
	e->offset = r->offset;
	size_t p = key_hash(e->key) & (d->index_cap - 1);
	while (d->index[p])
		p = (p + 1) & (d->index_cap - 1);
	d->index[p] = (uint32_t)(d->nmeta + 1);
	d->nmeta++;
	writer_progress(d);
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = m->seq;
	d->out->which_body = gf_Msg_ok_tag;
	send_msg(d, c, NULL, 0);
}

static void handle_progress(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const gf_GmsProgress *r = &m->body.gms_progress;
	if (c->phase != C_WRITER) {
		reply_error(d, c, m->seq, GF_ERR_STATE, "progress is the writer's to report");
		return;
	}
	d->w_done = r->done_bytes;
	d->w_total = r->total_bytes;
	d->w_reports++;
	writer_progress(d);
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = m->seq;
	d->out->which_body = gf_Msg_ok_tag;
	send_msg(d, c, NULL, 0);
}

static int meta_cmp(const void *a, const void *b)
{
	return strcmp(((const struct gmeta *)a)->key, ((const struct gmeta *)b)->key);
}

/*
 * The committed metadata as one sealed memfd, made once per layout (after
 * the commit or at the first reader's list after a restore) and shared by
 * every reader: a reader's list then costs one fd and one pread, not 32
 * entries per chunk. False when there is none or it cannot be made (the
 * list then carries the entries in chunks, as for an older client).
 */
static bool meta_blob(gf_gmsd *d)
{
	if (!d->nmeta)
		return false;
	if (d->mblob_fd >= 0 && !memcmp(d->mblob_hash, d->hash, 16))
		return true;
	gf_close(d->mblob_fd);
	d->mblob_fd = -1;
	struct gf_lc_meta *lm = calloc(d->nmeta, sizeof(*lm));
	int rc = lm ? 0 : gf_err(GF_ERR_NOMEM, "out of memory");
	for (size_t i = 0; rc == 0 && i < d->nmeta; i++)
		lm[i] = (struct gf_lc_meta){d->meta[i].key, d->meta[i].alloc_id, d->meta[i].offset, d->meta[i].value,
					    d->meta[i].value_len};
	if (rc == 0)
		rc = gf_mb_make_memfd(lm, d->nmeta, &d->mblob_fd, &d->mblob_size);
	free(lm);
	if (rc < 0) {
		gf_log(GF_LOG_DEBUG, "gms", "msg=\"metadata blob not made; lists carry the entries\" detail=\"%s\"",
		       gf_error_detail());
		return false;
	}
	memcpy(d->mblob_hash, d->hash, 16);
	return true;
}

static void handle_commit(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	if (c->phase != C_WRITER) {
		reply_error(d, c, m->seq, GF_ERR_STATE, "commit needs the RW lock");
		return;
	}
	if (c->commit_pending) {
		reply_error(d, c, m->seq, GF_ERR_STATE, "a commit is already waiting for the lock's answer");
		return;
	}
	if (d->lock_uri && c->lock_epoch) {
		/* Checked off the loop like the drop (fence_step()); the answer commits or refuses. */
		int rc = fence_ask(d, c);
		c->commit_seq = m->seq;
		if (rc < 0) {
			commit_fenced(d, c, rc, NULL);
			return;
		}
		c->commit_pending = true;
		return;
	}
	do_commit(d, c, m->seq);
}

static void do_commit(gf_gmsd *d, struct client *c, uint32_t seq)
{
	for (size_t i = 0; i < d->nmeta; i++) {
		struct galloc *a = alloc_find(d, d->meta[i].alloc_id);
		if (!a || d->meta[i].offset >= a->size) {
			reply_error(d, c, seq, GF_ERR_INVALID_ARG, "commit: metadata %s is invalid",
				    d->meta[i].key);
			return;
		}
	}
	uint64_t *sizes = malloc((d->nallocs ? d->nallocs : 1) * sizeof(*sizes));
	struct gms_layout_meta *lm = malloc((d->nmeta ? d->nmeta : 1) * sizeof(*lm));
	if (!sizes || !lm) {
		free(sizes);
		free(lm);
		reply_error(d, c, seq, GF_ERR_NOMEM, "commit: out of memory");
		return;
	}
	/* Canonical order (by key) so the hash does not depend on the order of puts. */
	if (d->nmeta)
		qsort(d->meta, d->nmeta, sizeof(*d->meta), meta_cmp);
	/* The sort moved the entries: index them again in place, which cannot
	 * fail (a new index could, and would leave the old one pointing at the
	 * wrong entries). No index yet means no metadata. */
	if (d->index_cap)
		index_fill(d);
	for (size_t i = 0; i < d->nallocs; i++)
		sizes[i] = d->allocs[i].size;
	for (size_t i = 0; i < d->nmeta; i++) {
		lm[i].key = d->meta[i].key;
		lm[i].alloc_index = d->meta[i].alloc_id - 1;
		lm[i].offset = d->meta[i].offset;
		lm[i].value = d->meta[i].value;
		lm[i].value_len = d->meta[i].value_len;
	}
	int hrc = gms_layout_hash(sizes, d->nallocs, lm, d->nmeta, d->hash);
	free(sizes);
	free(lm);
	if (hrc < 0) {
		reply_error(d, c, seq, GF_ERR_NOMEM, "commit: out of memory");
		return;
	}
	/* The committed bytes are final: no holder of an fd, the writer
	 * included, may change them under the readers (host: sealed; cuda
	 * cannot enforce it, docs/gms.md). */
	for (size_t i = 0; i < d->nallocs; i++) {
		int src = gf_mem_seal(d->allocs[i].a);
		if (src < 0 && src != GF_ERR_NOT_SUPPORTED) {
			reply_error(d, c, seq, src, "commit: %s", gf_error_detail());
			return;
		}
	}
	d->generation++;
	gms_fsm_commit(&d->fsm);
	c->phase = C_READER;
	writer_progress(d);
	char hex[33];
	gf_hex(d->hash, 16, hex);
	event(d, "event=commit peer=%s generation=%llu hash=%s allocations=%zu bytes=%llu metadata=%zu", c->peer,
	      (unsigned long long)d->generation, hex, d->nallocs, (unsigned long long)d->alloc_bytes, d->nmeta);
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = seq;
	d->out->which_body = gf_Msg_gms_committed_tag;
	d->out->body.gms_committed.generation = d->generation;
	memcpy(d->out->body.gms_committed.layout_hash.bytes, d->hash, 16);
	d->out->body.gms_committed.layout_hash.size = 16;
	send_msg(d, c, NULL, 0);
	d->changed = true;
	gms_residency_committed(d->res);
	meta_blob(d); /* now, after the reply, rather than in the first reader's map */
}

static void close_owned(const int *fds, const bool *owned, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (owned[i])
			gf_close(fds[i]);
}

/*
 * Stream the chunks of a list reply: one round trip for the client, but the
 * loop sends a chunk only while the socket has room (a unix socket reports
 * POLLOUT with at least 3/4 of its buffer free, more than one chunk), so a
 * reader that stops reading costs its own connection, not the loop.
 */
/* A list without metadata (a wake) packs 240 allocations a chunk, one
 * sendmsg and one recvmsg per 240 fds; with metadata a chunk also carries
 * up to 32 entries of 1.3 KB, so fewer allocations keep it under 64 KiB. */
static size_t chunk_allocs(const struct client *c)
{
	return c->list_meta && !c->list_blob ? GF_LIMIT_CHUNK_ALLOCS_WITH_META : GMSD_CHUNK_ALLOCS;
}

static void list_pump(gf_gmsd *d, struct client *c)
{
	int fds[GMSD_CHUNK_ALLOCS + 1];
	bool owned[GMSD_CHUNK_ALLOCS + 1];
	size_t nm = c->list_meta && !c->list_blob ? d->nmeta : 0, per = chunk_allocs(c);
	for (int budget = 32; c->list_next < c->list_chunks; budget--) {
		struct pollfd p = {.fd = c->p->fd, .events = POLLOUT};
		if (budget == 0 || poll(&p, 1, 0) <= 0 || !(p.revents & POLLOUT)) {
			gf_srv_want_write(d->srv, c->p, true);
			return;
		}
		size_t k = c->list_next, a0 = k * per, m0 = k * GMSD_CHUNK_META, nfds = 0;
		struct gf_lc_alloc la[GMSD_CHUNK_ALLOCS];
		struct gf_lc_meta lm[GMSD_CHUNK_META];
		struct gf_lc_chunk ch = {
			.seq = c->seq,
			.allocs = la,
			.meta = lm,
			.last = k + 1 == c->list_chunks,
			.generation = d->generation,
			.hash = d->hash,
			.total_allocations = (uint32_t)d->nallocs,
			.total_metadata = (uint32_t)(c->list_meta ? d->nmeta : 0),
		};
		int rc = 0;
		for (size_t i = a0; i < d->nallocs && i < a0 + per; i++) {
			const struct galloc *g = &d->allocs[i];
			la[ch.nallocs++] = (struct gf_lc_alloc){g->id, g->size, g->requested, g->tag};
			/* A reader gets a read-only file description; the writer the
			 * allocation's own fd where the backend allows (sendmsg copies it). */
			if (c->list_fds &&
			    (rc = c->phase == C_READER ? gf_mem_export_readonly(g->a, &fds[nfds], &owned[nfds])
						       : gf_mem_export_borrowed(g->a, &fds[nfds], &owned[nfds])) == 0)
				nfds++;
			if (rc < 0)
				break;
		}
		for (size_t i = m0; i < nm && i < m0 + GMSD_CHUNK_META; i++) {
			const struct gmeta *e = &d->meta[i];
			lm[ch.nmeta++] = (struct gf_lc_meta){e->key, e->alloc_id, e->offset, e->value, e->value_len};
		}
		/* The blob's fd follows the first chunk's allocation fds (not owned: kept for the next reader). */
		if (rc == 0 && c->list_blob && k == 0) {
			ch.metadata_blob_size = d->mblob_size;
			fds[nfds] = d->mblob_fd;
			owned[nfds++] = false;
		}
		size_t len = 0;
		if (rc == 0)
			rc = gf_lc_encode(&ch, d->lc_buf, GF_FRAME_MAX_BODY, &len);
		if (rc < 0) {
			close_owned(fds, owned, nfds);
			/* The reply is already under way: the client cannot resynchronise. */
			reply_error(d, c, c->seq, rc, "list: %s", gf_error_detail());
			client_close(d, c, "list chunk failed");
			return;
		}
		rc = gf_srv_send_raw(d->srv, c->p, d->lc_buf, len, fds, nfds);
		close_owned(fds, owned, nfds);
		if (rc < 0)
			return;
		c->list_next++;
	}
	c->listing = false;
	gf_srv_want_write(d->srv, c->p, false);
}

static void start_list(gf_gmsd *d, struct client *c, uint32_t seq, bool with_fds, bool with_meta, bool blob)
{
	c->list_fds = with_fds;
	c->list_meta = with_meta;
	/* A reader's committed layout only: a writer's metadata still change. */
	c->list_blob = with_meta && blob && c->phase == C_READER && meta_blob(d);
	size_t nm = c->list_meta && !c->list_blob ? d->nmeta : 0;
	size_t per = chunk_allocs(c), chunks_a = (d->nallocs + per - 1) / per;
	size_t chunks_m = (nm + GMSD_CHUNK_META - 1) / GMSD_CHUNK_META;
	c->list_chunks = chunks_a > chunks_m ? chunks_a : chunks_m;
	if (c->list_chunks == 0)
		c->list_chunks = 1;
	c->list_next = 0;
	c->seq = seq;
	c->listing = true;
	list_pump(d, c);
}

static void handle_list(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	if (c->phase != C_READER && c->phase != C_WRITER) {
		reply_error(d, c, m->seq, GF_ERR_STATE, "list needs the RW or RO lock");
		return;
	}
	start_list(d, c, m->seq, m->body.gms_list.with_fds, !m->body.gms_list.without_metadata,
		   m->body.gms_list.metadata_blob);
}

/* A reader going to sleep gives the RO lock back but keeps its session. */
static void handle_disconnect(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	if (c->phase != C_READER) {
		reply_error(d, c, m->seq, GF_ERR_STATE, "disconnect: only a reader keeps its session without a lock");
		return;
	}
	gms_fsm_reader_left(&d->fsm);
	c->phase = C_IDLE;
	c->parked = true;
	c->parked_drops = d->drops;
	memcpy(c->parked_hash, d->hash, 16);
	d->changed = true;
	event(d, "event=disconnect peer=%s pid=%u mode=RO readers=%u state=%s session=kept", c->peer, c->pid,
	      d->fsm.readers, gms_state_name(d->fsm.state));
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = m->seq;
	d->out->which_body = gf_Msg_ok_tag;
	send_msg(d, c, NULL, 0);
}

/* Everything status reports, for the wire, the JSON and the metrics. */
static void fill_status(gf_gmsd *d, gf_GmsStatus *s)
{
	memset(s, 0, sizeof(*s));
	s->state = (gf_GmsState)d->fsm.state;
	s->generation = d->generation;
	if (d->fsm.state == GMS_COMMITTED || d->fsm.state == GMS_RO) {
		memcpy(s->layout_hash.bytes, d->hash, 16);
		s->layout_hash.size = 16;
	}
	s->readers = d->fsm.readers;
	for (struct client *x = next_client(d, NULL); x; x = next_client(d, x)) {
		if (x->phase == C_WAIT)
			s->waiters++;
		if (x->phase == C_WAIT && x->by_progress)
			s->waiters_by_progress++;
		if (x->parked)
			s->sleeping++;
	}
	s->allocation_count = (uint32_t)d->nallocs;
	s->allocation_bytes = d->alloc_bytes;
	s->writer = d->fsm.state == GMS_RW;
	struct client *w = writer_client(d);
	if (w) {
		gf_GmsWriterProgress *o = &s->writer_progress;
		s->has_writer_progress = true;
		snprintf(o->peer, sizeof(o->peer), "%s", w->peer);
		o->pid = w->pid;
		o->granted_unix_ms = d->w_granted_wall_us / 1000;
		o->allocations = (uint32_t)d->nallocs;
		o->allocated_bytes = d->alloc_bytes;
		o->metadata = (uint32_t)d->nmeta;
		o->done_bytes = d->w_done;
		o->total_bytes = d->w_total;
		o->last_progress_unix_ms = d->wmark_wall_us / 1000;
		o->progress_reports = d->w_reports;
	} else {
		s->no_writer_since_unix_ms = d->wmark_wall_us / 1000;
	}
	snprintf(s->backend, sizeof(s->backend), "%s", gf_mem_kind_name(gf_mem_kind(d->mem)));
	s->device = (uint32_t)d->device;
	snprintf(s->device_uuid, sizeof(s->device_uuid), "%s", d->uuid);
	s->uptime_ms = (gf_now_us() - d->started_us) / 1000;
	s->metadata_count = (uint32_t)d->nmeta;
	struct gf_srv_stats st;
	gf_srv_stats(d->srv, &st);
	s->connections = st.connections;
	s->fd_limit = st.fd_limit;
	s->accept_paused = st.accept_paused;
	s->fenced = d->lock_uri != NULL;
	s->fence_refusals = d->fence_refusals;
	/* Looked at now: the figure an operator or a demotion's answer reads is current. */
	pin_scan(d);
	s->pinned_exact = pins_exact(d);
	s->pinned_bytes = pinned_bytes(d);
	for (size_t i = 0; i < d->nretired; i++)
		for (size_t k = 0; k < d->retired[i].nholders && s->pinned_by_count < GF_ARRAY_SIZE(s->pinned_by); k++) {
			const struct retired *r = &d->retired[i];
			gf_GmsPinned *o = &s->pinned_by[s->pinned_by_count++];
			o->pid = r->h[k].pid;
			snprintf(o->peer, sizeof(o->peer), "%s", r->h[k].peer);
			o->bytes = r->h[k].bytes;
			o->allocations = r->h[k].allocs;
			o->generation = r->generation;
			snprintf(o->reason, sizeof(o->reason), "%s", r->reason);
			o->since_unix_ms = r->at_unix_ms;
		}
	/* oldest first */
	size_t first = (d->ev_next + GMSD_EVENTS - d->ev_count) % GMSD_EVENTS;
	for (size_t i = 0; i < d->ev_count; i++) {
		const struct gevent *e = &d->events[(first + i) % GMSD_EVENTS];
		s->events[s->events_count].at_us = e->at_us;
		snprintf(s->events[s->events_count].what, sizeof(s->events[0].what), "%s", e->what);
		s->events_count++;
	}
	gms_residency_status(d->res, s);
}

static void handle_status(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	memset(d->out, 0, sizeof(*d->out));
	d->out->seq = m->seq;
	d->out->which_body = gf_Msg_gms_status_tag;
	fill_status(d, &d->out->body.gms_status);
	send_msg(d, c, NULL, 0);
}

int gf_gmsd_status_json(gf_gmsd *d, char **json)
{
	if (!d || !json)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gmsd_status_json: NULL argument");
	gf_GmsStatus *s = malloc(sizeof(*s));
	if (!s)
		return gf_err(GF_ERR_NOMEM, "gmsd: out of memory");
	fill_status(d, s);
	int rc = gf_gms_status_to_json(s, json);
	free(s);
	return rc;
}

int gf_gmsd_metrics(gf_gmsd *d, char **text)
{
	if (!d || !text)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gmsd_metrics: NULL argument");
	gf_GmsStatus *s = malloc(sizeof(*s));
	char *buf = NULL;
	size_t len = 0;
	FILE *f = s ? open_memstream(&buf, &len) : NULL;
	if (!f) {
		free(s);
		return gf_err(GF_ERR_NOMEM, "gmsd: out of memory");
	}
	fill_status(d, s);
	fputs("# HELP gf_gms_state Lock state of the GMS: 1 for the current state, 0 for the others.\n"
	      "# TYPE gf_gms_state gauge\n", f);
	for (int st = GF_GMS_STATE_EMPTY; st <= GF_GMS_STATE_RO; st++)
		fprintf(f, "gf_gms_state{state=\"%s\"} %d\n", gf_gms_state_name(st), (int)s->state == st);
	fprintf(f, "# HELP gf_gms_generation Generation of the committed layout (0: none).\n"
		   "# TYPE gf_gms_generation gauge\ngf_gms_generation %llu\n"
		   "# HELP gf_gms_readers Readers holding the RO lock.\n# TYPE gf_gms_readers gauge\ngf_gms_readers %u\n"
		   "# HELP gf_gms_waiters Connections waiting for a lock.\n# TYPE gf_gms_waiters gauge\ngf_gms_waiters %u\n"
		   "# HELP gf_gms_sleeping Readers asleep on a kept session, holding their handles.\n"
		   "# TYPE gf_gms_sleeping gauge\ngf_gms_sleeping %u\n"
		   "# HELP gf_gms_allocations Allocations in the layout.\n"
		   "# TYPE gf_gms_allocations gauge\ngf_gms_allocations %u\n"
		   "# HELP gf_gms_allocation_bytes Bytes allocated for the layout.\n"
		   "# TYPE gf_gms_allocation_bytes gauge\ngf_gms_allocation_bytes %llu\n"
		   "# HELP gf_gms_connections Open connections.\n"
		   "# TYPE gf_gms_connections gauge\ngf_gms_connections %u\n"
		   "# HELP gf_gms_fd_limit The soft RLIMIT_NOFILE: bounds connections and host allocations.\n"
		   "# TYPE gf_gms_fd_limit gauge\ngf_gms_fd_limit %llu\n"
		   "# HELP gf_gms_fenced 1 when a layout drop needs the lock's current epoch (gf-gmsd --lock).\n"
		   "# TYPE gf_gms_fenced gauge\ngf_gms_fenced %d\n"
		   "# HELP gf_gms_fence_refusals_total RW requests refused by the lock fence.\n"
		   "# TYPE gf_gms_fence_refusals_total counter\ngf_gms_fence_refusals_total %llu\n"
		   "# HELP gf_gms_pinned_bytes Bytes of dropped layouts that released sleepers still hold.\n"
		   "# TYPE gf_gms_pinned_bytes gauge\ngf_gms_pinned_bytes %llu\n"
		   "# HELP gf_gms_pinned_exact 1 when those holders are seen (host), 0 for a lower bound (cuda).\n"
		   "# TYPE gf_gms_pinned_exact gauge\ngf_gms_pinned_exact %d\n",
		(unsigned long long)s->generation, s->readers, s->waiters, s->sleeping, s->allocation_count,
		(unsigned long long)s->allocation_bytes, s->connections, (unsigned long long)s->fd_limit, s->fenced ? 1 : 0,
		(unsigned long long)s->fence_refusals, (unsigned long long)s->pinned_bytes, s->pinned_exact ? 1 : 0);
	fprintf(f, "# HELP gf_gms_waiters_by_progress Waiters whose timeout counts only while no writer makes progress.\n"
		   "# TYPE gf_gms_waiters_by_progress gauge\ngf_gms_waiters_by_progress %u\n"
		   "# HELP gf_gms_writer_connected 1 while a writer holds RW.\n"
		   "# TYPE gf_gms_writer_connected gauge\ngf_gms_writer_connected %d\n"
		   "# HELP gf_gms_writer_idle_seconds Seconds since the writer's last progress, or without one since a writer last held RW.\n"
		   "# TYPE gf_gms_writer_idle_seconds gauge\ngf_gms_writer_idle_seconds %.3f\n",
		s->waiters_by_progress, s->has_writer_progress ? 1 : 0,
		(double)(gf_now_us() - d->wmark_us) / 1e6);
	if (s->pinned_by_count)
		fputs("# HELP gf_gms_pinned_by_bytes Bytes of a dropped layout one released sleeper still holds.\n"
		      "# TYPE gf_gms_pinned_by_bytes gauge\n", f);
	for (pb_size_t i = 0; i < s->pinned_by_count; i++)
		fprintf(f, "gf_gms_pinned_by_bytes{pid=\"%u\",peer=\"%s\",generation=\"%llu\"} %llu\n", s->pinned_by[i].pid,
			s->pinned_by[i].peer, (unsigned long long)s->pinned_by[i].generation,
			(unsigned long long)s->pinned_by[i].bytes);
	gms_residency_metrics(d->res, s, f);
	free(s);
	if (fclose(f) != 0) {
		free(buf);
		return gf_err(GF_ERR_NOMEM, "gmsd: out of memory");
	}
	*text = buf;
	return 0;
}

/* ---------------------------------------------------------------- tiers (lib/tiers/residency.h) */

static void host_layout(void *host, struct gms_host_layout *l)
{
	gf_gmsd *d = host;
	*l = (struct gms_host_layout){
		.empty = d->fsm.state == GMS_EMPTY,
		.hot = d->fsm.state == GMS_COMMITTED || d->fsm.state == GMS_RO,
		.writer = d->fsm.state == GMS_RW,
		.readers = d->fsm.readers,
		.state = gms_state_name(d->fsm.state),
		.generation = d->generation,
		.allocations = d->nallocs,
		.bytes = d->alloc_bytes,
		.pinned_bytes = pinned_bytes(d),
	};
	memcpy(l->hash, d->hash, 16);
	size_t len = 0;
	for (size_t i = 0; i < d->nretired; i++)
		for (size_t k = 0; k < d->retired[i].nholders && len < sizeof(l->pinned_by); k++) {
			const struct pin_holder *h = &d->retired[i].h[k];
			if (h->bytes)
				len += (size_t)snprintf(l->pinned_by + len, sizeof(l->pinned_by) - len, "%spid %u (%s) %llu bytes",
							len ? ", " : "", h->pid, h->peer, (unsigned long long)h->bytes);
		}
}

/* The committed layout as a snapshot job (a manifest and one exported fd per allocation), held like a reader. */
static int host_export(void *host, struct gms_manifest **out, int **out_fds)
{
	gf_gmsd *d = host;
	if (d->fsm.state != GMS_COMMITTED && d->fsm.state != GMS_RO)
		return gf_err(GF_ERR_STATE, "snapshot: no committed layout (state %s)", gms_state_name(d->fsm.state));
	struct gms_manifest *mf = gms_manifest_new();
	int *fds = malloc((d->nallocs ? d->nallocs : 1) * sizeof(*fds));
	int rc = 0;
	if (!mf || !fds || !(mf->allocs = calloc(d->nallocs ? d->nallocs : 1, sizeof(*mf->allocs))) ||
	    !(mf->meta = calloc(d->nmeta ? d->nmeta : 1, sizeof(*mf->meta))))
		rc = gf_err(GF_ERR_NOMEM, "snapshot: out of memory");
	size_t nfds = 0;
	for (size_t i = 0; rc == 0 && i < d->nallocs; i++) {
		mf->allocs[i].id = d->allocs[i].id;
		mf->allocs[i].size = d->allocs[i].size;
		memcpy(mf->allocs[i].tag, d->allocs[i].tag, sizeof(mf->allocs[i].tag));
		mf->nallocs = i + 1;
		rc = gf_mem_export(d->allocs[i].a, &fds[i]);
		nfds += rc == 0;
	}
	for (size_t i = 0; rc == 0 && i < d->nmeta; i++) {
		struct gms_snap_meta *e = &mf->meta[i];
		e->key = strdup(d->meta[i].key);
		e->value = malloc(d->meta[i].value_len ? d->meta[i].value_len : 1);
		mf->nmeta = i + 1;
		if (!e->key || !e->value) {
			rc = gf_err(GF_ERR_NOMEM, "snapshot: out of memory");
			break;
		}
		memcpy(e->value, d->meta[i].value, d->meta[i].value_len);
		e->value_len = d->meta[i].value_len;
		e->alloc_id = d->meta[i].alloc_id;
		e->offset = d->meta[i].offset;
	}
	if (rc < 0) {
		gf_close_fds(fds, nfds);
		free(fds);
		gms_manifest_free(mf);
		return rc;
	}
	mf->generation = d->generation;
	memcpy(mf->layout_hash, d->hash, 16);
	/* No writer replaces the layout while the job reads it. */
	gms_fsm_apply(&d->fsm, GMS_GRANT_RO);
	*out = mf;
	*out_fds = fds;
	return 0;
}

static void host_release(void *host)
{
	gf_gmsd *d = host;
	gms_fsm_reader_left(&d->fsm);
	d->changed = true;
}

/* Adopt a verified restore: allocations, metadata, generation and hash exactly as snapshotted; EMPTY -> COMMITTED. */
static int host_adopt(void *host, struct gms_manifest *mf, gf_mem_alloc **allocs)
{
	gf_gmsd *d = host;
	if (d->fsm.state != GMS_EMPTY)
		return gf_err(GF_ERR_STATE, "restore: the GMS is %s, not EMPTY", gms_state_name(d->fsm.state));
	size_t cap = 512;
	while (cap < 2 * mf->nmeta)
		cap *= 2;
	struct galloc *ga = calloc(mf->nallocs ? mf->nallocs : 1, sizeof(*ga));
	struct gmeta *gm = calloc(mf->nmeta ? mf->nmeta : 1, sizeof(*gm));
	/* The index is sized while the table is still empty: nothing fails once the restore is taken over. */
	if (!ga || !gm || index_rebuild(d, cap) < 0) {
		free(ga);
		free(gm);
		return gf_err(GF_ERR_NOMEM, "restore: out of memory");
	}
	/* Final bytes, as after a commit (host: sealed; cuda cannot enforce it). */
	for (size_t i = 0; i < mf->nallocs; i++) {
		int src = gf_mem_seal(allocs[i]);
		if (src < 0 && src != GF_ERR_NOT_SUPPORTED) {
			free(ga);
			free(gm);
			return src;
		}
	}
	uint64_t bytes = 0;
	for (size_t i = 0; i < mf->nallocs; i++) {
		ga[i] = (struct galloc){ .id = mf->allocs[i].id, .a = allocs[i], .size = mf->allocs[i].size,
					 .requested = mf->allocs[i].size };
		memcpy(ga[i].tag, mf->allocs[i].tag, sizeof(ga[i].tag));
		bytes += mf->allocs[i].size;
	}
	for (size_t i = 0; i < mf->nmeta; i++) {
		/* Taken over from the manifest, which is freed without them. */
		gm[i] = (struct gmeta){ .key = mf->meta[i].key, .alloc_id = mf->meta[i].alloc_id,
					.offset = mf->meta[i].offset, .value = mf->meta[i].value,
					.value_len = mf->meta[i].value_len };
		mf->meta[i].key = NULL;
		mf->meta[i].value = NULL;
	}
	free(d->allocs);
	free(d->meta);
	d->allocs = ga;
	d->nallocs = d->allocs_cap = mf->nallocs;
	d->meta = gm;
	d->nmeta = d->meta_cap = mf->nmeta;
	d->next_alloc_id = mf->nallocs + 1;
	d->alloc_bytes = bytes;
	index_fill(d);
	d->generation = mf->generation;
	memcpy(d->hash, mf->layout_hash, 16);
	gms_fsm_restored(&d->fsm);
	d->changed = true;
	return 0;
}

/* A demotion: the layout is kept in a lower tier, free it here. */
static int host_drop(void *host)
{
	gf_gmsd *d = host;
	if (!gms_fsm_demoted(&d->fsm))
		return gf_err(GF_ERR_BUSY, "the layout is in use (state %s)", gms_state_name(d->fsm.state));
	drop_layout(d, "demotion");
	d->changed = true;
	return 0;
}

static void host_event(void *host, const char *text)
{
	event(host, "%s", text);
}

static void host_answer(void *host, enum gms_residency_wait what, int err, const char *detail)
{
	gf_gmsd *d = host;
	for (struct client *c = next_client(d, NULL); c; c = next_client(d, c)) {
		if (c->tier_wait != what)
			continue;
		c->tier_wait = 0;
		if (err < 0) {
			reply_error(d, c, c->tier_seq, err, "%s: %s",
				    what == GMS_WAIT_SNAPSHOT ? "snapshot failed" : what == GMS_WAIT_RESTORE ? "restore" : "demote",
				    detail);
			continue;
		}
		if (what == GMS_WAIT_DEMOTION && d->nretired) {
			/* The answer (and the status it is read with) says what the drop really freed. */
			c->settling = true;
			c->settle_until_us = gf_now_us() + GMSD_PIN_SETTLE_US;
			continue;
		}
		memset(d->out, 0, sizeof(*d->out));
		d->out->seq = c->tier_seq;
		d->out->which_body = gf_Msg_ok_tag;
		send_msg(d, c, NULL, 0);
	}
}

static void on_tier_ready(void *ctx, struct gf_srv_watch *w)
{
	(void)w;
	gms_residency_process(((gf_gmsd *)ctx)->res);
}

static int host_watch(void *host, int fd)
{
	gf_gmsd *d = host;
	d->tier_watch.fn = on_tier_ready;
	return gf_srv_watch_add(d->srv, fd, &d->tier_watch);
}

static const struct gms_residency_host residency_host = {
	.layout = host_layout,
	.export_layout = host_export,
	.release = host_release,
	.adopt = host_adopt,
	.drop = host_drop,
	.event = host_event,
	.answer = host_answer,
	.watch = host_watch,
};

int gf_gmsd_restore(gf_gmsd *d, const char *dir)
{
	if (!d || !d->started)
		return gf_err(GF_ERR_STATE, "gmsd not started");
	return gms_residency_restore(d->res, dir);
}

int gf_gmsd_snapshot(gf_gmsd *d, const char *dir)
{
	if (!d || !d->started)
		return gf_err(GF_ERR_STATE, "gmsd not started");
	return gms_residency_snapshot(d->res, dir && *dir ? dir : NULL);
}

/* Root or the server's own uid: the operator's own tools. */
static bool admin_peer(const struct client *c)
{
	return c->p->uid == 0 || c->p->uid == (uint32_t)geteuid();
}

/*
 * A directory a client names for a snapshot or a restore. The GMS (often
 * root) reads and writes there on the client's behalf: any other allowed
 * peer may name only a kept tier (or none), or it could write into, or
 * restore and then map, what only the GMS's uid can reach (a confused
 * deputy). 0, or the refusal sent.
 */
static int client_dir_allowed(gf_gmsd *d, struct client *c, uint32_t seq, const char *what, const char *dir)
{
	if (!dir || admin_peer(c) || gms_residency_is_tier_dir(d->res, dir))
		return 0;
	event(d, "event=%s_refused peer=%s uid=%u reason=\"not an admin uid: only a kept tier\"", what, c->peer,
	      c->p->uid);
	reply_error(d, c, seq, GF_ERR_PERMISSION,
		    "%s: only root or the server's own uid may name a directory other than the kept tiers", what);
	return GF_ERR_PERMISSION;
}

static void handle_snapshot(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const char *dir = m->body.gms_snapshot.dir[0] ? m->body.gms_snapshot.dir : NULL;
	if (client_dir_allowed(d, c, m->seq, "snapshot", dir) < 0)
		return;
	int rc = gms_residency_snapshot(d->res, dir);
	if (rc < 0) {
		reply_error(d, c, m->seq, rc, "%s", gf_error_detail());
		return;
	}
	c->tier_wait = GMS_WAIT_SNAPSHOT;
	c->tier_seq = m->seq;
}

static void handle_restore(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const char *dir = m->body.gms_restore.dir[0] ? m->body.gms_restore.dir : NULL;
	if (client_dir_allowed(d, c, m->seq, "restore", dir) < 0)
		return;
	/* On the tier worker: reading and checking a snapshot never holds up the loop. */
	int rc = gms_residency_restore_start(d->res, dir);
	if (rc < 0) {
		reply_error(d, c, m->seq, rc, "%s", gf_error_detail());
		return;
	}
	c->tier_wait = GMS_WAIT_RESTORE;
	c->tier_seq = m->seq;
}

static void handle_demote(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	const char *to = m->body.gms_demote.to;
	/* Dropping the weights every engine sleeps on is an admin's decision, like
	 * revoking a lock: root or the server's own uid, not every allowed engine. */
	if (!admin_peer(c)) {
		event(d, "event=demote_refused peer=%s uid=%u reason=\"not an admin uid\"", c->peer, c->p->uid);
		reply_error(d, c, m->seq, GF_ERR_PERMISSION, "demote: only root or the server's own uid may demote");
		return;
	}
	enum gms_tier want = !*to ? GMS_TIER_HOT : !strcmp(to, "warm") ? GMS_TIER_WARM : !strcmp(to, "cold") ? GMS_TIER_COLD
													     : GMS_TIER_LOADER;
	if (want == GMS_TIER_LOADER) {
		reply_error(d, c, m->seq, GF_ERR_INVALID_ARG, "demote: to must be warm, cold or empty, not '%s'", to);
		return;
	}
	char why[160];
	snprintf(why, sizeof(why), "requested by peer=%s pid=%u", c->peer, c->pid);
	/* Waiting first: a demotion that ends at once answers it; one refused to begin (busy) does not. */
	c->tier_wait = GMS_WAIT_DEMOTION;
	c->tier_seq = m->seq;
	int rc = gms_residency_demote(d->res, want, why);
	if (rc < 0 && c->tier_wait == GMS_WAIT_DEMOTION) {
		c->tier_wait = 0;
		reply_error(d, c, m->seq, rc, "%s", gf_error_detail());
	}
}

int gf_gmsd_demote(gf_gmsd *d, int to)
{
	if (!d || !d->started)
		return gf_err(GF_ERR_STATE, "gmsd not started");
	if (to != GF_GMS_TIER_ANY && to != GF_GMS_TIER_WARM && to != GF_GMS_TIER_COLD)
		return gf_err(GF_ERR_INVALID_ARG, "demote: unknown tier %d", to);
	return gms_residency_demote(d->res, (enum gms_tier)to, "requested in process");
}

/* Returns false when the client was closed. */
static bool dispatch(gf_gmsd *d, struct client *c, const gf_Msg *m)
{
	if (c->phase == C_WAIT || c->phase == C_ALLOC_WAIT || c->listing || c->tier_wait || c->settling) {
		/* The client protocol is strictly request/reply: nothing may arrive while a reply is pending. */
		reply_error(d, c, m->seq, GF_ERR_PROTOCOL, "%s while a request is pending", gf_msg_name(m));
		client_close(d, c, "request while waiting");
		return false;
	}
	switch (m->which_body) {
	case gf_Msg_gms_connect_tag:
		handle_connect(d, c, m);
		break;
	case gf_Msg_gms_allocate_tag:
		handle_allocate(d, c, m);
		break;
	case gf_Msg_gms_meta_put_tag:
		handle_meta_put(d, c, m);
		break;
	case gf_Msg_gms_commit_tag:
		handle_commit(d, c, m);
		break;
	case gf_Msg_gms_list_tag:
		handle_list(d, c, m);
		break;
	case gf_Msg_gms_status_request_tag:
		handle_status(d, c, m);
		break;
	case gf_Msg_gms_snapshot_tag:
		handle_snapshot(d, c, m);
		break;
	case gf_Msg_gms_restore_tag:
		handle_restore(d, c, m);
		break;
	case gf_Msg_gms_disconnect_tag:
		handle_disconnect(d, c, m);
		break;
	case gf_Msg_gms_demote_tag:
		handle_demote(d, c, m);
		break;
	case gf_Msg_gms_progress_tag:
		handle_progress(d, c, m);
		break;
	default:
		reply_error(d, c, m->seq, GF_ERR_PROTOCOL, "unexpected message %s", gf_msg_name(m));
		client_close(d, c, "unexpected message");
		return false;
	}
	return true;
}

/* ---------------------------------------------------------------- connections */

static void on_ready(void *ctx, struct gf_srv_peer *p)
{
	(void)ctx;
	struct client *c = p->data;
	c->p = p;
	c->peer = p->id;
	c->pid = p->pid;
}

/* Forget @p; what it held changes the lock state, which settle() acts on. */
static void on_close(void *ctx, struct gf_srv_peer *p, const char *why)
{
	gf_gmsd *d = ctx;
	struct client *c = p->data;
	if (!c->p)
		return; /* never finished its handshake */
	fence_cancel(d, c);
	switch (c->phase) {
	case C_WRITER:
	case C_ALLOC_WAIT:
		gms_fsm_writer_left(&d->fsm);
		event(d, "event=rw_abort peer=%s pid=%u allocations=%zu reason=\"%s\"", c->peer, c->pid,
		      d->nallocs, why);
		drop_layout(d, "abort");
		writer_progress(d); /* no writer from now on */
		d->changed = true;
		break;
	case C_READER:
		gms_fsm_reader_left(&d->fsm);
		event(d, "event=disconnect peer=%s pid=%u mode=RO readers=%u state=%s", c->peer, c->pid,
		      d->fsm.readers, gms_state_name(d->fsm.state));
		d->changed = true;
		break;
	case C_WAIT:
		/* A leaving RW waiter may unblock readers (writer priority). */
		d->changed |= c->mode == GMS_MODE_RW;
		break;
	default:
		break;
	}
	c->phase = C_IDLE;
	c->listing = false;
}

static void on_message(void *ctx, struct gf_srv_peer *p, gf_Msg *m, int *fds, size_t nfds)
{
	gf_close_fds(fds, nfds); /* clients never send fds (max_fds is 0) */
	free(fds);
	dispatch(ctx, p->data, m);
}

static void on_writable(void *ctx, struct gf_srv_peer *p)
{
	struct client *c = p->data;
	if (c->listing)
		list_pump(ctx, c);
}

static void settle(void *ctx)
{
	gf_gmsd *d = ctx;
	while (d->changed)
		reevaluate(d);
}

/* ---------------------------------------------------------------- timers */

/* When a waiting request times out: from its start, or by progress, from the writer's last progress. */
static int64_t wait_deadline(const gf_gmsd *d, const struct client *c)
{
	if (!c->by_progress)
		return c->deadline_us;
	return gms_progress_deadline(c->wait_since_us, c->wait_timeout_us, d->wmark_us);
}

/* A request waiting by progress timed out: say which of the two it was. */
static void progress_timeout(gf_gmsd *d, struct client *c)
{
	double secs = (double)c->wait_timeout_us / 1e6;
	struct client *w = writer_client(d);
	if (!w) {
		event(d, "event=connect_timeout peer=%s mode=%s state=%s by_progress=1 reason=no_writer", c->peer,
		      gms_mode_name(c->mode), gms_state_name(d->fsm.state));
		reply_error(d, c, c->seq, GF_ERR_TIMEOUT,
			    "%s not granted: no writer connected for %.1f s (state %s, generation %llu): is a loader "
			    "running against this GMS?",
			    gms_mode_name(c->mode), secs, gms_state_name(d->fsm.state),
			    (unsigned long long)d->generation);
		return;
	}
	event(d, "event=connect_timeout peer=%s mode=%s state=%s by_progress=1 reason=writer_stalled writer=%s "
		 "writer_pid=%u",
	      c->peer, gms_mode_name(c->mode), gms_state_name(d->fsm.state), w->peer, w->pid);
	char done[96] = "";
	if (d->w_reports)
		snprintf(done, sizeof(done), ", reported %llu of %llu bytes written", (unsigned long long)d->w_done,
			 (unsigned long long)d->w_total);
	reply_error(d, c, c->seq, GF_ERR_TIMEOUT,
		    "%s not granted: writer connected but made no progress for %.1f s (writer %s pid %u: %zu "
		    "allocations, %llu bytes, %zu metadata entries%s): is the loader hung?",
		    gms_mode_name(c->mode), secs, w->peer, w->pid, d->nallocs, (unsigned long long)d->alloc_bytes,
		    d->nmeta, done);
}

static void on_timer(void *ctx, int64_t now)
{
	gf_gmsd *d = ctx;
	struct client *c = next_client(d, NULL), *next;
	for (; c; c = next) {
		next = next_client(d, c);
		if (c->phase == C_WAIT && now >= wait_deadline(d, c)) {
			c->phase = C_IDLE;
			d->changed |= c->mode == GMS_MODE_RW;
			if (c->by_progress) {
				progress_timeout(d, c);
				continue;
			}
			event(d, "event=connect_timeout peer=%s mode=%s state=%s", c->peer, gms_mode_name(c->mode),
			      gms_state_name(d->fsm.state));
			reply_error(d, c, c->seq, GF_ERR_TIMEOUT, "%s not granted in time (state %s)",
				    gms_mode_name(c->mode), gms_state_name(d->fsm.state));
		} else if (c->phase == C_ALLOC_WAIT && now >= c->alloc_next_us) {
			do_allocate(d, c, c->seq);
		}
	}
	if (d->nretired && now >= d->pin_next_us)
		pin_scan(d);
	bool settling = false;
	for (c = next_client(d, NULL); c; c = next_client(d, c))
		settling |= c->settling;
	if (settling)
		pin_scan(d);
	for (c = next_client(d, NULL); settling && c; c = next_client(d, c)) {
		if (!c->settling)
			continue;
		if (d->nretired && now < c->settle_until_us)
			continue;
		c->settling = false;
		memset(d->out, 0, sizeof(*d->out));
		d->out->seq = c->tier_seq;
		d->out->which_body = gf_Msg_ok_tag;
		send_msg(d, c, NULL, 0);
	}
	gms_residency_timer(d->res, now);
}

static int64_t next_deadline(void *ctx)
{
	gf_gmsd *d = ctx;
	int64_t next = INT64_MAX;
	for (struct client *c = next_client(d, NULL); c; c = next_client(d, c)) {
		int64_t w = c->phase == C_WAIT ? wait_deadline(d, c) : INT64_MAX;
		if (w < next)
			next = w;
		if (c->phase == C_ALLOC_WAIT && c->alloc_next_us < next)
			next = c->alloc_next_us;
		if (c->settling) {
			int64_t step = gf_now_us() + GMSD_PIN_SETTLE_STEP_US;
			next = step < next ? step : next;
		}
	}
	if (d->nretired && d->pin_next_us < next)
		next = d->pin_next_us;
	int64_t p = gms_residency_deadline(d->res);
	return p < next ? p : next;
}

/* ---------------------------------------------------------------- public */

int gf_gmsd_new(gf_gmsd **out)
{
	if (!out)
		return gf_err(GF_ERR_INVALID_ARG, "gf_gmsd_new: out is NULL");
	gf_gmsd *d = calloc(1, sizeof(*d));
	if (!d)
		return gf_err(GF_ERR_NOMEM, "gf_gmsd_new: out of memory");
	d->mblob_fd = -1;
	static const struct gf_srv_handlers h = {
		.on_ready = on_ready,
		.on_message = on_message,
		.on_close = on_close,
		.next_deadline = next_deadline,
		.on_timer = on_timer,
		.settle = settle,
		.on_writable = on_writable,
	};
	const struct gf_srv_config cfg = {
		.name = "gms",
		.component = gf_Component_COMPONENT_GMS,
		.max_fds = 0, /* clients never send fds */
		.backlog = 128,
		.peer_data_size = sizeof(struct client),
	};
	int rc = gf_srv_new(&d->srv, &cfg, &h, d);
	if (rc == 0 && (rc = gms_residency_new(&d->res, &residency_host, d)) < 0)
		gf_srv_free(d->srv);
	if (rc < 0) {
		free(d);
		return rc;
	}
	d->kind = GF_MEM_AUTO;
	d->next_alloc_id = 1;
	gms_fsm_init(&d->fsm);
	*out = d;
	return 0;
}

#define NOT_STARTED(d)                                                                 \
	do {                                                                               \
		if (!(d))                                                                      \
			return gf_err(GF_ERR_INVALID_ARG, "gmsd is NULL");                         \
		if ((d)->started)                                                              \
			return gf_err(GF_ERR_STATE, "gmsd: settings are fixed once started");      \
	} while (0)

int gf_gmsd_add_listen(gf_gmsd *d, const char *uri)
{
	NOT_STARTED(d);
	int rc = gf_srv_add_listen(d->srv, uri, true);
	if (rc == 0 && !d->listen_text[0])
		snprintf(d->listen_text, sizeof(d->listen_text), "%s", uri);
	return rc;
}

int gf_gmsd_set_device(gf_gmsd *d, int index)
{
	NOT_STARTED(d);
	if (index < 0)
		return gf_err(GF_ERR_INVALID_ARG, "device index %d", index);
	d->device = index;
	return 0;
}

int gf_gmsd_set_backend(gf_gmsd *d, int kind)
{
	NOT_STARTED(d);
	if (kind != GF_MEM_AUTO && kind != GF_MEM_CUDA && kind != GF_MEM_HOST)
		return gf_err(GF_ERR_INVALID_ARG, "backend kind %d", kind);
	d->kind = kind;
	return 0;
}


int gf_gmsd_set_oom_retry(gf_gmsd *d, int64_t ms)
{
	NOT_STARTED(d);
	if (ms < 0 || ms > GF_MAX_DURATION_MS)
		return gf_err(GF_ERR_INVALID_ARG, "oom retry %lldms outside 0..%lldms", (long long)ms, (long long)GF_MAX_DURATION_MS);
	d->oom_retry_ms = ms;
	return 0;
}

int gf_gmsd_add_allow_uid(gf_gmsd *d, uint32_t uid)
{
	NOT_STARTED(d);
	return gf_srv_add_allow_uid(d->srv, uid);
}

int gf_gmsd_set_handshake_timeout(gf_gmsd *d, int64_t ms)
{
	NOT_STARTED(d);
	return gf_srv_set_handshake_timeout(d->srv, ms);
}

int gf_gmsd_set_lock(gf_gmsd *d, const char *uri, const void *secret, size_t secret_len)
{
	NOT_STARTED(d);
	if (!uri || !*uri || (secret_len && !secret))
		return gf_err(GF_ERR_INVALID_ARG, "gf_gmsd_set_lock: empty URI");
	char *u = strdup(uri);
	void *s = secret_len ? malloc(secret_len) : NULL;
	if (!u || (secret_len && !s)) {
		free(u);
		free(s);
		return gf_err(GF_ERR_NOMEM, "gmsd: out of memory");
	}
	if (secret_len)
		memcpy(s, secret, secret_len);
	free(d->lock_uri);
	free(d->lock_secret);
	d->lock_uri = u;
	d->lock_secret = s;
	d->lock_secret_len = secret_len;
	return 0;
}

int gf_gmsd_start(gf_gmsd *d)
{
	NOT_STARTED(d);
	int rc;
	size_t rec;
	if (!d->out && (!(d->out = gf_msg_new()) || !(d->lc_buf = malloc(GF_FRAME_MAX_BODY))))
		return gf_err(GF_ERR_NOMEM, "gmsd: out of memory");
	if (!d->listen_text[0])
		return gf_err(GF_ERR_INVALID_ARG, "gmsd: no listen URI set");
	if (!d->mem && (rc = gf_mem_open(&d->mem, d->kind, d->device)) < 0)
		return rc;
	if ((rc = gf_mem_granularity(d->mem, &d->granularity, &rec)) < 0)
		return rc;
	if (gf_mem_device_uuid(d->mem, d->uuid, sizeof(d->uuid)) < 0)
		d->uuid[0] = 0;
	char sid[64];
	snprintf(sid, sizeof(sid), "gms-%s-%d", gf_mem_kind_name(gf_mem_kind(d->mem)), d->device);
	gf_srv_set_server_id(d->srv, sid);
	if ((rc = gf_srv_start(d->srv)) < 0)
		return rc;
	d->started = true;
	d->started_us = gf_now_us();
	writer_progress(d); /* no writer since the start */
	gms_residency_start(d->res, d->mem, d->device);
	event(d, "event=start listen=%s backend=%s device=%d uuid=%s", d->listen_text,
	      gf_mem_kind_name(gf_mem_kind(d->mem)), d->device, d->uuid);
	return 0;
}

gf_mem *gf_gmsd_mem(gf_gmsd *d)
{
	return d ? d->mem : NULL;
}

int gf_gmsd_get_fd(const gf_gmsd *d)
{
	return d ? gf_srv_get_fd(d->srv) : gf_err(GF_ERR_INVALID_ARG, "gmsd is NULL");
}

int gf_gmsd_get_timeout_ms(const gf_gmsd *d)
{
	return d ? gf_srv_get_timeout_ms(d->srv) : -1;
}

int gf_gmsd_process(gf_gmsd *d)
{
	if (!d || !d->started)
		return gf_err(GF_ERR_STATE, "gmsd not started");
	return gf_srv_process(d->srv, 0);
}

int gf_gmsd_run(gf_gmsd *d)
{
	if (!d || !d->started)
		return gf_err(GF_ERR_STATE, "gmsd not started");
	return gf_srv_run(d->srv);
}

void gf_gmsd_stop(gf_gmsd *d)
{
	if (d)
		gf_srv_stop(d->srv);
}

void gf_gmsd_free(gf_gmsd *d)
{
	if (!d)
		return;
	gms_residency_free(d->res); /* waits for a running snapshot job */
	for (struct client *c = d->srv ? next_client(d, NULL) : NULL; c; c = next_client(d, c))
		fence_cancel(d, c);
	gf_srv_free(d->srv);
	d->srv = NULL; /* drop_layout() below has no sessions left to close */
	drop_layout(d, NULL);
	for (size_t i = 0; i < d->nretired; i++)
		retired_free(&d->retired[i]);
	free(d->retired);
	free(d->allocs);
	free(d->meta);
	free(d->index);
	gf_mem_free(d->mem);
	gf_msg_free(d->out);
	free(d->lc_buf);
	free(d->lock_uri);
	free(d->lock_secret);
	free(d);
}

int gf_gmsd_set_tiers(gf_gmsd *d, const char *warm_dir, const char *cold_dir)
{
	NOT_STARTED(d);
	return gms_residency_set_dirs(d->res, warm_dir, cold_dir);
}

int gf_gmsd_set_min_resident(gf_gmsd *d, int64_t ms)
{
	NOT_STARTED(d);
	return gms_residency_set_min_resident(d->res, ms);
}

int gf_gmsd_set_pinned(gf_gmsd *d, int pinned)
{
	NOT_STARTED(d);
	gms_residency_set_pinned(d->res, pinned != 0);
	return 0;
}

int gf_gmsd_set_demote_below_free(gf_gmsd *d, uint64_t bytes)
{
	NOT_STARTED(d);
	gms_residency_set_demote_below_free(d->res, bytes);
	return 0;
}
