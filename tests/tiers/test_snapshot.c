/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Snapshot directories on one backend (argv[1] "host" or "cuda"; cuda runs on
 * tests/fakecuda, whose asynchronous copies only land when waited for):
 * round trip byte for byte, replacement, every refusal (flipped byte,
 * truncation, other version, other granularity or backend, edited manifest),
 * failed, early-ending and short reads and writes of the restore's copy,
 * nothing left allocated after a refused restore, a writer killed midway,
 * stale temporaries, disk full and read-only file systems (small tmpfs
 * mounts, skipped when mounting is not permitted).
 */
#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common.h"
#include "gpufailover.h"
#include "snapshot.h"
#include "testutil.h"
#include "tierd.h"
#include "xfer.h"

static int kind = GF_MEM_HOST;
static char *tmp;

/*
 * Faults in a restore's file I/O. The library is linked into this program
 * statically, so these definitions take its calls: the reads of the data
 * file (pread64: the host restore's helper thread, or the staged copy) and
 * the writes into the new allocations (pwrite64, host). Armed only around
 * one restore: after io_fault_after calls that pass, each call fails with
 * EIO (IO_FAIL), ends the file early (IO_EOF, reads) or moves fewer bytes
 * than asked (IO_SHORT); io_fault_hits counts the calls faulted.
 */
enum io_fault { IO_NONE, IO_FAIL, IO_EOF, IO_SHORT };
static _Atomic int io_fault_read, io_fault_write, io_fault_after, io_fault_hits;

static bool io_fault_now(int mode)
{
	if (mode == IO_NONE || atomic_fetch_sub(&io_fault_after, 1) > 0)
		return false;
	atomic_fetch_add(&io_fault_hits, 1);
	return true;
}

ssize_t pread64(int fd, void *buf, size_t n, off64_t off)
{
	int mode = atomic_load(&io_fault_read);
	if (io_fault_now(mode)) {
		if (mode == IO_FAIL) {
			errno = EIO;
			return -1;
		}
		if (mode == IO_EOF)
			return 0;
		n = n > 5000 ? 5000 : n;
	}
	return syscall(SYS_pread64, fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
	int mode = atomic_load(&io_fault_write);
	if (io_fault_now(mode)) {
		if (mode == IO_FAIL) {
			errno = EIO;
			return -1;
		}
		n = n > 4097 ? 4097 : n;
	}
	return syscall(SYS_pwrite64, fd, buf, n, off);
}

static void io_fault_arm(int read_mode, int write_mode, int after)
{
	atomic_store(&io_fault_after, after);
	atomic_store(&io_fault_hits, 0);
	atomic_store(&io_fault_read, read_mode);
	atomic_store(&io_fault_write, write_mode);
}

/* Disarms; how many calls were faulted. */
static int io_fault_disarm(void)
{
	atomic_store(&io_fault_read, IO_NONE);
	atomic_store(&io_fault_write, IO_NONE);
	return atomic_load(&io_fault_hits);
}

/* A committed-looking layout: allocations filled with a pattern, sorted metadata, its hash. */
struct layout {
	gf_mem *m;
	size_t n;
	gf_mem_alloc **allocs;
	struct tiers_manifest *mf;
};

static uint8_t pattern(uint64_t seed, size_t alloc, uint64_t off)
{
	uint64_t x = (seed * 0x9E3779B97F4A7C15ull) ^ (alloc * 0xBF58476D1CE4E5B9ull) ^ (off * 0x94D049BB133111EBull);
	return (uint8_t)(x ^ (x >> 29) ^ (x >> 47));
}

static void fill(gf_mem *m, gf_mem_alloc *a, uint64_t seed, size_t idx)
{
	gf_mem_va *va;
	size_t n = gf_mem_alloc_size(a);
	assert_int_equal(gf_mem_reserve(&va, m, n, 0), 0);
	assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READWRITE), 0);
	uint8_t *p = (uint8_t *)(uintptr_t)gf_mem_va_addr(va);
	for (size_t i = 0; i < n; i++)
		p[i] = pattern(seed, idx, i);
	gf_mem_va_free(va);
}

/* Whether @a holds pattern @seed for allocation @idx (read through a read-only mapping). */
static bool holds(gf_mem *m, gf_mem_alloc *a, uint64_t seed, size_t idx)
{
	gf_mem_va *va;
	size_t n = gf_mem_alloc_size(a);
	assert_int_equal(gf_mem_reserve(&va, m, n, 0), 0);
	assert_int_equal(gf_mem_map(va, 0, a, GF_MEM_READ), 0);
	const uint8_t *p = (const uint8_t *)(uintptr_t)gf_mem_va_addr(va);
	bool ok = true;
	for (size_t i = 0; ok && i < n; i++)
		ok = p[i] == pattern(seed, idx, i);
	gf_mem_va_free(va);
	return ok;
}

static struct layout *make_layout(uint64_t seed)
{
	struct layout *l = calloc(1, sizeof(*l));
	size_t g, rec;
	assert_int_equal(gf_mem_open(&l->m, kind, 0), 0);
	assert_int_equal(gf_mem_granularity(l->m, &g, &rec), 0);
	/* One allocation larger than two transfer chunks, so staged copies double-buffer. */
	size_t sizes[] = { g, 3 * g, (2 * GF_MEM_XFER_CHUNK + 5 * g + g - 1) / g * g, g };
	l->n = GF_ARRAY_SIZE(sizes);
	l->allocs = calloc(l->n, sizeof(*l->allocs));
	l->mf = tiers_manifest_new();
	l->mf->allocs = calloc(l->n, sizeof(*l->mf->allocs));
	l->mf->nallocs = l->n;
	for (size_t i = 0; i < l->n; i++) {
		assert_int_equal(gf_mem_create(&l->allocs[i], l->m, sizes[i]), 0);
		fill(l->m, l->allocs[i], seed, i);
		l->mf->allocs[i].id = i + 1;
		l->mf->allocs[i].size = gf_mem_alloc_size(l->allocs[i]);
		snprintf(l->mf->allocs[i].tag, sizeof(l->mf->allocs[i].tag), "layer.%zu", i);
	}
	const char *keys[] = { "embed", "layer.0.w", "layer.1.w", "lm_head" };
	l->mf->meta = calloc(GF_ARRAY_SIZE(keys), sizeof(*l->mf->meta));
	l->mf->nmeta = GF_ARRAY_SIZE(keys);
	for (size_t i = 0; i < l->mf->nmeta; i++) {
		struct tiers_snap_meta *e = &l->mf->meta[i];
		e->key = strdup(keys[i]);
		e->alloc_id = i % l->n + 1;
		e->offset = i * 16;
		e->value_len = 8 + i;
		e->value = malloc(e->value_len);
		for (size_t b = 0; b < e->value_len; b++)
			e->value[b] = (uint8_t)(seed + b * 7 + i); /* binary values, NULs included */
	}
	l->mf->generation = seed;
	assert_int_equal(tiers_manifest_layout_hash(l->mf, l->mf->layout_hash), 0);
	return l;
}

static void free_layout(struct layout *l)
{
	for (size_t i = 0; i < l->n; i++)
		gf_mem_alloc_free(l->allocs[i]);
	free(l->allocs);
	tiers_manifest_free(l->mf);
	gf_mem_free(l->m);
	free(l);
}

/* A path in the test's directory; a ring of buffers, enough for every name one test holds. */
static char *path_in(const char *name)
{
	static char p[32][512];
	static int k;
	k = (k + 1) % 32;
	snprintf(p[k], sizeof(p[k]), "%s/%s", tmp, name);
	return p[k];
}

static void write_ok(struct layout *l, const char *dir)
{
	struct tiers_snap_stats st = { 0 };
	int rc = tiers_snapshot_write(dir, l->m, l->mf, l->allocs, &st);
	if (rc < 0)
		fail_msg("snapshot write %s: %s: %s", dir, gf_error_name(rc), gf_error_detail());
	assert_true(st.bytes > 2 * GF_MEM_XFER_CHUNK);
}

/* No hidden temporary of ours left next to the snapshot. */
static int temps_in(const char *parent)
{
	DIR *d = opendir(parent);
	struct dirent *e;
	int n = 0;
	while (d && (e = readdir(d)))
		n += strstr(e->d_name, ".tmp-") != NULL;
	if (d)
		closedir(d);
	return n;
}

/* Restore @dir and check every byte, metadata entry and the hash against @seed's layout. */
static void restore_matches(const char *dir, uint64_t seed)
{
	struct layout *want = make_layout(seed);
	struct tiers_manifest *mf;
	gf_mem_alloc **allocs;
	struct tiers_snap_stats st = { 0 };
	int rc = tiers_snapshot_restore(dir, want->m, &mf, &allocs, &st);
	if (rc < 0)
		fail_msg("restore %s: %s: %s", dir, gf_error_name(rc), gf_error_detail());
	assert_int_equal(st.bytes, mf->total_bytes);
	assert_memory_equal(mf->layout_hash, want->mf->layout_hash, 16);
	assert_int_equal(mf->generation, seed);
	assert_int_equal(mf->nallocs, want->n);
	assert_int_equal(mf->nmeta, want->mf->nmeta);
	for (size_t i = 0; i < mf->nmeta; i++) {
		assert_string_equal(mf->meta[i].key, want->mf->meta[i].key);
		assert_int_equal(mf->meta[i].value_len, want->mf->meta[i].value_len);
		assert_memory_equal(mf->meta[i].value, want->mf->meta[i].value, mf->meta[i].value_len);
	}
	for (size_t i = 0; i < mf->nallocs; i++) {
		assert_string_equal(mf->allocs[i].tag, want->mf->allocs[i].tag);
		/* Left mapped nowhere; on host never mapped at all: the data file
		 * is read into a buffer, hashed there and written into the memfd
		 * from it, no page table made for any of that. */
		assert_int_equal(gf_mem_alloc_state(allocs[i]),
				 gf_mem_kind(want->m) == GF_MEM_HOST ? GF_MEM_ALLOC_CREATED : GF_MEM_ALLOC_UNMAPPED);
		if (!holds(want->m, allocs[i], seed, i))
			fail_msg("restored allocation %zu differs from the snapshotted bytes", i + 1);
	}
	tiers_snapshot_restored_free(mf, allocs);
	free_layout(want);
}

static void test_round_trip(void **state)
{
	(void)state;
	struct layout *l = make_layout(1);
	const char *dir = path_in("rt");
	write_ok(l, dir);
	assert_int_equal(temps_in(tmp), 0);
	struct tiers_manifest *mf;
	assert_int_equal(tiers_snapshot_verify(dir, &mf), 0);
	assert_string_equal(mf->backend, gf_mem_kind_name(kind));
	char uuid[64];
	assert_int_equal(gf_mem_device_uuid(l->m, uuid, sizeof(uuid)), 0);
	assert_string_equal(mf->device_uuid, uuid);
	assert_int_equal(mf->version, TIERS_SNAP_VERSION);
	tiers_manifest_free(mf);
	free_layout(l);
	restore_matches(dir, 1);
}

/* From a populated mapping of the layout (what the tier worker keeps): the same snapshot, verified and restored. */
static void test_write_from_populated(void **state)
{
	(void)state;
	struct layout *l = make_layout(3);
	struct gf_mem_mapping *maps = calloc(l->n, sizeof(*maps));
	uint64_t total = 0;
	for (size_t i = 0; i < l->n; i++) {
		maps[i] = (struct gf_mem_mapping){.offset = total, .alloc = l->allocs[i]};
		total += gf_mem_alloc_size(l->allocs[i]);
	}
	gf_mem_va *va;
	assert_int_equal(gf_mem_reserve(&va, l->m, total, 0), 0);
	assert_int_equal(gf_mem_map_many(va, maps, l->n, GF_MEM_READ), 0);
	if (kind == GF_MEM_HOST)
		gf_mem_populate(gf_mem_va_addr(va), total, false);
	const char *dir = path_in("from");
	struct tiers_snap_stats st = {0};
	int rc = tiers_snapshot_write_from(dir, l->m, l->mf, l->allocs, gf_mem_va_addr(va), &st);
	if (rc < 0)
		fail_msg("snapshot write_from: %s: %s", gf_error_name(rc), gf_error_detail());
	assert_int_equal(st.bytes, total);
	gf_mem_va_free(va);
	free(maps);
	assert_int_equal(tiers_snapshot_verify(dir, NULL), 0);
	free_layout(l);
	restore_matches(dir, 3);
}

/* Mappings of the host backend's memfds in this process (the tier worker's kept source among them). */
static int memfd_mappings(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, "/memfd:gf-mem") != NULL;
	if (f)
		fclose(f);
	return n;
}

/* A second snapshot replaces the first whole; a directory that is no snapshot is never replaced. */
static void test_replace(void **state)
{
	(void)state;
	const char *dir = path_in("replace");
	struct layout *a = make_layout(2), *b = make_layout(3);
	write_ok(a, dir);
	write_ok(b, dir);
	assert_int_equal(temps_in(tmp), 0);
	restore_matches(dir, 3);

	const char *other = path_in("not-a-snapshot");
	char keep[600];
	assert_int_equal(mkdir(other, 0755), 0);
	snprintf(keep, sizeof(keep), "%s/keep.txt", other);
	FILE *f = fopen(keep, "w");
	fputs("mine", f);
	fclose(f);
	assert_int_equal(tiers_snapshot_write(other, a->m, a->mf, a->allocs, NULL), GF_ERR_INVALID_ARG);
	assert_non_null(strstr(gf_error_detail(), "not a snapshot directory"));
	assert_int_equal(access(keep, F_OK), 0);
	assert_int_equal(temps_in(tmp), 0);
	free_layout(a);
	free_layout(b);
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	rewind(f);
	char *s = malloc((size_t)n + 1);
	assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
	s[n] = 0;
	fclose(f);
	*len = (size_t)n;
	return s;
}

static void spit(const char *path, const char *s, size_t n)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(s, 1, n, f), n);
	fclose(f);
}

/* Copy snapshot @from to @to (two files). */
static void copy_snapshot(const char *from, const char *to)
{
	char a[600], b[600];
	size_t n;
	mkdir(to, 0755);
	const char *files[] = { TIERS_SNAP_MANIFEST, TIERS_SNAP_DATA };
	for (size_t i = 0; i < 2; i++) {
		snprintf(a, sizeof(a), "%s/%s", from, files[i]);
		snprintf(b, sizeof(b), "%s/%s", to, files[i]);
		char *s = slurp(a, &n);
		spit(b, s, n);
		free(s);
	}
}

/* Restore of @dir fails with @code, the detail contains @words, and nothing stays allocated. */
static void refused(const char *dir, int code, const char *words)
{
	gf_mem *m;
	assert_int_equal(gf_mem_open(&m, kind, 0), 0);
	int fds = tu_count_fds();
	struct tiers_manifest *mf = NULL;
	gf_mem_alloc **allocs = NULL;
	int rc = tiers_snapshot_restore(dir, m, &mf, &allocs, NULL);
	if (rc != code || !strstr(gf_error_detail(), words))
		fail_msg("restore %s: got %s \"%s\", want %s with \"%s\"", dir, gf_error_name(rc), gf_error_detail(),
			 gf_error_name(code), words);
	assert_null(mf);
	assert_null(allocs);
	assert_int_equal(tu_count_fds(), fds);
	gf_mem_free(m);
}

/* Replace the first occurrence of @from in @dir's manifest with @to. */
static void edit_manifest(const char *dir, const char *from, const char *to)
{
	char p[600];
	size_t n;
	snprintf(p, sizeof(p), "%s/%s", dir, TIERS_SNAP_MANIFEST);
	char *s = slurp(p, &n);
	char *at = strstr(s, from);
	if (!at)
		fail_msg("manifest of %s has no \"%s\"", dir, from);
	char *out = malloc(n + strlen(to) + 1);
	size_t pre = (size_t)(at - s);
	memcpy(out, s, pre);
	strcpy(out + pre, to);
	strcat(out, at + strlen(from));
	spit(p, out, strlen(out));
	free(out);
	free(s);
}

static void test_refusals(void **state)
{
	(void)state;
	struct layout *l = make_layout(4);
	const char *good = path_in("good");
	write_ok(l, good);
	char p[600];
	size_t n;

	const char *flip = path_in("flipped");
	copy_snapshot(good, flip);
	snprintf(p, sizeof(p), "%s/%s", flip, TIERS_SNAP_DATA);
	char *s = slurp(p, &n);
	s[n / 2] ^= 0x10;
	spit(p, s, n);
	free(s);
	refused(flip, GF_ERR_PROTOCOL, "checksum mismatch in allocation 3");
	assert_int_equal(tiers_snapshot_verify(flip, NULL), GF_ERR_PROTOCOL);
	/* The manifest itself is fine: only reading the data finds the flip. */
	struct tiers_manifest *mf;
	assert_int_equal(tiers_snapshot_open(flip, &mf), 0);
	tiers_manifest_free(mf);

	const char *trunc = path_in("truncated");
	copy_snapshot(good, trunc);
	snprintf(p, sizeof(p), "%s/%s", trunc, TIERS_SNAP_DATA);
	assert_int_equal(truncate(p, (off_t)(l->mf->total_bytes - 1)), 0);
	refused(trunc, GF_ERR_PROTOCOL, "truncated");

	const char *mtrunc = path_in("manifest-truncated");
	copy_snapshot(good, mtrunc);
	snprintf(p, sizeof(p), "%s/%s", mtrunc, TIERS_SNAP_MANIFEST);
	s = slurp(p, &n);
	spit(p, s, n / 2);
	free(s);
	refused(mtrunc, GF_ERR_PROTOCOL, "not JSON");

	const char *ver = path_in("other-version");
	copy_snapshot(good, ver);
	edit_manifest(ver, "\"version\": 1", "\"version\": 2");
	refused(ver, GF_ERR_VERSION, "format version 2");

	/* Half the granularity: every size is still a multiple, the hash still matches; the device differs. */
	const char *gran = path_in("other-granularity");
	char from[64], to[64];
	copy_snapshot(good, gran);
	snprintf(from, sizeof(from), "\"granularity\": %llu", (unsigned long long)l->mf->granularity);
	snprintf(to, sizeof(to), "\"granularity\": %llu", (unsigned long long)l->mf->granularity / 2);
	edit_manifest(gran, from, to);
	refused(gran, GF_ERR_INVALID_ARG, "granularity");

	const char *be = path_in("other-backend");
	copy_snapshot(good, be);
	snprintf(from, sizeof(from), "\"backend\": \"%s\"", gf_mem_kind_name(kind));
	snprintf(to, sizeof(to), "\"backend\": \"%s\"", kind == GF_MEM_HOST ? "cuda" : "host");
	edit_manifest(be, from, to);
	refused(be, GF_ERR_INVALID_ARG, "backend");

	/* A changed size no longer matches the layout hash (nor the offsets that follow). */
	const char *edited = path_in("edited");
	copy_snapshot(good, edited);
	snprintf(from, sizeof(from), "\"size\": %llu", (unsigned long long)l->mf->allocs[0].size);
	snprintf(to, sizeof(to), "\"size\": %llu", (unsigned long long)l->mf->allocs[0].size * 2);
	edit_manifest(edited, from, to);
	refused(edited, GF_ERR_PROTOCOL, "snapshot manifest");

	const char *tag = path_in("edited-meta");
	copy_snapshot(good, tag);
	edit_manifest(tag, "\"key\": \"lm_head\"", "\"key\": \"lm_tail\"");
	refused(tag, GF_ERR_PROTOCOL, "layout_hash");

	refused(path_in("absent"), GF_ERR_NOT_FOUND, "absent");

	/* Probes: present with its figures, absent without a word, refused with the reason. */
	struct tiers_snap_probe pr;
	tiers_snapshot_probe(good, &pr);
	assert_true(pr.present);
	assert_int_equal(pr.bytes, l->mf->total_bytes);
	assert_int_equal(pr.allocations, l->n);
	assert_int_equal(pr.generation, 4);
	assert_memory_equal(pr.layout_hash, l->mf->layout_hash, 16);
	assert_true(pr.age_ms >= 0 && pr.age_ms < 600000);
	assert_string_equal(pr.backend, gf_mem_kind_name(kind));
	tiers_snapshot_probe(path_in("absent"), &pr);
	assert_false(pr.present);
	assert_string_equal(pr.error, "");
	tiers_snapshot_probe(ver, &pr);
	assert_false(pr.present);
	assert_non_null(strstr(pr.error, "format version 2"));
	tiers_snapshot_probe(trunc, &pr);
	assert_false(pr.present);
	assert_non_null(strstr(pr.error, "truncated"));
	restore_matches(good, 4);
	free_layout(l);
}

/*
 * A restore whose reads of the data file or writes into the new allocations
 * fail, or end early, is refused with what happened and leaves nothing
 * allocated: on host nothing is read back from the memory to catch a bad
 * write later, so each write's result is the check. Reads and writes that
 * come back short are resumed and the restore is whole.
 */
static void test_io_faults(void **state)
{
	(void)state;
	struct layout *l = make_layout(13);
	const char *dir = path_in("io-faults");
	write_ok(l, dir);
	free_layout(l);

	/* code 0: the restore must come out whole despite the fault. */
	static const struct {
		int read, write, after, code;
		const char *msg;
		bool host_only; /* the cuda path writes through the driver, not pwrite */
	} cases[] = {
		{ IO_FAIL, IO_NONE, 1, GF_ERR_IO, "Input/output error", false },
		{ IO_EOF, IO_NONE, 1, GF_ERR_PROTOCOL, "truncated while reading", false },
		{ IO_SHORT, IO_NONE, 0, 0, NULL, false },
		{ IO_NONE, IO_FAIL, 3, GF_ERR_IO, "write into allocation", true },
		{ IO_NONE, IO_SHORT, 0, 0, NULL, true },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		if (cases[i].host_only && kind != GF_MEM_HOST)
			continue;
		io_fault_arm(cases[i].read, cases[i].write, cases[i].after);
		if (cases[i].code)
			refused(dir, cases[i].code, cases[i].msg);
		else
			restore_matches(dir, 13);
		assert_true(io_fault_disarm() > 0);
	}
	restore_matches(dir, 13);
}

/* A writer SIGKILLed at any point leaves the previous snapshot whole; the next writer removes its temporary. */
static void test_killed_writer(void **state)
{
	(void)state;
	const char *dir = path_in("killed");
	struct layout *a = make_layout(5);
	write_ok(a, dir);
	free_layout(a);
	for (int round = 0; round < 3; round++) {
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			struct layout *b = make_layout(6);
			for (;;)
				tiers_snapshot_write(dir, b->m, b->mf, b->allocs, NULL);
		}
		usleep(20000 + 40000 * round);
		kill(pid, SIGKILL);
		int st;
		waitpid(pid, &st, 0);
		/* Whichever snapshot is there (5, or 6 if one completed), it is whole. */
		struct tiers_manifest *mf;
		int rc = tiers_snapshot_verify(dir, &mf);
		if (rc < 0)
			fail_msg("after SIGKILL (round %d): %s: %s", round, gf_error_name(rc), gf_error_detail());
		uint64_t gen = mf->generation;
		tiers_manifest_free(mf);
		assert_true(gen == 5 || gen == 6);
		restore_matches(dir, gen);
	}
	struct layout *c = make_layout(7);
	write_ok(c, dir);
	assert_int_equal(temps_in(tmp), 0);
	free_layout(c);
	restore_matches(dir, 7);
}

/* Temporaries of dead writers go; one of a live writer stays. */
static void test_stale_temps(void **state)
{
	(void)state;
	const char *dir = path_in("stale");
	pid_t dead = fork();
	if (dead == 0)
		_exit(0);
	waitpid(dead, NULL, 0);
	char t1[600], t2[600], f[700];
	snprintf(t1, sizeof(t1), "%s/.stale.tmp-%ld-deadbeef", tmp, (long)dead);
	snprintf(t2, sizeof(t2), "%s/.stale.tmp-%ld-0badf00d", tmp, (long)getppid());
	assert_int_equal(mkdir(t1, 0755), 0);
	assert_int_equal(mkdir(t2, 0755), 0);
	snprintf(f, sizeof(f), "%s/%s", t1, TIERS_SNAP_DATA);
	spit(f, "partial", 7);
	struct layout *l = make_layout(8);
	write_ok(l, dir);
	free_layout(l);
	assert_int_equal(access(t1, F_OK), -1);
	assert_int_equal(access(t2, F_OK), 0);
	rmdir(t2);
}

/* A small tmpfs of our own: full disk and read-only file system. */
static void test_disk_full_and_readonly(void **state)
{
	(void)state;
	const char *mnt = path_in("small-fs");
	assert_int_equal(mkdir(mnt, 0755), 0);
	struct layout *l = make_layout(9);
	/* Room for one snapshot plus a little: the second one cannot fit beside it. */
	char opts[64];
	uint64_t total = 0;
	for (size_t i = 0; i < l->n; i++)
		total += gf_mem_alloc_size(l->allocs[i]);
	snprintf(opts, sizeof(opts), "size=%llu", (unsigned long long)(total + total / 2));
	if (mount("gf-test", mnt, "tmpfs", 0, opts) < 0) {
		int e = errno;
		free_layout(l);
		rmdir(mnt);
		fprintf(stderr, "# skip: cannot mount a small tmpfs (%s): needs root with CAP_SYS_ADMIN\n", strerror(e));
		skip();
	}
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/snap", mnt);
	write_ok(l, dir);
	struct layout *big = make_layout(10);
	int rc = tiers_snapshot_write(dir, big->m, big->mf, big->allocs, NULL);
	if (rc != GF_ERR_IO || !strstr(gf_error_detail(), "no space left"))
		fail_msg("disk full: got %s \"%s\"", gf_error_name(rc), gf_error_detail());
	assert_int_equal(temps_in(mnt), 0);
	restore_matches(dir, 9);

	assert_int_equal(mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL), 0);
	rc = tiers_snapshot_write(dir, big->m, big->mf, big->allocs, NULL);
	if (rc != GF_ERR_IO || !strstr(gf_error_detail(), "Read-only"))
		fail_msg("read-only: got %s \"%s\"", gf_error_name(rc), gf_error_detail());
	restore_matches(dir, 9);
	free_layout(big);
	free_layout(l);
	assert_int_equal(umount(mnt), 0);
	rmdir(mnt);
}

/* cuda: a failing device copy fails the snapshot cleanly; the previous one stays. */
static void test_copy_fault(void **state)
{
	(void)state;
	const char *dir = path_in("copy-fault");
	struct layout *a = make_layout(11), *b = make_layout(12);
	write_ok(a, dir);
	tu_env_set("FAKECUDA_COPY_FAIL", "2");
	int rc = tiers_snapshot_write(dir, b->m, b->mf, b->allocs, NULL);
	tu_env_set("FAKECUDA_COPY_FAIL", NULL);
	if (rc != GF_ERR_DRIVER || !strstr(gf_error_detail(), "cuMemcpyDtoHAsync"))
		fail_msg("copy fault: got %s \"%s\"", gf_error_name(rc), gf_error_detail());
	assert_int_equal(temps_in(tmp), 0);
	free_layout(a);
	free_layout(b);
	restore_matches(dir, 11);
}

/* Export one fd per allocation and copy the manifest's layout, as the server hands a job over. */
static void job_of(struct layout *l, struct tiers_manifest **mf, int **fds)
{
	*fds = calloc(l->n, sizeof(**fds));
	for (size_t i = 0; i < l->n; i++)
		assert_int_equal(gf_mem_export(l->allocs[i], &(*fds)[i]), 0);
	struct tiers_manifest *c = tiers_manifest_new();
	c->nallocs = l->n;
	c->allocs = calloc(l->n, sizeof(*c->allocs));
	memcpy(c->allocs, l->mf->allocs, l->n * sizeof(*c->allocs));
	c->nmeta = l->mf->nmeta;
	c->meta = calloc(c->nmeta, sizeof(*c->meta));
	for (size_t i = 0; i < c->nmeta; i++) {
		c->meta[i] = l->mf->meta[i];
		c->meta[i].key = strdup(l->mf->meta[i].key);
		c->meta[i].value = malloc(c->meta[i].value_len);
		memcpy(c->meta[i].value, l->mf->meta[i].value, c->meta[i].value_len);
	}
	c->generation = l->mf->generation;
	memcpy(c->layout_hash, l->mf->layout_hash, 16);
	*mf = c;
}

static void wait_job(struct tierd *t)
{
	struct pollfd p = { .fd = tierd_get_fd(t), .events = POLLIN };
	assert_int_equal(poll(&p, 1, 120000), 1);
	assert_true(tierd_collect(t));
	assert_false(tierd_busy(t));
}

/* The tier worker: snapshot to WARM and COLD on its thread, phases, status, metrics, best-tier restore with fallback. */
static void test_tier_worker(void **state)
{
	(void)state;
	struct tierd *t;
	assert_int_equal(tierd_new(&t, kind, 0), 0);
	char warm[600], cold[600];
	snprintf(warm, sizeof(warm), "%s/warm", tmp);
	snprintf(cold, sizeof(cold), "%s/cold", tmp);
	assert_int_equal(tierd_set_dirs(t, warm, cold), 0);
	gf_mem *m;
	assert_int_equal(gf_mem_open(&m, kind, 0), 0);
	struct tiers_manifest *mf;
	gf_mem_alloc **allocs;
	enum tier from;
	assert_int_equal(tierd_restore(t, NULL, m, &mf, &allocs, &from), GF_ERR_NOT_FOUND);
	assert_non_null(strstr(gf_error_detail(), "wait for the loader"));

	struct layout *l = make_layout(21);
	int *fds;
	job_of(l, &mf, &fds);
	int nfds = tu_count_fds();
	assert_int_equal(tierd_snapshot_start(t, NULL, mf, fds), 0);
	struct tiers_op op;
	tierd_op(t, &op);
	assert_int_equal(op.kind, TIERS_OP_SNAPSHOT);
	assert_true(op.phase == TIERS_PHASE_PENDING || op.phase == TIERS_PHASE_CHECKPOINTING ||
		    op.phase == TIERS_PHASE_CHECKPOINTED);
	wait_job(t);
	assert_true(tu_count_fds() < nfds); /* the worker closed the fds it was given */
	tierd_op(t, &op);
	if (op.phase != TIERS_PHASE_CHECKPOINTED)
		fail_msg("snapshot job: %s: %s", tiers_phase_name(op.phase), op.reason);
	assert_non_null(strstr(op.reason, "cold"));
	assert_true(op.bytes > 2 * GF_MEM_XFER_CHUNK);
	/* Host: the worker keeps the layout mapped, populated, for the next snapshot of it (another
	 * directory here), and lets go when told the layout dropped. */
	if (kind == GF_MEM_HOST) {
		int kept = memfd_mappings();
		assert_true(kept >= (int)l->n);
		job_of(l, &mf, &fds);
		assert_int_equal(tierd_snapshot_start(t, path_in("again"), mf, fds), 0);
		wait_job(t);
		tierd_op(t, &op);
		assert_int_equal(op.phase, TIERS_PHASE_CHECKPOINTED);
		assert_int_equal(memfd_mappings(), kept);
		assert_int_equal(tiers_snapshot_verify(path_in("again"), NULL), 0);
		tierd_release_source(t);
		assert_true(memfd_mappings() < kept);
	}
	struct tiers_snap_probe pw, pc;
	tierd_probe(t, TIER_WARM, &pw);
	tierd_probe(t, TIER_COLD, &pc);
	assert_true(pw.present && pc.present);
	assert_int_equal(pw.generation, 21);
	assert_int_equal(pc.bytes, op.bytes);

	json_t *js = tierd_status_json(t);
	assert_non_null(js);
	assert_true(json_is_true(json_object_get(json_object_get(js, "warm"), "present")));
	assert_int_equal(json_integer_value(json_object_get(json_object_get(js, "cold"), "generation")), 21);
	assert_string_equal(json_string_value(json_object_get(json_object_get(js, "operation"), "phase")), "Checkpointed");
	json_decref(js);
	char text[8192];
	size_t len = 0;
	tierd_metrics(t, text, sizeof(text), &len);
	assert_non_null(strstr(text, "gf_gms_tier_present{tier=\"warm\"} 1\n"));
	assert_non_null(strstr(text, "gf_gms_tier_present{tier=\"cold\"} 1\n"));
	assert_non_null(strstr(text, "gf_gms_operation_phase{operation=\"snapshot\",phase=\"Checkpointed\"} 1\n"));
	assert_non_null(strstr(text, "gf_gms_tier_age_seconds{tier=\"warm\"}"));

	/* Best tier first. */
	assert_int_equal(tierd_restore(t, NULL, m, &mf, &allocs, &from), 0);
	assert_int_equal(from, TIER_WARM);
	assert_memory_equal(mf->layout_hash, l->mf->layout_hash, 16);
	tiers_snapshot_restored_free(mf, allocs);
	tierd_op(t, &op);
	assert_int_equal(op.phase, TIERS_PHASE_RESTORED);

	/* A WARM copy with a flipped byte is refused and COLD serves, saying so. */
	char p[700];
	size_t n;
	snprintf(p, sizeof(p), "%s/%s", warm, TIERS_SNAP_DATA);
	char *s = slurp(p, &n);
	s[0] ^= 1;
	spit(p, s, n);
	free(s);
	assert_int_equal(tierd_restore(t, NULL, m, &mf, &allocs, &from), 0);
	assert_int_equal(from, TIER_COLD);
	tiers_snapshot_restored_free(mf, allocs);
	tierd_op(t, &op);
	assert_int_equal(op.phase, TIERS_PHASE_RESTORED);
	assert_non_null(strstr(op.reason, "checksum mismatch"));

	/* Both broken: Failed with the reason, nothing returned. */
	snprintf(p, sizeof(p), "%s/%s", cold, TIERS_SNAP_DATA);
	assert_int_equal(truncate(p, 10), 0);
	assert_int_equal(tierd_restore(t, NULL, m, &mf, &allocs, &from), GF_ERR_PROTOCOL);
	tierd_op(t, &op);
	assert_int_equal(op.phase, TIERS_PHASE_FAILED);
	assert_non_null(strstr(op.reason, "checksum mismatch"));

	/* A snapshot that cannot be written ends Failed with the reason. */
	job_of(l, &mf, &fds);
	assert_int_equal(tierd_snapshot_start(t, "/nonexistent-dir/x/snap", mf, fds), 0);
	wait_job(t);
	tierd_op(t, &op);
	assert_int_equal(op.phase, TIERS_PHASE_FAILED);
	assert_non_null(strstr(op.reason, "/nonexistent-dir/x"));
	free_layout(l);
	gf_mem_free(m);
	tierd_free(t);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "cuda") == 0)
		kind = GF_MEM_CUDA;
	else if (argc > 1 && strcmp(argv[1], "host") != 0) {
		fprintf(stderr, "usage: %s host|cuda\n", argv[0]);
		return 2;
	}
	tmp = tu_tmpdir();
	char *state_dir = NULL;
	if (kind == GF_MEM_CUDA && !getenv("FAKECUDA_STATE_DIR")) {
		state_dir = tu_tmpdir();
		setenv("FAKECUDA_STATE_DIR", state_dir, 1);
	}
	struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_write_from_populated),
		cmocka_unit_test(test_replace),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_io_faults),
		cmocka_unit_test(test_killed_writer),
		cmocka_unit_test(test_stale_temps),
		cmocka_unit_test(test_disk_full_and_readonly),
		cmocka_unit_test(test_tier_worker),
		cmocka_unit_test(test_copy_fault), /* cuda only: last */
	};
	size_t n = GF_ARRAY_SIZE(tests) - (kind == GF_MEM_CUDA ? 0 : 1);
	int rc = tu_run_tests(tests, n, NULL, NULL);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	if (system(cmd) != 0)
		fprintf(stderr, "# could not remove %s\n", tmp);
	if (state_dir) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", state_dir);
		if (system(cmd) != 0)
			fprintf(stderr, "# could not remove %s\n", state_dir);
	}
	free(tmp);
	free(state_dir);
	return rc;
}
