/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fault reporter: frameworks such as torch accept a read-only DLPack tensor
 * as writable, so an in-place write to shared weights dies with a bare
 * SIGSEGV. This handler names the GMS allocation and metadata key that was
 * hit, then restores the previous handler and lets the fault happen again,
 * so the process still dies with the usual signal (and core dump).
 *
 * The handler may only use async-signal-safe calls: every table it reads is
 * built at install time, immutable once published, and never freed while a
 * handler could read it (retired tables are freed when the last client is
 * removed and the handler is gone); the line is formatted by hand into a
 * stack buffer and written with write(2).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#include "common.h"
#include "gpufailover.h"

struct fr_key {
	uint64_t addr;
	char *name;
};

struct fr_alloc {
	uint64_t id, addr, size;
	char tag[64];
};

struct fr_client {
	const gf_gms *gms;
	int readonly;
	size_t nallocs, nkeys;
	struct fr_alloc *allocs;
	struct fr_key *keys; /* sorted by address */
};

struct fr_table {
	size_t n;
	struct fr_client **clients;
	struct fr_table *retired_next; /* chain of tables no longer published */
};

static pthread_mutex_t fr_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(struct fr_table *) fr_current;
static struct fr_table *fr_retired;
static struct fr_client **fr_retired_clients;
static size_t fr_nretired_clients;
static int fr_installed;
static struct sigaction fr_prev_segv, fr_prev_bus;

/* ---- formatting without libc's stdio (async-signal-safe) ---- */

struct line {
	char buf[1024];
	size_t len;
};

static void put_str(struct line *l, const char *s)
{
	while (*s && l->len + 1 < sizeof(l->buf))
		l->buf[l->len++] = *s++;
}

static void put_hex(struct line *l, uint64_t v)
{
	char tmp[19];
	int n = 0;
	do {
		tmp[n++] = "0123456789abcdef"[v & 0xf];
		v >>= 4;
	} while (v);
	put_str(l, "0x");
	while (n > 0 && l->len + 1 < sizeof(l->buf))
		l->buf[l->len++] = tmp[--n];
}

static void put_dec(struct line *l, uint64_t v)
{
	char tmp[21];
	int n = 0;
	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n > 0 && l->len + 1 < sizeof(l->buf))
		l->buf[l->len++] = tmp[--n];
}

/* 1 write, 0 read, -1 unknown (the architecture does not tell). */
static int fault_was_write(const void *ctx)
{
#if defined(__x86_64__) && defined(REG_ERR)
	/* Bit 1 of the page-fault error code is set for writes. */
	return (((const ucontext_t *)ctx)->uc_mcontext.gregs[REG_ERR] & 2) ? 1 : 0;
#else
	(void)ctx;
	return -1;
#endif
}

static void report(int sig, uint64_t addr, int write_access)
{
	struct fr_table *t = atomic_load_explicit(&fr_current, memory_order_acquire);
	if (!t)
		return;
	for (size_t c = 0; c < t->n; c++) {
		const struct fr_client *cl = t->clients[c];
		for (size_t a = 0; a < cl->nallocs; a++) {
			const struct fr_alloc *al = &cl->allocs[a];
			if (addr < al->addr || addr - al->addr >= al->size)
				continue;
			/* The key is the last entry at or below the address inside this allocation. */
			const struct fr_key *key = NULL;
			size_t lo = 0, hi = cl->nkeys;
			while (lo < hi) {
				size_t mid = lo + (hi - lo) / 2;
				if (cl->keys[mid].addr <= addr)
					lo = mid + 1;
				else
					hi = mid;
			}
			if (lo > 0 && cl->keys[lo - 1].addr >= al->addr)
				key = &cl->keys[lo - 1];
			struct line l = { .len = 0 };
			put_str(&l, "gpufailover: ");
			put_str(&l, sig == SIGBUS ? "SIGBUS" : "SIGSEGV");
			put_str(&l, write_access == 1 ? ": write to " : write_access == 0 ? ": read of " : ": access to ");
			put_str(&l, cl->readonly ? "read-only GMS mapping at " : "GMS mapping at ");
			put_hex(&l, addr);
			put_str(&l, ": allocation ");
			put_dec(&l, al->id);
			put_str(&l, " tag \"");
			put_str(&l, al->tag);
			put_str(&l, "\" offset ");
			put_hex(&l, addr - al->addr);
			if (key) {
				put_str(&l, ", key \"");
				put_str(&l, key->name);
				put_str(&l, "\" +");
				put_hex(&l, addr - key->addr);
			} else {
				put_str(&l, ", no metadata key");
			}
			put_str(&l, cl->readonly ? " (GMS weights are shared read-only: keep mutable tensors out of them;"
						   " an unmapped (asleep) GMS faults too)\n"
						 : "\n");
			ssize_t done = 0;
			while ((size_t)done < l.len) {
				ssize_t w = write(STDERR_FILENO, l.buf + done, l.len - (size_t)done);
				if (w < 0 && errno == EINTR)
					continue;
				if (w <= 0)
					break;
				done += w;
			}
			return;
		}
	}
}

static void fr_handler(int sig, siginfo_t *si, void *ctx)
{
	int saved_errno = errno;
	/* si_code <= 0: sent by kill()/raise(), not a fault at an address. */
	if (si && si->si_code > 0)
		report(sig, (uint64_t)(uintptr_t)si->si_addr, fault_was_write(ctx));
	sigaction(sig, sig == SIGBUS ? &fr_prev_bus : &fr_prev_segv, NULL);
	errno = saved_errno;
	/* A real fault happens again on return and reaches the previous handler
	 * (or the default action); a sent signal has to be sent again. */
	if (!si || si->si_code <= 0)
		raise(sig);
}

/* ---- tables (built under fr_lock) ---- */

static void client_free(struct fr_client *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nkeys; i++)
		free(c->keys[i].name);
	free(c->keys);
	free(c->allocs);
	free(c);
}

static int key_cmp(const void *a, const void *b)
{
	const struct fr_key *x = a, *y = b;
	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static int client_snapshot(gf_gms *gms, struct fr_client **out)
{
	struct fr_client *c = calloc(1, sizeof(*c));
	if (!c)
		return gf_err(GF_ERR_NOMEM, "fault reporter: out of memory");
	c->gms = gms;
	c->readonly = gf_gms_granted_mode(gms) != GF_GMS_RW;
	size_t na = gf_gms_alloc_count(gms), nk = gf_gms_meta_count(gms);
	c->allocs = calloc(na ? na : 1, sizeof(*c->allocs));
	c->keys = calloc(nk ? nk : 1, sizeof(*c->keys));
	if (!c->allocs || !c->keys) {
		client_free(c);
		return gf_err(GF_ERR_NOMEM, "fault reporter: out of memory");
	}
	for (size_t i = 0; i < na; i++) {
		struct gf_gms_alloc_info info;
		if (gf_gms_alloc_at(gms, i, &info) < 0 || !info.addr)
			continue;
		struct fr_alloc *a = &c->allocs[c->nallocs++];
		a->id = info.id;
		a->addr = info.addr;
		a->size = info.size;
		memcpy(a->tag, info.tag, sizeof(a->tag));
		a->tag[sizeof(a->tag) - 1] = '\0';
	}
	if (!c->nallocs) {
		client_free(c);
		return gf_err(GF_ERR_STATE, "fault reporter: the GMS client has mapped nothing yet");
	}
	for (size_t i = 0; i < nk; i++) {
		struct gf_gms_meta m;
		if (gf_gms_meta_at(gms, i, &m) < 0 || !m.addr)
			continue;
		char *name = strdup(m.key);
		if (!name) {
			client_free(c);
			return gf_err(GF_ERR_NOMEM, "fault reporter: out of memory");
		}
		c->keys[c->nkeys].addr = m.addr;
		c->keys[c->nkeys].name = name;
		c->nkeys++;
	}
	qsort(c->keys, c->nkeys, sizeof(*c->keys), key_cmp);
	*out = c;
	return 0;
}

static int retire_client(struct fr_client *c)
{
	struct fr_client **grown = realloc(fr_retired_clients, (fr_nretired_clients + 1) * sizeof(*grown));
	if (!grown)
		return -1;
	fr_retired_clients = grown;
	fr_retired_clients[fr_nretired_clients++] = c;
	return 0;
}

/* Publish a table of @p n clients; the old one is retired, not freed. */
static int publish(struct fr_client **clients, size_t n)
{
	struct fr_table *t = NULL;
	if (n) {
		t = calloc(1, sizeof(*t));
		if (!t)
			return gf_err(GF_ERR_NOMEM, "fault reporter: out of memory");
		t->clients = malloc(n * sizeof(*t->clients));
		if (!t->clients) {
			free(t);
			return gf_err(GF_ERR_NOMEM, "fault reporter: out of memory");
		}
		memcpy(t->clients, clients, n * sizeof(*clients));
		t->n = n;
	}
	struct fr_table *old = atomic_exchange_explicit(&fr_current, t, memory_order_acq_rel);
	if (old) {
		old->retired_next = fr_retired;
		fr_retired = old;
	}
	return 0;
}

static int handler_is_ours(int sig)
{
	struct sigaction now;
	return sigaction(sig, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == fr_handler;
}

/* With nothing left to report: restore the handlers and free every table. */
static void shut_down(void)
{
	if (fr_installed) {
		if (handler_is_ours(SIGSEGV))
			sigaction(SIGSEGV, &fr_prev_segv, NULL);
		if (handler_is_ours(SIGBUS))
			sigaction(SIGBUS, &fr_prev_bus, NULL);
		fr_installed = 0;
	}
	while (fr_retired) {
		struct fr_table *next = fr_retired->retired_next;
		free(fr_retired->clients);
		free(fr_retired);
		fr_retired = next;
	}
	for (size_t i = 0; i < fr_nretired_clients; i++)
		client_free(fr_retired_clients[i]);
	free(fr_retired_clients);
	fr_retired_clients = NULL;
	fr_nretired_clients = 0;
}

GF_EXPORT int gf_gms_fault_reporter_install(gf_gms *gms)
{
	if (!gms)
		return gf_err(GF_ERR_INVALID_ARG, "fault reporter: NULL GMS client");
	struct fr_client *snap = NULL;
	int rc = client_snapshot(gms, &snap);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&fr_lock);
	struct fr_table *cur = atomic_load_explicit(&fr_current, memory_order_acquire);
	size_t n = cur ? cur->n : 0;
	struct fr_client **next = malloc((n + 1) * sizeof(*next));
	if (!next) {
		pthread_mutex_unlock(&fr_lock);
		client_free(snap);
		return gf_err(GF_ERR_NOMEM, "fault reporter: out of memory");
	}
	size_t m = 0;
	struct fr_client *replaced = NULL;
	for (size_t i = 0; i < n; i++) {
		if (cur->clients[i]->gms == gms)
			replaced = cur->clients[i];
		else
			next[m++] = cur->clients[i];
	}
	next[m++] = snap;
	rc = publish(next, m);
	if (rc < 0) {
		client_free(snap);
	} else {
		/* Should retiring fail, the old snapshot leaks rather than risk a
		 * handler reading freed memory. */
		if (replaced)
			retire_client(replaced);
		if (!fr_installed) {
			struct sigaction sa;
			memset(&sa, 0, sizeof(sa));
			sa.sa_sigaction = fr_handler;
			sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
			sigemptyset(&sa.sa_mask);
			if (sigaction(SIGSEGV, &sa, &fr_prev_segv) < 0) {
				rc = gf_err_errno(GF_ERR_IO, errno, "fault reporter: sigaction(SIGSEGV)");
			} else if (sigaction(SIGBUS, &sa, &fr_prev_bus) < 0) {
				rc = gf_err_errno(GF_ERR_IO, errno, "fault reporter: sigaction(SIGBUS)");
				sigaction(SIGSEGV, &fr_prev_segv, NULL);
			} else {
				fr_installed = 1;
			}
		}
	}
	free(next);
	pthread_mutex_unlock(&fr_lock);
	return rc;
}

GF_EXPORT void gf_gms_fault_reporter_remove(const gf_gms *gms)
{
	pthread_mutex_lock(&fr_lock);
	struct fr_table *cur = atomic_load_explicit(&fr_current, memory_order_acquire);
	size_t n = cur ? cur->n : 0, m = 0;
	struct fr_client **next = malloc((n ? n : 1) * sizeof(*next));
	if (next) {
		for (size_t i = 0; i < n; i++) {
			if (!gms || cur->clients[i]->gms == gms) {
				if (retire_client(cur->clients[i]) < 0)
					next[m++] = cur->clients[i]; /* keep it published rather than lose it */
			} else {
				next[m++] = cur->clients[i];
			}
		}
		if (m != n && publish(next, m) < 0) {
			/* Out of memory: the table stays as it was (clients retired twice
			 * would be freed twice), so take back the retirements. */
			fr_nretired_clients -= n - m;
		}
		free(next);
	}
	if (!atomic_load_explicit(&fr_current, memory_order_acquire))
		shut_down();
	pthread_mutex_unlock(&fr_lock);
}
