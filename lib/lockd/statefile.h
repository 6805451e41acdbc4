/* SPDX-License-Identifier: Apache-2.0 */
/* The lock server's state file: what it records, parse, format, atomic store. */
#ifndef GF_LOCKD_STATEFILE_H
#define GF_LOCKD_STATEFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lockint.h"

/* What the state file records (docs/design.md, decision 8). */
struct gf_lock_state {
	bool has_holder;
	char holder[GF_LOCK_ID_MAX];
	uint64_t epoch;            /* last epoch granted (0: none yet) */
	uint8_t token[GF_LOCK_TOKEN_LEN];
	int64_t granted_at_us;     /* wall clock */
	uint32_t pid;
};

/*
 * Parse a state file's bytes. Returns 0, or GF_ERR_PROTOCOL with a detail
 * naming what is wrong (not JSON, truncated, wrong type, missing field,
 * bad token). @out is written only on success.
 */
int gf_lock_state_parse(const char *buf, size_t len, struct gf_lock_state *out);
/* Upper bound of a formatted state (holder ids are < GF_LOCK_ID_MAX bytes, escaped at most 6x). */
#define GF_LOCK_STATE_TEXT_MAX (6 * GF_LOCK_ID_MAX + 512)
/* Serialize to a malloc'd NUL-terminated JSON text. */
int gf_lock_state_format(const struct gf_lock_state *st, char **out);
/* Serialize into @buf (NUL-terminated); returns the length, or a negative GF_ERR_* when it does not fit. */
int gf_lock_state_format_buf(const struct gf_lock_state *st, char *buf, size_t cap);
/*
 * Read @path. GF_ERR_NOT_FOUND when missing, GF_ERR_PROTOCOL when corrupt,
 * GF_ERR_IO on read errors.
 */
int gf_lock_state_load(const char *path, struct gf_lock_state *out);
/* Write atomically: temp file, fdatasync (the temp file is new), rename, fsync of the directory. */
int gf_lock_state_store(const char *path, const struct gf_lock_state *st);
/*
 * Open the directory of @path (O_DIRECTORY, close-on-exec) and split off
 * the file's name and its temp file's name (malloc'd), for a server that
 * writes the state file many times without reopening its directory.
 */
int gf_lock_state_open_dir(const char *path, int *dirfd, char **name, char **tmpname);
/* gf_lock_state_store() relative to an open directory: temp file @tmpname,
 * fdatasync, rename to @name, fsync of @dirfd. */
int gf_lock_state_store_at(int dirfd, const char *name, const char *tmpname, const struct gf_lock_state *st);
/* Create (empty) the temp file gf_lock_state_store_at() writes next: a fd,
 * or a negative error. A server opens it ahead so a grant's write skips the
 * file creation. */
int gf_lock_state_prepare(int dirfd, const char *tmpname);
/* gf_lock_state_store_at() into @fd, a temp file from gf_lock_state_prepare()
 * (-1: create it now). Closes @fd. */
int gf_lock_state_store_prepared(int dirfd, const char *name, const char *tmpname, int fd,
				 const struct gf_lock_state *st);

#endif
