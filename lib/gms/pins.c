/* SPDX-License-Identifier: Apache-2.0 */
/* The pin watcher (pins.h): dropped layouts that released sleepers may still hold, seen through /proc. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common.h"
#include "pins.h"
#include "schema_limits.h"

static void event(struct gms_pins *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void event(struct gms_pins *p, const char *fmt, ...)
{
	char text[GF_LIMIT_EVENT_TEXT];
	va_list ap;
	va_start(ap, fmt);
	gf_log_vformat(text, sizeof(text), fmt, ap); /* values escaped: the text is logged as is */
	va_end(ap);
	if (p->event)
		p->event(p->ctx, text);
}

static int retired_alloc_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct gms_retired_alloc *)a)->ino, y = ((const struct gms_retired_alloc *)b)->ino;
	return x < y ? -1 : x > y;
}

static void retired_free(struct gms_retired *r)
{
	free(r->ids);
	free(r->h);
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

void gms_pins_retire(struct gms_pins *p, const struct gms_pins_layout *l, struct gms_pin_holder *h, size_t nh)
{
	struct gms_retired r = { .generation = l->generation, .at_unix_ms = gf_wall_us() / 1000, .reason = l->reason,
				 .h = h, .nholders = nh, .exact = l->exact, .bytes = l->bytes,
				 .allocs = (uint32_t)l->nallocs };
	if (!l->nallocs || (r.exact && !(r.ids = calloc(l->nallocs, sizeof(*r.ids))))) {
		retired_free(&r);
		return;
	}
	for (size_t i = 0; r.exact && i < l->nallocs; i++) {
		int fd;
		bool owned;
		uint64_t size;
		struct stat st;
		if (l->fd_at(l->ctx, i, &fd, &owned, &size) < 0)
			continue;
		if (fstat(fd, &st) == 0) {
			r.dev = st.st_dev;
			r.ids[r.n++] = (struct gms_retired_alloc){ (uint64_t)st.st_ino, size };
		}
		if (owned)
			gf_close(fd);
	}
	if (r.n)
		qsort(r.ids, r.n, sizeof(*r.ids), retired_alloc_cmp);
	if (p->nretired == GMS_PINS_RETIRED_MAX) {
		/* Bounded: the oldest record stops being watched, and says so. */
		event(p, "event=pins_untracked generation=%llu holders=%zu reason=\"more than %d dropped layouts watched\"",
		      (unsigned long long)p->retired[0].generation, p->retired[0].nholders, GMS_PINS_RETIRED_MAX);
		retired_free(&p->retired[0]);
		memmove(p->retired, p->retired + 1, (p->nretired - 1) * sizeof(*p->retired));
		p->nretired--;
	}
	struct gms_retired *n = realloc(p->retired, (p->nretired + 1) * sizeof(*n));
	if (!n) {
		retired_free(&r);
		return;
	}
	p->retired = n;
	p->retired[p->nretired++] = r;
	/* A sleeper that works lets go within milliseconds of its hangup: look then. */
	p->next_us = gf_now_us() + GMS_PINS_SETTLE_STEP_US;
}

static void mark_held(const struct gms_retired *r, uint64_t ino, bool *seen)
{
	struct gms_retired_alloc key = { .ino = ino };
	const struct gms_retired_alloc *a = bsearch(&key, r->ids, r->n, sizeof(*r->ids), retired_alloc_cmp);
	if (a)
		seen[a - r->ids] = true;
}

/*
 * What process @h->pid still holds of @r, through an fd or a mapping (a
 * fenced mapping counts: it keeps the pages as much as an fd does): 0 and
 * the figures set, 0 with none when the process is gone, or an error when it
 * cannot be told (no pid in this namespace, /proc not readable).
 */
static int scan_holder(const struct gms_retired *r, struct gms_pin_holder *h)
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

void gms_pins_scan(struct gms_pins *p)
{
	int64_t now_ms = gf_wall_us() / 1000;
	for (size_t i = 0; i < p->nretired;) {
		struct gms_retired *r = &p->retired[i];
		for (size_t k = 0; k < r->nholders;) {
			struct gms_pin_holder *h = &r->h[k];
			int rc = scan_holder(r, h);
			if (rc == 0 && h->bytes) {
				if (!h->reported && now_ms - r->at_unix_ms >= GMS_PINS_SETTLE_US / 1000) {
					h->reported = true;
					event(p, "event=still_pinned pid=%u peer=%s bytes=%llu allocations=%u generation=%llu "
						 "dropped_for=%s", h->pid, h->peer, (unsigned long long)h->bytes, h->allocs,
					      (unsigned long long)r->generation, r->reason);
				}
				k++;
				continue;
			}
			if (rc < 0)
				event(p, "event=pin_unknown pid=%u peer=%s generation=%llu reason=\"%s\"", h->pid, h->peer,
				      (unsigned long long)r->generation, gf_error_detail());
			else if (h->reported)
				event(p, "event=pin_released pid=%u peer=%s generation=%llu", h->pid, h->peer,
				      (unsigned long long)r->generation);
			r->h[k] = r->h[--r->nholders];
		}
		if (r->nholders) {
			i++;
			continue;
		}
		retired_free(r);
		memmove(r, r + 1, (p->nretired - i - 1) * sizeof(*r));
		p->nretired--;
	}
	p->next_us = gf_now_us() + GMS_PINS_SCAN_US;
}

uint64_t gms_pins_bytes(const struct gms_pins *p)
{
	uint64_t b = 0;
	for (size_t i = 0; i < p->nretired; i++)
		for (size_t k = 0; k < p->retired[i].nholders; k++)
			b += p->retired[i].h[k].bytes;
	return b;
}

void gms_pins_note(struct gms_pin_holder **h, size_t *n, bool exact, uint32_t pid, const char *peer)
{
	struct gms_pin_holder *g = realloc(*h, (*n + 1) * sizeof(**h));
	if (!g)
		return; /* not watched: the figure is then low, never wrongly high */
	*h = g;
	g[*n] = (struct gms_pin_holder){ .pid = pid };
	if (!exact)
		g[*n].ran0_err = task_switches(pid, &g[*n].ran0);
	snprintf(g[*n].peer, sizeof(g[*n].peer), "%s", peer);
	(*n)++;
}

void gms_pins_free(struct gms_pins *p)
{
	for (size_t i = 0; i < p->nretired; i++)
		retired_free(&p->retired[i]);
	free(p->retired);
	p->retired = NULL;
	p->nretired = 0;
}
