/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The public memory API over the backend vtable: backend choice, the
 * per-allocation state machine (docs/design.md, rule 3: no double release, no use
 * after release) and all-or-nothing mapping of many allocations (rule 4).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

struct gf_mem_alloc {
	gf_mem *m;
	uint64_t handle;
	size_t size;
	int origin;          /* GF_MEM_ALLOC_CREATED or GF_MEM_ALLOC_IMPORTED */
	bool released;
	bool was_mapped;
	unsigned map_count;  /* live mappings of this handle, in any reservation */
	bool freed;          /* its owner let go while mapped: it goes with its last mapping */
	int ro_fd;           /* read-only export, opened once and lent to every reader (-1: none yet) */
};

struct va_map {
	size_t offset, size;
	gf_mem_alloc *alloc;
	int access;
	bool parked; /* fenced by moving it to the parking range (see gf_mem_set_accessible) */
	bool left_park; /* moved back out of the parking range: its place there is a hole, not ours */
};

struct gf_mem_va {
	gf_mem *m;
	uint64_t addr;
	size_t size;
	struct va_map *maps; /* sorted by offset, never overlapping */
	size_t nmaps, cap;
	/* While mappings are parked: a range of @size holding them at their
	 * offsets; after the opening, what is left of it until it is given
	 * back (drop_park()); else 0. */
	uint64_t park;
};

static size_t round_up(size_t v, size_t to)
{
	return (v + to - 1) / to * to;
}

static bool is_pow2(size_t v)
{
	return v && !(v & (v - 1));
}

const struct gf_mem_backend *gf_mem_backend_get(int kind)
{
	switch (kind) {
	case GF_MEM_HOST:
		return &gf_mem_host_backend;
	case GF_MEM_CUDA:
#if GF_HAVE_CUDA
		return &gf_mem_cuda_backend;
#else
		gf_err(GF_ERR_NOT_SUPPORTED, "cuda backend: library built without cuda.h (no CUDA toolkit at build time)");
		return NULL;
#endif
	default:
		gf_err(GF_ERR_INVALID_ARG, "unknown memory backend kind %d", kind);
		return NULL;
	}
}

void gf_mem_format_uuid(const char *prefix, const uint8_t u[16], char *buf, size_t len)
{
	snprintf(buf, len,
		 "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 prefix, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
		 u[11], u[12], u[13], u[14], u[15]);
}

/* "GPU-", "MIG-" or "HOST-" for device @index of @be. */
static const char *uuid_prefix(const struct gf_mem_backend *be, int index)
{
	return be->device_mig && be->device_mig(index) ? "MIG-" : be->uuid_prefix;
}

static void mem_unref(gf_mem *m)
{
	if (atomic_fetch_sub(&m->refs, 1) == 1) {
		m->be->close(m);
		pthread_mutex_destroy(&m->uuid_mu);
		free(m);
	}
}

static int open_kind(const struct gf_mem_backend *be, int device, gf_mem **out)
{
	gf_mem *m = calloc(1, sizeof(*m));
	if (!m)
		return gf_err(GF_ERR_NOMEM, "gf_mem_open");
	m->be = be;
	m->device = device;
	atomic_init(&m->refs, 1);
	pthread_mutex_init(&m->uuid_mu, NULL);
	int rc = be->open(m, device);
	if (rc < 0) {
		pthread_mutex_destroy(&m->uuid_mu);
		free(m);
		return rc;
	}
	rc = be->granularity(m, &m->gran_min, &m->gran_rec);
	if (rc == 0 && (!is_pow2(m->gran_min) || !is_pow2(m->gran_rec)))
		rc = gf_err(GF_ERR_DRIVER, "%s backend reported granularity %zu/%zu, not powers of two",
			    be->name, m->gran_min, m->gran_rec);
	if (rc < 0) {
		be->close(m);
		pthread_mutex_destroy(&m->uuid_mu);
		free(m);
		return rc;
	}
	*out = m;
	return 0;
}

GF_EXPORT int gf_mem_open(gf_mem **out, int kind, int device)
{
	if (!out || device < 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_open: %s", !out ? "out is NULL" : "negative device");
	if (kind != GF_MEM_AUTO) {
		const struct gf_mem_backend *be = gf_mem_backend_get(kind);
		if (!be)
			return kind == GF_MEM_CUDA ? GF_ERR_NOT_SUPPORTED : GF_ERR_INVALID_ARG;
		return open_kind(be, device, out);
	}
	const struct gf_mem_backend *cuda = gf_mem_backend_get(GF_MEM_CUDA);
	int rc = cuda ? open_kind(cuda, device, out) : GF_ERR_NOT_SUPPORTED;
	if (rc == 0) {
		gf_log(GF_LOG_INFO, "mem", "backend=cuda device=%d msg=\"auto: using the cuda backend\"", device);
		return 0;
	}
	char why[512];
	snprintf(why, sizeof(why), "%s", gf_error_detail());
	rc = open_kind(&gf_mem_host_backend, device, out);
	if (rc < 0)
		return rc;
	gf_log(GF_LOG_INFO, "mem", "backend=host device=%d reason=\"%s\" msg=\"auto: cuda backend not usable, using host\"",
	       device, why);
	return 0;
}

GF_EXPORT void gf_mem_free(gf_mem *m)
{
	if (m)
		mem_unref(m);
}

GF_EXPORT int gf_mem_kind(const gf_mem *m)
{
	return m ? m->be->kind : GF_ERR_INVALID_ARG;
}

GF_EXPORT const char *gf_mem_kind_name(int kind)
{
	switch (kind) {
	case GF_MEM_AUTO:
		return "auto";
	case GF_MEM_CUDA:
		return "cuda";
	case GF_MEM_HOST:
		return "host";
	default:
		return "unknown";
	}
}

GF_EXPORT int gf_mem_device(const gf_mem *m)
{
	return m ? m->device : GF_ERR_INVALID_ARG;
}

GF_EXPORT int gf_mem_device_count(int kind, int *out)
{
	if (!out)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_device_count: out is NULL");
	const struct gf_mem_backend *be = gf_mem_backend_get(kind);
	if (!be)
		return kind == GF_MEM_CUDA ? GF_ERR_NOT_SUPPORTED : GF_ERR_INVALID_ARG;
	return be->device_count(out);
}

GF_EXPORT int gf_mem_device_uuid(gf_mem *m, char *buf, size_t len)
{
	uint8_t u[16];
	if (!m || !buf || len < 48)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_device_uuid: need a backend and a buffer of >= 48 bytes");
	int rc = 0;
	pthread_mutex_lock(&m->uuid_mu);
	if (!m->uuid_known && (rc = m->be->device_uuid(m->device, u)) == 0) {
		gf_mem_format_uuid(uuid_prefix(m->be, m->device), u, m->uuid, sizeof(m->uuid));
		m->uuid_known = true;
	}
	if (rc == 0)
		snprintf(buf, len, "%s", m->uuid);
	pthread_mutex_unlock(&m->uuid_mu);
	return rc < 0 ? rc : 0;
}

GF_EXPORT int gf_mem_uuid_to_index(int kind, const char *uuid, int *out_index)
{
	if (!uuid || !*uuid || !out_index)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_uuid_to_index: empty uuid or NULL out");
	const struct gf_mem_backend *be = gf_mem_backend_get(kind);
	if (!be)
		return kind == GF_MEM_CUDA ? GF_ERR_NOT_SUPPORTED : GF_ERR_INVALID_ARG;
	int n, rc = be->device_count(&n);
	if (rc < 0)
		return rc;
	int found = -1, matches = 0;
	for (int i = 0; i < n; i++) {
		uint8_t u[16];
		char s[64];
		rc = be->device_uuid(i, u);
		if (rc < 0)
			return rc;
		const char *prefix = uuid_prefix(be, i);
		gf_mem_format_uuid(prefix, u, s, sizeof(s));
		/* As CUDA_VISIBLE_DEVICES: "GPU-"/"MIG-" full or unique prefix,
		 * also without the prefix. */
		if (strncasecmp(s, uuid, strlen(uuid)) == 0 ||
		    strncasecmp(s + strlen(prefix), uuid, strlen(uuid)) == 0) {
			found = i;
			matches++;
		}
	}
	if (matches == 0)
		return gf_err(GF_ERR_NOT_FOUND, "no %s device has uuid %s", be->name, uuid);
	if (matches > 1)
		return gf_err(GF_ERR_INVALID_ARG, "uuid prefix %s matches %d %s devices", uuid, matches, be->name);
	*out_index = found;
	return 0;
}

GF_EXPORT int gf_device_find_by_uuid(int kind, const char *uuid, int *out_index)
{
	return gf_mem_uuid_to_index(kind, uuid, out_index);
}

GF_EXPORT int gf_device_parse(int kind, const char *spec, int *out_index)
{
	if (!spec || !*spec || !out_index)
		return gf_err(GF_ERR_INVALID_ARG, "device: empty device or NULL out");
	if (kind == GF_MEM_AUTO) {
		/* a UUID names a GPU when one matches, else the host "device" */
		int rc = gf_device_parse(GF_MEM_CUDA, spec, out_index);
		return rc == 0 ? 0 : gf_device_parse(GF_MEM_HOST, spec, out_index);
	}
	const struct gf_mem_backend *be = gf_mem_backend_get(kind);
	if (!be)
		return kind == GF_MEM_CUDA ? GF_ERR_NOT_SUPPORTED : GF_ERR_INVALID_ARG;
	if (strspn(spec, "0123456789") != strlen(spec))
		return gf_device_find_by_uuid(kind, spec, out_index);
	int n, rc = be->device_count(&n);
	if (rc < 0)
		return rc;
	long v = strlen(spec) > 6 ? -1 : strtol(spec, NULL, 10);
	if (v < 0 || v >= n)
		return gf_err(GF_ERR_NOT_FOUND, "device %s: no such %s device (%d visible: index 0..%d, or a UUID)", spec,
			      be->name, n, n - 1);
	*out_index = (int)v;
	return 0;
}

GF_EXPORT int gf_device_list(int kind, struct gf_device_info *out, size_t cap, size_t *n)
{
	if ((!out && cap) || !n)
		return gf_err(GF_ERR_INVALID_ARG, "gf_device_list: NULL argument");
	const struct gf_mem_backend *be = gf_mem_backend_get(kind);
	if (!be)
		return kind == GF_MEM_CUDA ? GF_ERR_NOT_SUPPORTED : GF_ERR_INVALID_ARG;
	int count, rc = be->device_count(&count);
	if (rc < 0)
		return rc;
	*n = (size_t)count;
	for (int i = 0; i < count && (size_t)i < cap; i++) {
		struct gf_device_info *d = &out[i];
		uint8_t u[16];
		memset(d, 0, sizeof(*d));
		d->index = i;
		if ((rc = be->device_uuid(i, u)) < 0)
			return rc;
		d->mig = be->device_mig && be->device_mig(i);
		gf_mem_format_uuid(uuid_prefix(be, i), u, d->uuid, sizeof(d->uuid));
		if (be->device_name) {
			if ((rc = be->device_name(i, d->name, sizeof(d->name))) < 0)
				return rc;
		} else {
			snprintf(d->name, sizeof(d->name), "%s", be->name);
		}
		/* Free memory needs a context on the device: the backend opened
		 * for the question (on cuda, the primary context retained and
		 * released again). */
		gf_mem *m = NULL;
		if ((rc = open_kind(be, i, &m)) < 0)
			return rc;
		rc = be->info(m, &d->free_bytes, &d->total_bytes);
		gf_mem_free(m);
		if (rc < 0)
			return rc;
	}
	return 0;
}

GF_EXPORT int gf_mem_read_protection(gf_mem *m)
{
	if (!m)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_read_protection: NULL backend");
	return m->be->read_protection ? m->be->read_protection(m) : GF_MEM_READ_PROT_ENFORCED;
}

GF_EXPORT const char *gf_mem_read_protection_name(int prot)
{
	switch (prot) {
	case GF_MEM_READ_PROT_UNTESTED:
		return "untested";
	case GF_MEM_READ_PROT_ENFORCED:
		return "enforced";
	case GF_MEM_READ_PROT_REJECTED:
		return "rejected";
	case GF_MEM_READ_PROT_IGNORED:
		return "ignored";
	default:
		return "unknown";
	}
}

GF_EXPORT int gf_mem_device_lost(const gf_mem *m)
{
	if (!m)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_device_lost: NULL backend");
	return m->be->lost && m->be->lost() ? 1 : 0;
}

GF_EXPORT int gf_mem_granularity(gf_mem *m, size_t *minimum, size_t *recommended)
{
	if (!m)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_granularity: NULL backend");
	if (minimum)
		*minimum = m->gran_min;
	if (recommended)
		*recommended = m->gran_rec;
	return 0;
}

GF_EXPORT int gf_mem_info(gf_mem *m, uint64_t *free_bytes, uint64_t *total_bytes)
{
	uint64_t f, t;
	if (!m)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_info: NULL backend");
	int rc = m->be->info(m, &f, &t);
	if (rc < 0)
		return rc;
	if (free_bytes)
		*free_bytes = f;
	if (total_bytes)
		*total_bytes = t;
	return 0;
}

GF_EXPORT int gf_mem_has_free(gf_mem *m, uint64_t need, uint64_t *free_bytes)
{
	if (!m)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_has_free: NULL backend");
	if (m->be->plenty_free && m->be->plenty_free(m, need))
		return 1;
	uint64_t f, t;
	int rc = gf_mem_info(m, &f, &t);
	if (rc < 0)
		return rc;
	if (f >= need)
		return 1;
	if (free_bytes)
		*free_bytes = f;
	return 0;
}

GF_EXPORT int gf_mem_synchronize(gf_mem *m)
{
	if (!m)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_synchronize: NULL backend");
	return m->be->synchronize(m);
}

static int new_alloc(gf_mem *m, uint64_t handle, size_t size, int origin, gf_mem_alloc **out)
{
	gf_mem_alloc *a = calloc(1, sizeof(*a));
	if (!a) {
		m->be->release(m, handle);
		return gf_err(GF_ERR_NOMEM, "gf_mem_alloc");
	}
	a->m = m;
	a->handle = handle;
	a->size = size;
	a->origin = origin;
	a->ro_fd = -1;
	atomic_fetch_add(&m->refs, 1);
	*out = a;
	return 0;
}

GF_EXPORT int gf_mem_create(gf_mem_alloc **out, gf_mem *m, size_t size)
{
	if (!m || !out || size == 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_create: %s", size == 0 ? "size is 0" : "NULL argument");
	if (size > SIZE_MAX - m->gran_min)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_create: size %zu too large", size);
	size = round_up(size, m->gran_min);
	uint64_t h;
	int rc = m->be->create(m, size, &h);
	if (rc < 0)
		return rc;
	return new_alloc(m, h, size, GF_MEM_ALLOC_CREATED, out);
}

GF_EXPORT int gf_mem_export(gf_mem_alloc *a, int *out_fd)
{
	if (!a || !out_fd)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_export: NULL argument");
	if (a->released)
		return gf_err(GF_ERR_STATE, "gf_mem_export: allocation already released");
	return a->m->be->export_fd(a->m, a->handle, out_fd);
}

GF_EXPORT int gf_mem_import(gf_mem_alloc **out, gf_mem *m, int fd, size_t size)
{
	if (!m || !out || fd < 0 || size == 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_import: %s",
			      fd < 0 ? "negative fd" : size == 0 ? "size is 0" : "NULL argument");
	if (size > SIZE_MAX - m->gran_min)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_import: size %zu too large", size);
	size = round_up(size, m->gran_min);
	uint64_t h;
	int rc = m->be->import_fd(m, fd, size, &h);
	if (rc < 0)
		return rc;
	return new_alloc(m, h, size, GF_MEM_ALLOC_IMPORTED, out);
}

int gf_mem_import_adopt(gf_mem_alloc **out, gf_mem *m, int fd, size_t size)
{
	if (!m || !out || fd < 0 || size == 0 || size > SIZE_MAX - m->gran_min) {
		gf_close(fd);
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_import_adopt: %s",
			      fd < 0 ? "negative fd" : size == 0 ? "size is 0" : !m || !out ? "NULL argument" : "size too large");
	}
	size = round_up(size, m->gran_min);
	uint64_t h;
	int rc;
	if (m->be->import_adopt) {
		rc = m->be->import_adopt(m, fd, size, &h);
		if (rc < 0)
			gf_close(fd);
	} else {
		rc = m->be->import_fd(m, fd, size, &h);
		gf_close(fd);
	}
	if (rc < 0)
		return rc;
	return new_alloc(m, h, size, GF_MEM_ALLOC_IMPORTED, out);
}

int gf_mem_export_borrowed(gf_mem_alloc *a, int *fd, bool *owned)
{
	if (!a || !fd || !owned)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_export_borrowed: NULL argument");
	if (a->released)
		return gf_err(GF_ERR_STATE, "gf_mem_export_borrowed: allocation already released");
	if (a->m->be->export_borrow) {
		int rc = a->m->be->export_borrow(a->m, a->handle, fd);
		if (rc == 0)
			*owned = false;
		return rc;
	}
	int rc = a->m->be->export_fd(a->m, a->handle, fd);
	if (rc == 0)
		*owned = true;
	return rc;
}

int gf_mem_export_readonly(gf_mem_alloc *a, int *fd, bool *owned)
{
	if (!a || !fd || !owned)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_export_readonly: NULL argument");
	if (a->released)
		return gf_err(GF_ERR_STATE, "gf_mem_export_readonly: allocation already released");
	if (!a->m->be->export_readonly)
		return gf_mem_export_borrowed(a, fd, owned);
	/* One read-only description serves every reader and every wake: opening
	 * a new one per list was the largest per-allocation cost of a remap. */
	if (a->ro_fd < 0) {
		int rc = a->m->be->export_readonly(a->m, a->handle, &a->ro_fd);
		if (rc < 0)
			return rc;
	}
	*fd = a->ro_fd;
	*owned = false;
	return 0;
}

unsigned gf_mem_caps(const gf_mem *m)
{
	if (!m)
		return 0;
	return m->be->caps | (m->be->protect ? GF_MEM_CAP_FENCE : 0);
}

int gf_mem_seal(gf_mem_alloc *a)
{
	if (!a)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_seal: NULL allocation");
	if (a->released)
		return gf_err(GF_ERR_STATE, "gf_mem_seal: allocation already released");
	if (!a->m->be->seal)
		return gf_err(GF_ERR_NOT_SUPPORTED, "gf_mem_seal: the %s backend cannot seal memory", a->m->be->name);
	return a->m->be->seal(a->m, a->handle);
}

GF_EXPORT size_t gf_mem_alloc_size(const gf_mem_alloc *a)
{
	return a ? a->size : 0;
}

GF_EXPORT int gf_mem_alloc_state(const gf_mem_alloc *a)
{
	if (!a)
		return GF_ERR_INVALID_ARG;
	if (a->released)
		return GF_MEM_ALLOC_RELEASED;
	if (a->map_count)
		return GF_MEM_ALLOC_MAPPED;
	if (a->was_mapped)
		return GF_MEM_ALLOC_UNMAPPED;
	return a->origin;
}

GF_EXPORT int gf_mem_release(gf_mem_alloc *a)
{
	if (!a)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_release: NULL allocation");
	if (a->released)
		return gf_err(GF_ERR_STATE, "gf_mem_release: allocation already released");
	if (a->map_count)
		return gf_err(GF_ERR_BUSY, "gf_mem_release: allocation still mapped %u time(s)", a->map_count);
	int rc = a->m->be->release(a->m, a->handle);
	if (rc < 0)
		return rc;
	gf_close(a->ro_fd);
	a->ro_fd = -1;
	a->released = true;
	return 0;
}

/* The end of an allocation nobody holds or maps any more. A release the
 * driver refuses cannot be retried by anyone: the object goes anyway, and
 * the process's exit returns what the driver kept. */
static void alloc_destroy(gf_mem_alloc *a)
{
	if (!a->released)
		a->m->be->release(a->m, a->handle);
	gf_close(a->ro_fd);
	mem_unref(a->m);
	free(a);
}

/* After a mapping of @a went away: an allocation its owner freed while
 * mapped goes with its last mapping. */
static void alloc_unmapped(gf_mem_alloc *a)
{
	a->map_count--;
	if (!a->map_count && a->freed)
		alloc_destroy(a);
}

GF_EXPORT void gf_mem_alloc_free(gf_mem_alloc *a)
{
	if (!a)
		return;
	if (a->map_count)
		a->freed = true;
	else
		alloc_destroy(a);
}

GF_EXPORT int gf_mem_reserve(gf_mem_va **out, gf_mem *m, size_t size, size_t align)
{
	if (!m || !out || size == 0)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_reserve: %s", size == 0 ? "size is 0" : "NULL argument");
	if (align && !is_pow2(align))
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_reserve: alignment %zu is not a power of two", align);
	if (size > SIZE_MAX / 4 || align > SIZE_MAX / 4)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_reserve: size %zu or alignment %zu too large", size, align);
	if (align < m->gran_min)
		align = m->gran_min;
	size = round_up(size, m->gran_min);
	gf_mem_va *va = calloc(1, sizeof(*va));
	if (!va)
		return gf_err(GF_ERR_NOMEM, "gf_mem_reserve");
	int rc = m->be->reserve(m, size, align, &va->addr);
	if (rc < 0) {
		free(va);
		return rc;
	}
	va->m = m;
	va->size = size;
	atomic_fetch_add(&m->refs, 1);
	*out = va;
	return 0;
}

GF_EXPORT uint64_t gf_mem_va_addr(const gf_mem_va *va)
{
	return va ? va->addr : 0;
}

GF_EXPORT size_t gf_mem_va_size(const gf_mem_va *va)
{
	return va ? va->size : 0;
}

static int cmp_map(const void *x, const void *y)
{
	const struct va_map *a = x, *b = y;
	return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Does [off, off+size) overlap an existing mapping of @va? va->maps is sorted
 * and disjoint: only the last mapping starting below off+size can. */
static bool overlaps_existing(const gf_mem_va *va, size_t off, size_t size)
{
	size_t lo = 0, hi = va->nmaps;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (va->maps[mid].offset < off + size)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo > 0 && off < va->maps[lo - 1].offset + va->maps[lo - 1].size;
}

static void unmap_one(gf_mem_va *va, const struct va_map *vm)
{
	int rc = va->m->be->unmap(va->m, va->addr + vm->offset, vm->size);
	if (rc < 0)
		gf_log(GF_LOG_WARN, "mem", "backend=%s offset=%zu size=%zu msg=\"unmap failed: %s\"", va->m->be->name,
		       vm->offset, vm->size, gf_error_detail());
	alloc_unmapped(vm->alloc);
}

GF_EXPORT int gf_mem_map_many(gf_mem_va *va, const struct gf_mem_mapping *maps, size_t n, int access)
{
	if (!va || (n && !maps))
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_map_many: NULL argument");
	if (access != GF_MEM_READ && access != GF_MEM_READWRITE)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_map_many: access %d is neither GF_MEM_READ nor GF_MEM_READWRITE", access);
	if (n == 0)
		return 0;
	gf_mem *m = va->m;
	if (n > SIZE_MAX / sizeof(struct va_map) - va->nmaps)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_map_many: too many mappings");
	struct va_map *plan = malloc(n * sizeof(*plan));
	if (!plan)
		return gf_err(GF_ERR_NOMEM, "gf_mem_map_many");
	int rc = 0;
	bool in_order = true; /* callers map in address order: no sort needed then */
	for (size_t i = 0; i < n && rc == 0; i++) {
		gf_mem_alloc *a = maps[i].alloc;
		size_t off = maps[i].offset;
		if (i && off < maps[i - 1].offset)
			in_order = false;
		if (!a)
			rc = gf_err(GF_ERR_INVALID_ARG, "gf_mem_map_many: entry %zu has no allocation", i);
		else if (a->released)
			rc = gf_err(GF_ERR_STATE, "gf_mem_map_many: entry %zu: allocation already released", i);
		else if (a->m->be != m->be || a->m->device != m->device)
			rc = gf_err(GF_ERR_INVALID_ARG, "gf_mem_map_many: entry %zu belongs to another backend or device", i);
		else if (off % m->gran_min)
			rc = gf_err(GF_ERR_INVALID_ARG, "gf_mem_map_many: entry %zu: offset %zu not aligned to %zu", i, off,
				    m->gran_min);
		else if (off > va->size || a->size > va->size - off)
			rc = gf_err(GF_ERR_INVALID_ARG, "gf_mem_map_many: entry %zu: [%zu, +%zu) outside the %zu-byte reservation",
				    i, off, a->size, va->size);
		else if (overlaps_existing(va, off, a->size))
			rc = gf_err(GF_ERR_INVALID_ARG, "gf_mem_map_many: entry %zu: offset %zu overlaps an existing mapping", i, off);
		plan[i] = (struct va_map){ off, a ? a->size : 0, a, access };
	}
	if (rc == 0) {
		if (!in_order)
			qsort(plan, n, sizeof(*plan), cmp_map);
		for (size_t i = 1; i < n && rc == 0; i++)
			if (plan[i].offset < plan[i - 1].offset + plan[i - 1].size)
				rc = gf_err(GF_ERR_INVALID_ARG, "gf_mem_map_many: entries at offsets %zu and %zu overlap",
					    plan[i - 1].offset, plan[i].offset);
	}
	if (rc == 0 && va->nmaps + n > va->cap) {
		size_t cap = va->cap ? va->cap : 8;
		while (cap < va->nmaps + n)
			cap *= 2;
		struct va_map *nm = realloc(va->maps, cap * sizeof(*nm));
		if (!nm)
			rc = gf_err(GF_ERR_NOMEM, "gf_mem_map_many");
		else {
			va->maps = nm;
			va->cap = cap;
		}
	}
	if (rc < 0) {
		free(plan);
		return rc;
	}

	size_t done = 0;
	for (; done < n; done++) {
		rc = m->be->map(m, va->addr + plan[done].offset, plan[done].size, plan[done].alloc->handle, access);
		if (rc < 0)
			break;
		plan[done].alloc->map_count++;
	}
	/* Access once per contiguous span (the driver's cost is per call). */
	if (rc == 0 && m->be->set_access) {
		for (size_t s = 0; s < n && rc == 0;) {
			size_t e = s + 1;
			while (e < n && plan[e].offset == plan[e - 1].offset + plan[e - 1].size)
				e++;
			size_t len = plan[e - 1].offset + plan[e - 1].size - plan[s].offset;
			rc = m->be->set_access(m, va->addr + plan[s].offset, len, access);
			s = e;
		}
	}
	if (rc < 0) {
		/* All-or-nothing: undo what this call mapped, keep the error. */
		char why[512];
		snprintf(why, sizeof(why), "%s", gf_error_detail());
		for (size_t i = 0; i < done; i++)
			unmap_one(va, &plan[i]);
		free(plan);
		return gf_err(rc, "%s", why);
	}
	for (size_t i = 0; i < n; i++)
		plan[i].alloc->was_mapped = true;
	/* Mapping in address order (a writer allocating, a reader mapping all) keeps the table sorted. */
	bool sorted = va->nmaps == 0 || va->maps[va->nmaps - 1].offset < plan[0].offset;
	memcpy(va->maps + va->nmaps, plan, n * sizeof(*plan));
	va->nmaps += n;
	if (!sorted)
		qsort(va->maps, va->nmaps, sizeof(*va->maps), cmp_map);
	free(plan);
	return 0;
}

GF_EXPORT int gf_mem_map(gf_mem_va *va, size_t offset, gf_mem_alloc *a, int access)
{
	struct gf_mem_mapping one = { offset, a };
	return gf_mem_map_many(va, &one, 1, access);
}

static void free_park_piece(gf_mem_va *va, size_t from, size_t to)
{
	if (to > from && va->m->be->free_va(va->m, va->park + from, to - from) < 0)
		gf_log(GF_LOG_WARN, "mem", "backend=%s msg=\"freeing the parking range failed: %s\"", va->m->be->name,
		       gf_error_detail());
}

/*
 * Gives the parking range back with the parked mappings in it (their own
 * addresses hold placeholders already), but not the places of mappings
 * moved back out of it: those were unmapped by the move, and the address
 * space may be somebody else's since.
 */
static void drop_park(gf_mem_va *va)
{
	if (!va->park)
		return;
	size_t from = 0;
	for (size_t i = 0; i < va->nmaps; i++) {
		struct va_map *mp = &va->maps[i];
		if (mp->left_park) {
			free_park_piece(va, from, mp->offset);
			from = mp->offset + mp->size;
		}
		mp->parked = false;
		mp->left_park = false;
	}
	free_park_piece(va, from, va->size);
	va->park = 0;
}

GF_EXPORT int gf_mem_unmap_all(gf_mem_va *va)
{
	if (!va)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_unmap_all: NULL reservation");
	drop_park(va);
	int rc = 0;
	for (size_t s = 0; s < va->nmaps;) {
		/* One call per contiguous span where the backend can (host: one mmap instead of one per allocation). */
		size_t e = s + 1;
		while (va->m->be->unmap_spans && e < va->nmaps &&
		       va->maps[e].offset == va->maps[e - 1].offset + va->maps[e - 1].size)
			e++;
		size_t len = va->maps[e - 1].offset + va->maps[e - 1].size - va->maps[s].offset;
		int r = va->m->be->unmap(va->m, va->addr + va->maps[s].offset, len);
		if (r < 0 && rc == 0)
			rc = r;
		/* The bookkeeping follows the caller's intent: a failed unmap
		 * is reported, and the allocation is not kept pinned by it. */
		for (size_t i = s; i < e; i++)
			alloc_unmapped(va->maps[i].alloc);
		s = e;
	}
	va->nmaps = 0;
	return rc;
}

/*
 * A mapping at least this large is fenced by moving it away to a parking
 * range (one mremap on host, its page tables kept) instead of protecting it
 * in place, whose cost grows with its populated pages (about 30 ms per GiB
 * of 4 KiB pages); below it, one mprotect per span of small mappings costs
 * less than one move per mapping.
 */
#define PARK_MIN_BYTES ((size_t)256 << 10)

static bool parkable(const gf_mem_va *va, const struct va_map *mp)
{
	return va->m->be->move && mp->size >= PARK_MIN_BYTES;
}

/* Fences (@on 0) or reopens every span of adjacent, same-access mappings
 * that are not parked. Stops at the first error. */
static int protect_in_place(gf_mem_va *va, int on)
{
	int rc = 0;
	for (size_t s = 0; s < va->nmaps && rc == 0;) {
		if (va->maps[s].parked) {
			s++;
			continue;
		}
		size_t e = s + 1;
		while (e < va->nmaps && !va->maps[e].parked &&
		       va->maps[e].offset == va->maps[e - 1].offset + va->maps[e - 1].size &&
		       va->maps[e].access == va->maps[s].access)
			e++;
		size_t len = va->maps[e - 1].offset + va->maps[e - 1].size - va->maps[s].offset;
		rc = va->m->be->protect(va->m, va->addr + va->maps[s].offset, len, on ? va->maps[s].access : 0);
		s = e;
	}
	return rc;
}

/* Set once a move of several mappings at once failed where the backend said it could: one by one from then on. */
static atomic_bool span_moves_refused;

/*
 * Moves parked mappings @s..@e-1, adjacent in the parking range, back in
 * one move; false when not done (the caller moves them one by one). A move
 * that fails where the backend said it could may have moved some: those
 * then fail to move again, and the caller's failure path unmaps them
 * wherever they are.
 */
static bool unpark_span(gf_mem_va *va, size_t s, size_t e)
{
	if (e - s < 2 || !va->m->be->move_spans || atomic_load_explicit(&span_moves_refused, memory_order_relaxed) ||
	    !va->m->be->move_spans(va->m))
		return false;
	size_t start = va->maps[s].offset, len = va->maps[e - 1].offset + va->maps[e - 1].size - start;
	if (va->m->be->move(va->m, va->park + start, len, va->addr + start, false) < 0) {
		atomic_store_explicit(&span_moves_refused, true, memory_order_relaxed);
		gf_log(GF_LOG_DEBUG, "mem", "backend=%s msg=\"moving %zu mappings at once failed, moving them one by one\" error=\"%s\"",
		       va->m->be->name, e - s, gf_error_detail());
		return false;
	}
	for (size_t i = s; i < e; i++) {
		va->maps[i].parked = false;
		va->maps[i].left_park = true;
	}
	return true;
}

/*
 * Moves every parked mapping back to its own address. What is left of the
 * parking range (address space, no memory) is given back by the next fence,
 * gf_mem_unmap_all() or gf_mem_va_free(), not here: a system call less on
 * a wake. Each run of adjacent parked mappings goes back
 * in one move where the backend can (the wake of 1 GiB in 256 mappings:
 * one mremap instead of 256). A mapping that cannot be moved stays parked
 * and the error is returned: the caller's failure path unmaps everything,
 * wherever it is.
 */
static int unpark(gf_mem_va *va)
{
	int rc = 0;
	for (size_t s = 0; s < va->nmaps;) {
		if (!va->maps[s].parked) {
			s++;
			continue;
		}
		size_t e = s + 1;
		while (e < va->nmaps && va->maps[e].parked &&
		       va->maps[e].offset == va->maps[e - 1].offset + va->maps[e - 1].size)
			e++;
		if (unpark_span(va, s, e)) {
			s = e;
			continue;
		}
		for (; s < e; s++) {
			struct va_map *mp = &va->maps[s];
			int r = va->m->be->move(va->m, va->park + mp->offset, mp->size, va->addr + mp->offset, false);
			if (r < 0) {
				if (rc == 0)
					rc = r;
				continue;
			}
			mp->parked = false;
			mp->left_park = true;
		}
	}
	return rc;
}

GF_EXPORT int gf_mem_set_accessible(gf_mem_va *va, int on)
{
	if (!va)
		return gf_err(GF_ERR_INVALID_ARG, "gf_mem_set_accessible: NULL reservation");
	if (!va->m->be->protect)
		return gf_err(GF_ERR_NOT_SUPPORTED, "%s backend: mappings cannot be fenced in place (unmap them)",
			      va->m->be->name);
	if (on) {
		/* The mappings fenced in place first: a parked one kept its access
		 * where it was parked, and moving it back is all it needs (one
		 * more mprotect of it would walk its page tables for nothing). */
		int r2 = protect_in_place(va, 1);
		int rc = unpark(va);
		return rc < 0 ? rc : r2;
	}
	int rc = 0;
	bool parked = false;
	for (size_t i = 0; i < va->nmaps; i++)
		parked |= va->maps[i].parked;
	if (!parked)
		drop_park(va); /* what the last opening left of it, holes included */
	for (size_t i = 0; i < va->nmaps && rc == 0; i++) {
		struct va_map *mp = &va->maps[i];
		if (mp->parked || !parkable(va, mp))
			continue;
		if (!va->park)
			rc = va->m->be->reserve(va->m, va->size, va->m->gran_min, &va->park);
		if (rc == 0)
			rc = va->m->be->move(va->m, va->addr + mp->offset, mp->size, va->park + mp->offset, true);
		if (rc == 0)
			mp->parked = true;
	}
	if (rc == 0)
		rc = protect_in_place(va, 0);
	if (rc < 0) {
		/* Half fenced is no fence: open again what was closed, report. */
		char why[512];
		snprintf(why, sizeof(why), "%s", gf_error_detail());
		unpark(va);
		for (size_t i = 0; i < va->nmaps; i++)
			if (!va->maps[i].parked)
				va->m->be->protect(va->m, va->addr + va->maps[i].offset, va->maps[i].size,
						   va->maps[i].access);
		return gf_err(rc, "%s", why);
	}
	return 0;
}

GF_EXPORT void gf_mem_va_free(gf_mem_va *va)
{
	if (!va)
		return;
	gf_mem_unmap_all(va);
	gf_mem *m = va->m;
	if (m->be->free_va(m, va->addr, va->size) < 0)
		gf_log(GF_LOG_WARN, "mem", "backend=%s msg=\"freeing address range failed: %s\"", m->be->name,
		       gf_error_detail());
	free(va->maps);
	free(va);
	mem_unref(m);
}
