/* SPDX-License-Identifier: Apache-2.0 */
/*
 * GMS snapshots: a committed layout (allocation table, metadata, layout hash,
 * generation) and its bytes in one directory, written crash-consistently and
 * read back with every checksum verified. See docs/tiers.md for the format.
 *
 * A snapshot directory holds two files:
 *   manifest.json  versioned JSON (jansson): the layout and one XXH3-64 per allocation
 *   data.bin       the allocations' bytes back to back, at the manifest's offsets
 *
 * Writing goes to a hidden sibling ".NAME.tmp-PID-RAND", fsyncs both files
 * and the directory, then renames (or atomically exchanges) it into place, so
 * a reader sees the old snapshot or the new one, never a mix.
 *
 * Nothing here knows the server: the server hands a manifest it filled and
 * its allocations to tiers_snapshot_write(), and gets back fresh, filled and
 * verified allocations from tiers_snapshot_restore(), which it adopts and
 * commits with the manifest's layout hash in one step.
 */
#ifndef GF_TIERS_SNAPSHOT_H
#define GF_TIERS_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpufailover.h"

#define TIERS_SNAP_FORMAT "gpufailover-gms-snapshot"
#define TIERS_SNAP_VERSION 1
#define TIERS_SNAP_MANIFEST "manifest.json"
#define TIERS_SNAP_DATA "data.bin"
#define TIERS_SNAP_MAX_ALLOCS 65536
#define TIERS_SNAP_MAX_META 1000000
#define TIERS_SNAP_MAX_KEY 255
#define TIERS_SNAP_MAX_VALUE 1024
/* The largest manifest the caps above allow, as the writer formats it
 * (JSON_INDENT(1)): the top-level fields, plus every allocation with a tag
 * of control characters (each escaped to six bytes) and every metadata
 * entry with the longest key so escaped and the longest value in hex. A
 * larger file is refused before a byte of it is read. */
#define TIERS_SNAP_MANIFEST_HEAD 4096ull
#define TIERS_SNAP_MANIFEST_PER_ALLOC 640ull
#define TIERS_SNAP_MANIFEST_PER_META (6ull * TIERS_SNAP_MAX_KEY + 2ull * TIERS_SNAP_MAX_VALUE + 256)
#define TIERS_SNAP_MAX_MANIFEST                                                                                  \
	(TIERS_SNAP_MANIFEST_HEAD + TIERS_SNAP_MAX_ALLOCS * TIERS_SNAP_MANIFEST_PER_ALLOC +                          \
	 TIERS_SNAP_MAX_META * TIERS_SNAP_MANIFEST_PER_META)

struct tiers_snap_alloc {
	uint64_t id;     /* 1..n in allocation order */
	uint64_t size;   /* granularity-rounded */
	uint64_t offset; /* where its bytes start in data.bin (filled by the writer) */
	uint64_t xxh3;   /* XXH3-64 of its bytes (filled by the writer) */
	char tag[64];
};

struct tiers_snap_meta {
	char *key;
	uint64_t alloc_id;
	uint64_t offset;
	uint8_t *value;
	size_t value_len;
};

struct tiers_manifest {
	unsigned version;
	char backend[16];      /* "host" / "cuda" */
	char device_uuid[64];
	uint64_t granularity;  /* minimum granularity of the backend that wrote it */
	uint64_t generation;
	uint8_t layout_hash[16];
	int64_t created_unix_ms;
	uint64_t total_bytes;  /* sum of the allocation sizes = size of data.bin */
	struct tiers_snap_alloc *allocs;
	size_t nallocs;
	struct tiers_snap_meta *meta; /* in layout-hash order (the server's: sorted by key) */
	size_t nmeta;
};

/* Throughput figures of one write or restore. */
struct tiers_snap_stats {
	uint64_t bytes;
	int64_t elapsed_us;
};

/* An empty manifest (calloc'ed, version set); NULL when out of memory. */
struct tiers_manifest *tiers_manifest_new(void);
/* Frees the manifest and everything it points to. NULL is a no-op. */
void tiers_manifest_free(struct tiers_manifest *mf);

/*
 * Parse manifest text of @len bytes (need not be NUL-terminated). Checks the
 * format name and version, every field's type and range, allocation ids
 * 1..n, sizes that are multiples of the granularity, offsets that tile
 * data.bin exactly, metadata that points inside its allocation, and that the
 * layout hash recomputed from all that equals the stored one. Errors:
 * GF_ERR_VERSION (another format version), GF_ERR_PROTOCOL (anything else
 * malformed; the detail names the field), GF_ERR_NOMEM.
 */
int tiers_manifest_parse(const char *text, size_t len, struct tiers_manifest **out);
/*
 * The same from the open file @fd, read only as far as the JSON parser
 * needs it and never beyond @len bytes: a file that is not JSON is refused
 * at its first bad byte, without being read whole into memory.
 */
int tiers_manifest_read(int fd, uint64_t len, struct tiers_manifest **out);
/* Format @mf as manifest text (malloc'ed, NUL-terminated; *@len without the NUL). */
int tiers_manifest_format(const struct tiers_manifest *mf, char **text, size_t *len);

/*
 * Write a snapshot of @allocs (@mf->nallocs of them, in the order of
 * @mf->allocs, each at least as large as its entry's size) to directory
 * @dir, replacing a previous snapshot there only once the new one is
 * complete and durable. The caller fills @mf's allocation ids, sizes and
 * tags, metadata, generation and layout hash; this fills the backend, device
 * UUID, granularity, creation time, offsets, checksums and total. The
 * allocations are mapped read-only for the duration (device bytes go through
 * pinned staging buffers on cuda). Stale temporaries of dead writers next to
 * @dir are removed first. Blocks for the whole copy. Errors: GF_ERR_IO
 * (ENOSPC named as "no space left"; EROFS), GF_ERR_PERMISSION,
 * GF_ERR_INVALID_ARG, GF_ERR_DRIVER, GF_ERR_NOMEM; on any error the previous
 * snapshot at @dir is untouched and no temporary is left behind.
 */
int tiers_snapshot_write(const char *dir, gf_mem *m, struct tiers_manifest *mf, gf_mem_alloc *const *allocs,
			 struct tiers_snap_stats *stats);
/*
 * tiers_snapshot_write() from @src, the address where @allocs are mapped back
 * to back with their page tables filled (the GMS's kept mapping, host
 * backend): no mapping is made and nothing is faulted in, and the checksums
 * run up to TIERS_HASHER_QUEUE chunks behind the writes. @src 0, or a staged
 * (device) backend, is tiers_snapshot_write(). Same errors.
 */
int tiers_snapshot_write_from(const char *dir, gf_mem *m, struct tiers_manifest *mf, gf_mem_alloc *const *allocs,
			      uint64_t src, struct tiers_snap_stats *stats);

/*
 * Read and check the manifest of the snapshot at @dir and the size of its
 * data file (no data read). Errors: GF_ERR_NOT_FOUND (no snapshot there),
 * GF_ERR_VERSION, GF_ERR_PROTOCOL (corrupt manifest, truncated or
 * oversized data file), GF_ERR_IO, GF_ERR_PERMISSION.
 */
int tiers_snapshot_open(const char *dir, struct tiers_manifest **out);

/* tiers_snapshot_open() and then every allocation's checksum over data.bin. */
int tiers_snapshot_verify(const char *dir, struct tiers_manifest **out);

/*
 * Restore the snapshot at @dir on @m: check it (tiers_snapshot_open()), refuse
 * another backend or granularity, create one allocation per entry, fill it
 * from data.bin (on host through buffers the helper thread reads and hashes,
 * each then written into its memfd; through pinned staging buffers on cuda,
 * hashing what was read), and compare every checksum: what is verified is
 * the bytes read from data.bin, which are the bytes written. On success *@mf_out and *@allocs_out (an array of mf->nallocs
 * fresh, unmapped allocations) are the caller's:
 * free them with tiers_snapshot_restored_free() or adopt them. On failure
 * nothing stays allocated. Mismatching device UUIDs are allowed (a node
 * move) and logged. Blocks. Errors: as tiers_snapshot_open(),
 * GF_ERR_INVALID_ARG (other backend or granularity), GF_ERR_PROTOCOL
 * ("checksum mismatch in allocation N", or data.bin ending early),
 * GF_ERR_IO (a failed read or write), GF_ERR_OUT_OF_MEMORY, GF_ERR_DRIVER.
 */
int tiers_snapshot_restore(const char *dir, gf_mem *m, struct tiers_manifest **mf_out, gf_mem_alloc ***allocs_out,
			   struct tiers_snap_stats *stats);
/* Free what a successful tiers_snapshot_restore() returned (either may be NULL). */
void tiers_snapshot_restored_free(struct tiers_manifest *mf, gf_mem_alloc **allocs);

/* What a tier directory holds, for status, metrics and the choice of a restore source. */
struct tiers_snap_probe {
	bool present;          /* a snapshot whose manifest and data size check out */
	uint64_t bytes;        /* its total_bytes */
	uint64_t allocations;
	uint64_t generation;
	uint8_t layout_hash[16];
	int64_t created_unix_ms;
	int64_t age_ms;        /* now - created_unix_ms at the probe (0 if in the future) */
	char backend[16];
	char error[256];       /* why not present ("" when absent without error, e.g. no directory) */
};

/*
 * Probe @dir with tiers_snapshot_open() (no data read) and fill @out; never
 * fails: an unusable snapshot is reported as not present with the reason.
 */
void tiers_snapshot_probe(const char *dir, struct tiers_snap_probe *out);

/*
 * Remove the snapshot at @dir (its two files, then the directory) to free
 * its space, durably (the parent is fsynced). GF_ERR_NOT_FOUND when there is
 * none; GF_ERR_INVALID_ARG when @dir is not a snapshot directory (never
 * removed); else GF_ERR_IO or GF_ERR_PERMISSION.
 */
int tiers_snapshot_remove(const char *dir);

/* Recompute the layout hash of @mf (same function as the server's commit). 0 or GF_ERR_NOMEM. */
int tiers_manifest_layout_hash(const struct tiers_manifest *mf, uint8_t out[16]);

#endif
