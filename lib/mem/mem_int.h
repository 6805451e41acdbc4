/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What in-library users of lib/mem (the GMS client and server, the tiers) need beyond
 * the public API: bulk paths one system call cheaper per allocation, and the
 * protection of committed weights. Not the backend vtable (backend.h).
 */
#ifndef GF_MEM_INT_H
#define GF_MEM_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "gpufailover/mem.h"

/* gf_mem_import() that consumes @fd in every case: on success the allocation
 * owns it (or what the driver made of it), on failure it is closed. */
int gf_mem_import_adopt(gf_mem_alloc **out, gf_mem *m, int fd, size_t size);

/* gf_mem_export() without a copy where the backend can: *@owned tells whether
 * the caller must close *@fd (a new fd) or must not (the allocation's own,
 * valid until @a is released). */
int gf_mem_export_borrowed(gf_mem_alloc *a, int *fd, bool *owned);

/*
 * An fd for a reader: a read-only file description where the backend has
 * one (host: writes, writable shared mappings and truncation through it
 * fail), else as gf_mem_export_borrowed(). Same ownership rule; the
 * read-only description is opened once per allocation and lent (*@owned
 * false) until @a is released.
 */
int gf_mem_export_readonly(gf_mem_alloc *a, int *fd, bool *owned);

/*
 * The bytes of @a are final: refuse every later write through any fd and
 * every new writable mapping (host: F_SEAL_FUTURE_WRITE; the size is sealed
 * at creation). GF_ERR_NOT_SUPPORTED where the backend cannot enforce it
 * (cuda: an importer sets its own access; docs/gms.md).
 */
int gf_mem_seal(gf_mem_alloc *a);

/*
 * What a backend can do, for in-library users whose best path depends on it.
 * They ask gf_mem_caps(), never the backend's kind, so that a new backend is
 * one table in lib/mem and nothing outside it changes.
 */
enum gf_mem_cap {
	/* Creating an allocation takes no memory until its pages are used, so
	 * one can be made ahead, off a wake's path (host: an empty memfd). */
	GF_MEM_CAP_CREATE_FREE = 1u << 0,
	/* Each allocation is a file of its own holding its bytes (host: a
	 * memfd): host code can mmap its fds and fill it with file-to-file
	 * copies, and /proc names it by its inode in the fd tables and maps of
	 * the processes that hold or map it. */
	GF_MEM_CAP_FILES = 1u << 1,
	/* Mappings are host memory whose page tables fill at the first touch of
	 * each page: gf_mem_populate() fills them ahead, while nobody waits. */
	GF_MEM_CAP_HOST_PAGES = 1u << 2,
	/* Mappings can be fenced and opened again in place, keeping them
	 * mapped (gf_mem_set_accessible()). */
	GF_MEM_CAP_FENCE = 1u << 3,
};

/* The GF_MEM_CAP_* flags of @m's backend; 0 for NULL. */
unsigned gf_mem_caps(const gf_mem *m);

#endif
