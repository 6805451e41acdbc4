/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What in-library users of lib/mem (the GMS client and server) need beyond
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

/* Whether creating an allocation takes no memory until it is used (host),
 * so that it can be made ahead, off a wake's path. */
bool gf_mem_create_is_free(const gf_mem *m);

#endif
