/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gpufailover/mem.h
 * @brief Memory backends: shareable physical allocations, fd export/import,
 *        address reservations and read-only / read-write mappings.
 *
 * Two implementations behind one API, chosen at run time:
 * - `GF_MEM_CUDA`: CUDA VMM (cuMemCreate with POSIX-fd handles, cuMemMap,
 *   cuMemSetAccess) through a dlopen()ed libcuda.so.1;
 * - `GF_MEM_HOST`: memfd + mmap, a real backend for CPU engines and tests.
 *
 * Lifetime rule (the driver's, on both backends): physical memory lives until
 * the last handle (creator's or importer's) and the last mapping are gone.
 * Every allocation has an explicit state; calls in the wrong state return
 * GF_ERR_STATE instead of crashing (no double release, no use after release).
 *
 * Thread rules: a gf_mem and the objects made from it may be used from any
 * thread, but not concurrently on the same object.
 */
#ifndef GPUFAILOVER_MEM_H
#define GPUFAILOVER_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup mem Memory backends
 *  @{ */

/** Backend choice. */
enum gf_mem_kind {
	GF_MEM_AUTO = 0, /**< cuda when a usable driver and device exist, else host (logged) */
	GF_MEM_CUDA = 1,
	GF_MEM_HOST = 2,
};

/** Mapping protection. */
enum gf_mem_access {
	GF_MEM_READ = 1,       /**< read-only: writes fault */
	GF_MEM_READWRITE = 3,
};

/** What a device did with read-only (GF_MEM_READ) mappings, see gf_mem_read_protection(). */
enum gf_mem_read_protection {
	GF_MEM_READ_PROT_UNTESTED = 0, /**< no read-only mapping made yet */
	GF_MEM_READ_PROT_ENFORCED = 1, /**< read-only mappings are read-only */
	GF_MEM_READ_PROT_REJECTED = 2, /**< the driver refused PROT_READ: mapped read-write instead */
	GF_MEM_READ_PROT_IGNORED = 3,  /**< the driver accepted PROT_READ but reports read-write */
};

/** States of one allocation handle. */
enum gf_mem_alloc_state {
	GF_MEM_ALLOC_CREATED = 1,  /**< made here by gf_mem_create() */
	GF_MEM_ALLOC_IMPORTED = 2, /**< made from an fd by gf_mem_import() */
	GF_MEM_ALLOC_MAPPED = 3,   /**< mapped at least once */
	GF_MEM_ALLOC_UNMAPPED = 4, /**< was mapped, now mapped nowhere */
	GF_MEM_ALLOC_RELEASED = 5, /**< handle dropped; only gf_mem_alloc_free() is valid */
};

typedef struct gf_mem gf_mem;             /**< a backend bound to one device */
typedef struct gf_mem_alloc gf_mem_alloc; /**< one physical allocation handle */
typedef struct gf_mem_va gf_mem_va;       /**< one reserved virtual address range */

/** One entry of gf_mem_map_many(). */
struct gf_mem_mapping {
	size_t offset;        /**< where in the reservation the allocation starts */
	gf_mem_alloc *alloc;  /**< mapped whole */
};

/**
 * Open backend @p kind on device @p device (index as the driver counts them;
 * the host backend has exactly one device, 0). With GF_MEM_AUTO the choice
 * is logged at info level and gf_mem_kind() tells it.
 * Errors: GF_ERR_NOT_SUPPORTED with a detail naming what is missing (no
 * driver, driver too old, no VMM or POSIX-fd handle support),
 * GF_ERR_NOT_FOUND (no such device), GF_ERR_DRIVER, GF_ERR_NOMEM.
 * The cuda backend loads libcuda.so.1 at run time (never linked); the
 * environment variable GF_LIBCUDA overrides that path.
 * The caller frees *out with gf_mem_free(). Blocks only for driver calls.
 */
GF_EXPORT int gf_mem_open(gf_mem **out, int kind, int device);
/** Close a backend. All allocations and reservations made from it must be freed first. NULL is a no-op. */
GF_EXPORT void gf_mem_free(gf_mem *m);
/** GF_MEM_CUDA or GF_MEM_HOST. */
GF_EXPORT int gf_mem_kind(const gf_mem *m);
/** "cuda", "host" ("auto", "unknown" for other values). Static string. */
GF_EXPORT const char *gf_mem_kind_name(int kind);
/** Device index this backend is bound to. */
GF_EXPORT int gf_mem_device(const gf_mem *m);
/** Number of devices backend @p kind sees (host: 1). */
GF_EXPORT int gf_mem_device_count(int kind, int *out);
/** Device UUID as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" ("MIG-..." for a MIG instance, as nvidia-smi and CUDA_VISIBLE_DEVICES spell it; host: "HOST-..." of the machine id), into @p buf of @p len bytes (>= 48). */
GF_EXPORT int gf_mem_device_uuid(gf_mem *m, char *buf, size_t len);
/**
 * Translate a device UUID (with or without "GPU-"/"MIG-" prefix, or a unique
 * prefix of it, as CUDA_VISIBLE_DEVICES accepts) to a device index of @p kind.
 * GF_ERR_NOT_FOUND when none matches, GF_ERR_INVALID_ARG when ambiguous.
 */
GF_EXPORT int gf_mem_uuid_to_index(int kind, const char *uuid, int *out_index);

/** One device as gf_device_list() reports it. */
struct gf_device_info {
	int index;            /**< the index gf_mem_open() takes (after CUDA_VISIBLE_DEVICES) */
	char uuid[48];        /**< "GPU-...", "MIG-..." or "HOST-..." */
	char name[96];        /**< product name from the driver ("host" on host) */
	uint64_t total_bytes; /**< device memory */
	uint64_t free_bytes;  /**< free device memory now (cuMemGetInfo; host: MemAvailable) */
	int mig;              /**< 1 for a MIG compute instance */
};

/**
 * List the devices backend @p kind sees, in index order. The cuda driver
 * applies CUDA_VISIBLE_DEVICES itself (at cuInit), so indices and UUIDs are
 * those of the visible devices. Fills up to @p cap entries of @p out and
 * sets *@p n to the number of devices (call with cap 0 to count).
 * Free memory needs a context: each device's primary context is retained
 * and released again (slow on a GPU; blocks in the driver).
 * Errors: those of gf_mem_open(). Any thread.
 */
GF_EXPORT int gf_device_list(int kind, struct gf_device_info *out, size_t cap, size_t *n);
/** Same as gf_mem_uuid_to_index(): the index of the device with UUID (or unique UUID prefix) @p uuid. */
GF_EXPORT int gf_device_find_by_uuid(int kind, const char *uuid, int *out_index);
/**
 * Parse a `--device` value: a decimal index (checked against the device
 * count: GF_ERR_NOT_FOUND past it) or a UUID as gf_device_find_by_uuid()
 * takes it. With GF_MEM_AUTO a value names a cuda device when one matches,
 * else the host device. Errors carry a detail naming the value.
 */
GF_EXPORT int gf_device_parse(int kind, const char *spec, int *out_index);
/** Allocation granularity: minimum and recommended (both powers of two). */
GF_EXPORT int gf_mem_granularity(gf_mem *m, size_t *minimum, size_t *recommended);
/** Free and total device memory in bytes (host: MemAvailable / MemTotal; GF_MEM_HOST_AVAILABLE=bytes overrides the free figure). */
GF_EXPORT int gf_mem_info(gf_mem *m, uint64_t *free_bytes, uint64_t *total_bytes);
/**
 * Whether the device has at least @p need bytes free: 1 yes, 0 no, < 0 an
 * error (as gf_mem_info()). @p free_bytes (may be NULL) gets the free bytes
 * gf_mem_info() reports whenever the answer is 0. Cheaper than
 * gf_mem_info() when the answer is plain: the host backend first asks
 * sysinfo(2), and reads /proc/meminfo only when free memory alone, less a
 * sixteenth of RAM for the kernel's reserves, is not enough.
 */
GF_EXPORT int gf_mem_has_free(gf_mem *m, uint64_t need, uint64_t *free_bytes);
/** Wait until all work queued on the device is done (cuCtxSynchronize; host: no-op). */
GF_EXPORT int gf_mem_synchronize(gf_mem *m);
/**
 * What the device did with read-only mappings so far: one of enum
 * gf_mem_read_protection (host: always GF_MEM_READ_PROT_ENFORCED). REJECTED
 * and IGNORED mean GF_MEM_READ mappings are writable: protection is off
 * (logged once at warning level when first seen).
 */
GF_EXPORT int gf_mem_read_protection(gf_mem *m);
/** "untested", "enforced", "rejected", "ignored" ("unknown" otherwise). Static string. */
GF_EXPORT const char *gf_mem_read_protection_name(int prot);
/**
 * 1 when a sticky device error (illegal address, device-side assert, launch
 * failure, ...) was seen in this process: the CUDA context is lost for good,
 * every later call fails with GF_ERR_DRIVER, teardown (unmap, release,
 * free) still completes, and the process must exit to recover. 0 otherwise.
 */
GF_EXPORT int gf_mem_device_lost(const gf_mem *m);

/**
 * Create a shareable allocation of at least @p size bytes (rounded up to the
 * minimum granularity; gf_mem_alloc_size() tells the real size) and store it
 * in *@p out, which is written only on success. The caller frees it with
 * gf_mem_alloc_free(); it keeps @p m alive.
 * Errors: GF_ERR_OUT_OF_MEMORY, GF_ERR_INVALID_ARG (NULL, size 0), GF_ERR_DRIVER.
 */
GF_EXPORT int gf_mem_create(gf_mem_alloc **out, gf_mem *m, size_t size);
/** Export a new fd for the allocation (O_CLOEXEC); the caller owns and closes it. */
GF_EXPORT int gf_mem_export(gf_mem_alloc *a, int *out_fd);
/**
 * Import an allocation from @p fd, which describes @p size bytes, into
 * *@p out (written only on success). The caller frees it with
 * gf_mem_alloc_free(); it keeps @p m alive. The fd stays owned by the caller
 * (close it when done; the import holds its own reference).
 * Errors: GF_ERR_INVALID_ARG (NULL, not an allocation fd, or on host a size
 * mismatch; the driver does not tell an import's size, so on cuda @p size is
 * trusted), GF_ERR_DRIVER.
 */
GF_EXPORT int gf_mem_import(gf_mem_alloc **out, gf_mem *m, int fd, size_t size);
/** Size in bytes (granularity-rounded). */
GF_EXPORT size_t gf_mem_alloc_size(const gf_mem_alloc *a);
/** One of enum gf_mem_alloc_state (GF_ERR_INVALID_ARG for NULL). */
GF_EXPORT int gf_mem_alloc_state(const gf_mem_alloc *a);
/**
 * Drop this handle's reference to the physical memory. GF_ERR_BUSY while it
 * is still mapped somewhere, GF_ERR_STATE when already released.
 */
GF_EXPORT int gf_mem_release(gf_mem_alloc *a);
/**
 * Give up the handle: release it if needed and free the object. An
 * allocation that is still mapped stays valid until its last mapping goes
 * (gf_mem_unmap_all(), gf_mem_va_free()), which releases and frees it then;
 * the caller must not use @p a after this call either way. NULL is a no-op.
 */
GF_EXPORT void gf_mem_alloc_free(gf_mem_alloc *a);

/**
 * Reserve @p size bytes of address space (rounded to the granularity),
 * aligned to @p align (0: granularity), into *@p out (written only on
 * success). Nothing is accessible until mapped. The caller frees it with
 * gf_mem_va_free(); it keeps @p m alive.
 * Errors: GF_ERR_INVALID_ARG (NULL, size 0, bad alignment), GF_ERR_NOMEM,
 * GF_ERR_DRIVER.
 */
GF_EXPORT int gf_mem_reserve(gf_mem_va **out, gf_mem *m, size_t size, size_t align);
/** Start address of the reservation (a device pointer on cuda, a host pointer on host). */
GF_EXPORT uint64_t gf_mem_va_addr(const gf_mem_va *va);
/** Size of the reservation in bytes. */
GF_EXPORT size_t gf_mem_va_size(const gf_mem_va *va);
/**
 * Map allocations into the reservation with protection @p access,
 * all-or-nothing: if any mapping fails, those already made by this call are
 * undone and the error is returned. Access is set once per contiguous span.
 * Entries may come in any order; each allocation is mapped whole.
 * Errors: GF_ERR_INVALID_ARG (out of range, unaligned, overlapping an existing
 * mapping or another entry, allocation of another backend or device),
 * GF_ERR_STATE (allocation released), GF_ERR_OUT_OF_MEMORY, GF_ERR_DRIVER,
 * GF_ERR_PERMISSION (host: read-write map of an fd opened read-only).
 */
GF_EXPORT int gf_mem_map_many(gf_mem_va *va, const struct gf_mem_mapping *maps, size_t n, int access);
/** gf_mem_map_many() with one entry. */
GF_EXPORT int gf_mem_map(gf_mem_va *va, size_t offset, gf_mem_alloc *a, int access);
/**
 * Unmap everything mapped in the reservation; the address range stays
 * reserved, so a later map lands at the same addresses. On a backend error
 * the first error is returned and the rest is still unmapped.
 */
GF_EXPORT int gf_mem_unmap_all(gf_mem_va *va);
/**
 * Fence every mapping of the reservation (@p on = 0: any access at its
 * address faults, as if unmapped) or open them again with the access they
 * were mapped with (@p on = 1), without unmapping: the mappings, and on host
 * their page tables, stay, so no page faults follow the opening. On host a
 * mapping of 256 KiB or more is moved whole to a parking range (mremap,
 * page tables kept) with an inaccessible placeholder at its address, and
 * moved back: one call per mapping whatever its size; smaller ones are
 * protected in place, one mprotect per contiguous span. A fenced mapping
 * still holds its allocation, like any mapping; gf_mem_unmap_all() and
 * gf_mem_va_free() let go of parked ones too. What the opening leaves of the
 * parking range (address space, no memory) goes at the next fence,
 * gf_mem_unmap_all() or gf_mem_va_free(). Errors: GF_ERR_INVALID_ARG
 * (NULL), GF_ERR_NOT_SUPPORTED (the backend cannot: cuda; unmap instead),
 * GF_ERR_IO, GF_ERR_OUT_OF_MEMORY.
 */
GF_EXPORT int gf_mem_set_accessible(gf_mem_va *va, int on);
/** Unmap everything and give the address range back. NULL is a no-op. */
GF_EXPORT void gf_mem_va_free(gf_mem_va *va);

/** One allocation mapped read-write in its own reservation (an engine's private, e.g. KV, memory). */
typedef struct gf_mem_region gf_mem_region;
/**
 * Create, reserve and map read-write @p size bytes (rounded up to the
 * granularity; gf_mem_region_size() tells the real size), all-or-nothing:
 * on failure whatever the call made is undone and nothing stays allocated.
 * The region borrows @p m, which must outlive it. Caller frees with
 * gf_mem_region_free(). Errors: GF_ERR_INVALID_ARG (NULL, size 0),
 * GF_ERR_OUT_OF_MEMORY (the device is full; worth retrying once memory is
 * freed), GF_ERR_NOMEM, GF_ERR_DRIVER. Thread-safe as the backend is.
 */
GF_EXPORT int gf_mem_region_new(gf_mem_region **out, gf_mem *m, size_t size);
/**
 * Reserve the address range of a region of @p size bytes (rounded up to the
 * granularity) with no memory behind it yet: the address is final, any
 * access faults until gf_mem_region_back(). On the host backend, where an
 * allocation holds no memory until touched, the allocation the next
 * gf_mem_region_back() maps is created here (and again at each release), so
 * backing only maps it; on cuda nothing is allocated ahead. Caller frees
 * with gf_mem_region_free(). Errors: GF_ERR_INVALID_ARG, GF_ERR_NOMEM,
 * GF_ERR_DRIVER.
 */
GF_EXPORT int gf_mem_region_reserve(gf_mem_region **out, gf_mem *m, size_t size);
/**
 * Create the region's memory (host: take the one made ahead, fresh and
 * zero-filled) and map it read-write at the reserved address, all-or-nothing (on failure nothing stays allocated). Errors: GF_ERR_STATE
 * (already backed), GF_ERR_OUT_OF_MEMORY (worth retrying once memory is
 * freed), GF_ERR_DRIVER, GF_ERR_INVALID_ARG (NULL).
 */
GF_EXPORT int gf_mem_region_back(gf_mem_region *r);
/**
 * Back the region with memory made elsewhere instead of creating it: import
 * @p fd (an allocation fd of the region's size, e.g. the GMS's KV pool from
 * gf_gms_kv_map(); the caller keeps and closes it) and map it read-write at
 * the reserved address (host: the memfd mapped over the range; cuda: the
 * imported handle mapped there), all-or-nothing. Nothing is created and
 * nothing zeroed: the content is the memory's. gf_mem_region_release()
 * lets go of the import only; the memory lives on with its other holders.
 * Errors: GF_ERR_STATE (already backed), GF_ERR_INVALID_ARG (NULL, fd < 0,
 * not an allocation fd or, on host, not of the region's size),
 * GF_ERR_DRIVER, GF_ERR_OUT_OF_MEMORY.
 */
GF_EXPORT int gf_mem_region_back_fd(gf_mem_region *r, int fd);
/**
 * Unmap and free the region's memory; the address range stays reserved for
 * a later gf_mem_region_back(), at the same address. A no-op when not
 * backed. On a backend error the memory is still let go of and the first
 * error returned.
 */
GF_EXPORT int gf_mem_region_release(gf_mem_region *r);
/** 1 while memory backs the region, else 0 (also for NULL). */
GF_EXPORT int gf_mem_region_backed(const gf_mem_region *r);
/** Unmap, give the address range back and free the memory. NULL is a no-op. */
GF_EXPORT void gf_mem_region_free(gf_mem_region *r);
/** Start address of the region (a device pointer on cuda, a host pointer on host); 0 for NULL. */
GF_EXPORT uint64_t gf_mem_region_addr(const gf_mem_region *r);
/** Size of the region's address range in bytes (granularity-rounded); 0 for NULL. */
GF_EXPORT size_t gf_mem_region_size(const gf_mem_region *r);

/** @} */

#ifdef __cplusplus
}
#endif

#endif
