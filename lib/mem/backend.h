/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The internal memory backend interface. lib/mem/mem.c implements the public
 * API (state machine, range bookkeeping, all-or-nothing mapping) once, over
 * this vtable; host.c and cuda.c only translate each step into the system
 * calls or the driver calls that do it.
 *
 * Handles are opaque 64-bit values: a memfd on host, a
 * CUmemGenericAllocationHandle on cuda. Addresses are 64-bit: host pointers
 * on host, CUdeviceptr on cuda.
 */
#ifndef GF_MEM_BACKEND_H
#define GF_MEM_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "gf-config.h"
#include "gpufailover/mem.h"
#include "mem_int.h"

struct gf_mem_backend {
	const char *name; /* "cuda" / "host" */
	int kind;         /* GF_MEM_CUDA / GF_MEM_HOST */
	/* What it can do (GF_MEM_CAP_*, mem_int.h), fencing aside: that is
	 * having protect(). */
	unsigned caps;

	/* Device-level queries, usable without an open gf_mem. */
	int (*device_count)(int *out);
	/* 16 raw UUID bytes of device @index. */
	int (*device_uuid)(int index, uint8_t uuid[16]);
	/* Prefix of the printed UUID: "GPU-" or "HOST-". */
	const char *uuid_prefix;
	/* Optional: is device @index a MIG instance (printed "MIG-...")? */
	bool (*device_mig)(int index);
	/* Optional: the product name of device @index (else the backend name). */
	int (*device_name)(int index, char *buf, size_t len);
	/* Optional: what the device did with read-only mappings so far (enum
	 * gf_mem_read_protection); NULL: always enforced. */
	int (*read_protection)(gf_mem *m);
	/* Optional: has a sticky device error made the backend unusable? */
	bool (*lost)(void);

	/* Bind to @device; fills m->priv. Errors say what is missing. */
	int (*open)(gf_mem *m, int device);
	void (*close)(gf_mem *m);
	int (*granularity)(gf_mem *m, size_t *minimum, size_t *recommended);
	int (*info)(gf_mem *m, uint64_t *free_bytes, uint64_t *total_bytes);
	/* Optional: true when @need bytes are plainly free, by a cheaper look than info(). */
	bool (*plenty_free)(gf_mem *m, uint64_t need);
	int (*synchronize)(gf_mem *m);

	/* Physical allocations. @size is already rounded to the granularity. */
	int (*create)(gf_mem *m, size_t size, uint64_t *handle);
	int (*export_fd)(gf_mem *m, uint64_t handle, int *out_fd);
	/* @size rounded; the caller's fd stays the caller's. */
	int (*import_fd)(gf_mem *m, int fd, size_t size, uint64_t *handle);
	/* Optional: as import_fd, but on success the handle takes @fd over (on
	 * host it is @fd itself: no dup); on failure @fd stays the caller's. */
	int (*import_adopt)(gf_mem *m, int fd, size_t size, uint64_t *handle);
	/* Optional: an fd for @handle that stays the handle's (valid until it is
	 * released, never closed by the caller); saves a dup per export. */
	int (*export_borrow)(gf_mem *m, uint64_t handle, int *fd);
	/* Optional: a new fd on a read-only file description of @handle. */
	int (*export_readonly)(gf_mem *m, uint64_t handle, int *out_fd);
	/* Optional: refuse later writes and writable mappings of @handle. */
	int (*seal)(gf_mem *m, uint64_t handle);
	int (*release)(gf_mem *m, uint64_t handle);

	/* Address space. @size and @align are multiples of the granularity. */
	int (*reserve)(gf_mem *m, size_t size, size_t align, uint64_t *addr);
	int (*free_va)(gf_mem *m, uint64_t addr, size_t size);
	/* Map @handle whole at @addr. A backend whose protection is part of the
	 * mapping (host) applies @access here; one with a separate access step
	 * (cuda) ignores it and does that step in set_access. */
	int (*map)(gf_mem *m, uint64_t addr, size_t size, uint64_t handle, int access);
	/* Optional (NULL on host): set @access once on a contiguous mapped span. */
	int (*set_access)(gf_mem *m, uint64_t addr, size_t size, int access);
	/* Unmap one mapping made by map(); the address range stays reserved. */
	int (*unmap)(gf_mem *m, uint64_t addr, size_t size);
	/* unmap() also takes a range covering several adjacent mappings (host). */
	bool unmap_spans;
	/* Optional: fence (@access 0) or reopen a span of adjacent mappings
	 * made with @access, keeping them mapped. */
	int (*protect)(gf_mem *m, uint64_t addr, size_t size, int access);
	/* Optional: move the one mapping [@from, +@size) to @to, keeping its
	 * page tables (host: mremap); with @placeholder, put the reservation's
	 * inaccessible placeholder back at @from. Fencing a large mapping this
	 * way costs one call whatever its size, where protect() rewrites every
	 * page table entry. */
	int (*move)(gf_mem *m, uint64_t from, size_t size, uint64_t to, bool placeholder);
	/* Optional: true when move() also takes a range covering several
	 * adjacent mappings (host: Linux 6.17 and later move them in one
	 * mremap; an older kernel refuses such a range only after it dropped
	 * what was at @to, so it is asked once, on scratch mappings of its own). */
	bool (*move_spans)(gf_mem *m);

	/* Optional staged copies (cuda; NULL on host, whose mappings are host
	 * memory): pinned host buffers, one ordered stream, events to wait on. */
	int (*host_alloc)(gf_mem *m, size_t size, void **p);
	void (*host_free)(gf_mem *m, void *p);
	int (*stream_new)(gf_mem *m, void **stream);
	void (*stream_free)(gf_mem *m, void *stream);
	int (*event_new)(gf_mem *m, void **event);
	void (*event_free)(gf_mem *m, void *event);
	int (*copy_dtoh)(gf_mem *m, void *dst, uint64_t src, size_t n, void *stream);
	int (*copy_htod)(gf_mem *m, uint64_t dst, const void *src, size_t n, void *stream);
	int (*event_record)(gf_mem *m, void *event, void *stream);
	int (*event_wait)(gf_mem *m, void *event);
};

struct gf_mem {
	const struct gf_mem_backend *be;
	int device;
	size_t gran_min, gran_rec;
	/* One for the caller plus one per live allocation and reservation, so a
	 * gf_mem_free() before them cannot pull the backend from under them. */
	atomic_int refs;
	void *priv;
	/* The device's UUID, read once: a wake checks it, and the backend may
	 * read a file (host) or ask the driver for it. */
	pthread_mutex_t uuid_mu;
	bool uuid_known;
	char uuid[48];
};

extern const struct gf_mem_backend gf_mem_host_backend;
#if GF_HAVE_CUDA
extern const struct gf_mem_backend gf_mem_cuda_backend;
#endif

/* The backend of @kind (GF_MEM_CUDA / GF_MEM_HOST) or NULL with a detail
 * (cuda when built without cuda.h). */
const struct gf_mem_backend *gf_mem_backend_get(int kind);

/* Format 16 UUID bytes as PREFIX8-4-4-4-12 lower-case hex. */
void gf_mem_format_uuid(const char *prefix, const uint8_t uuid[16], char *buf, size_t len);

#endif
