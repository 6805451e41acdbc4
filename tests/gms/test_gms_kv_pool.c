/* SPDX-License-Identifier: Apache-2.0 */
/* The KV pool (docs/gms.md, "The KV pool"): only the lock's current holder
 * maps it, with its grant's proof; a standby, a stale epoch and an unfenced
 * GMS are refused; the pool and its directory outlive the holder; a new
 * holder adopts the directory only for the same layout and epoch chain; a
 * holder killed while writing a block leaves it out of the directory. Real
 * in-process lock server and GMS; the killed holder is a child process. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gmslock.h"
#include "testutil.h"

#define POOL (2u << 20)
#define BLOCK 4096u

static const uint8_t L1[16] = { 1 }, L2[16] = { 2 };

static int setup(void **state)
{
	struct world *w = gl_start();
	/* Weights committed, so KV clients connect as readers, as engines do. */
	gf_gms *g;
	uint64_t id;
	assert_int_equal(gf_gms_connect(&g, w->gms.uri, w->mem, GF_GMS_RW, 3000, NULL), 0);
	assert_int_equal(gf_gms_allocate(g, 4096, "weights", &id), 0);
	assert_int_equal(gf_gms_commit(g, NULL), 0);
	gf_gms_free(g);
	*state = w;
	return 0;
}

static int teardown(void **state)
{
	gl_free(*state);
	return 0;
}

static gf_gms *reader(struct world *w)
{
	gf_gms *g;
	assert_int_equal(gf_gms_connect(&g, w->gms.uri, w->mem, GF_GMS_RO, 3000, NULL), 0);
	return g;
}

static struct gf_lock_proof acquire(struct world *w, const char *id, gf_lock **out)
{
	struct gf_lock_grant gr;
	struct gf_lock_proof p;
	assert_int_equal(gf_lock_new(out, w->lock_uri, id), 0);
	assert_int_equal(gf_lock_acquire(*out, 5000, &gr), 0);
	assert_int_equal(gf_lock_grant_proof(&gr, &p), 0);
	return p;
}

/* Map the pool: its memory mapped shared in this process, or NULL with *rc the error. */
static uint8_t *kv_map(gf_gms *g, const struct gf_lock_proof *p, const uint8_t layout[16], uint64_t previous,
		       struct gf_gms_kv_map_info *info, int *rc)
{
	int fd = -1;
	*rc = gf_gms_kv_map(g, p, POOL, BLOCK, layout, previous, &fd, info);
	if (*rc < 0)
		return NULL;
	void *m = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	assert_true(m != MAP_FAILED);
	return m;
}

static struct gf_gms_kv_block blk(uint32_t index, uint8_t tag)
{
	struct gf_gms_kv_block b = { .index = index, .hash_len = 32 };
	memset(b.hash, tag, sizeof(b.hash));
	return b;
}

static size_t dir_of(gf_gms *g, struct gf_gms_kv_block **b, uint64_t *epoch)
{
	size_t n = 0;
	assert_int_equal(gf_gms_kv_directory(g, b, &n, epoch), 0);
	return n;
}

static int json_has(const char *uri, const char *needle)
{
	char *js;
	assert_int_equal(gf_gms_status_json(uri, 2000, &js), 0);
	int r = strstr(js, needle) != NULL;
	if (!r)
		fprintf(stderr, "# status lacks %s: %s\n", needle, js);
	free(js);
	return r;
}

/* Only the lock's current holder maps the pool; a standby (no grant), a
 * forged proof and a GMS that no lock fences are refused. */
static void test_only_holder_maps(void **state)
{
	struct world *w = *state;
	gf_gms *standby = reader(w), *holder = reader(w);
	struct gf_gms_kv_map_info info;
	int rc;
	gf_lock *a;
	struct gf_lock_proof pa = acquire(w, "a", &a);
	/* A standby knows the public epoch at most: a proof it made up fails. */
	struct gf_lock_proof forged = pa;
	forged.token[0] ^= 1;
	assert_null(kv_map(standby, &forged, L1, 0, &info, &rc));
	assert_int_equal(rc, GF_ERR_PERMISSION);
	assert_non_null(strstr(gf_error_detail(), "only the lock's current holder"));
	struct gf_lock_proof none = { 0 };
	assert_int_equal(gf_gms_kv_map(standby, &none, POOL, BLOCK, L1, 0, &(int){ 0 }, NULL), GF_ERR_INVALID_ARG);
	assert_true(json_has(w->gms.uri, "\"kv_pool\":null"));

	uint8_t *m = kv_map(holder, &pa, L1, 0, &info, &rc);
	assert_int_equal(rc, 0);
	assert_int_equal(info.size, POOL);
	assert_int_equal(info.created, 1);
	assert_string_equal(info.start, "first");
	assert_int_equal(info.blocks, 0);
	memset(m, 0x5a, BLOCK);
	struct gf_gms_kv_block b0 = blk(0, 0xa0);
	assert_int_equal(gf_gms_kv_publish(holder, pa.epoch, 0, &b0, 1, NULL, 0), 0);
	/* Another connection of the same holder is not the map's: its publish is refused. */
	assert_int_equal(gf_gms_kv_publish(standby, pa.epoch, 0, &b0, 1, NULL, 0), GF_ERR_PERMISSION);
	/* An index outside the pool is refused whole. */
	struct gf_gms_kv_block far[2] = { blk(1, 0xa1), blk(POOL / BLOCK, 0xa2) };
	assert_int_equal(gf_gms_kv_publish(holder, pa.epoch, 0, far, 2, NULL, 0), GF_ERR_INVALID_ARG);
	/* The size is fixed at creation. */
	assert_int_equal(gf_gms_kv_map(holder, &pa, POOL * 2, BLOCK, L1, 0, &(int){ 0 }, NULL), GF_ERR_INVALID_ARG);

	struct gf_gms_kv_block *bs;
	uint64_t owner;
	assert_int_equal(dir_of(standby, &bs, &owner), 1); /* anyone may read it */
	assert_int_equal(owner, pa.epoch);
	assert_int_equal(bs[0].index, 0);
	assert_memory_equal(bs[0].hash, b0.hash, 32);
	free(bs);
	char needle[96];
	snprintf(needle, sizeof(needle), "\"mapped\":true,\"epoch\":%llu", (unsigned long long)pa.epoch);
	assert_true(json_has(w->gms.uri, needle));
	assert_true(json_has(w->gms.uri, "\"blocks\":1"));
	assert_true(json_has(w->gms.uri, "\"refusals\":2"));
	char *metrics;
	assert_int_equal(gf_gmsd_metrics(w->gms.d, &metrics), 0);
	assert_non_null(strstr(metrics, "gf_gms_kv_pool_blocks 1\n"));
	assert_non_null(strstr(metrics, "gf_gms_kv_pool_mapped 1\n"));
	free(metrics);

	/* The holder's connection ends: unmapped, the pool and its directory stay. */
	munmap(m, POOL);
	gf_gms_free(holder);
	assert_true(json_has(w->gms.uri, "event=kv_unmapped"));
	assert_true(json_has(w->gms.uri, "\"mapped\":false"));
	assert_true(json_has(w->gms.uri, "\"blocks\":1"));
	gf_gms_free(standby);
	gf_lock_free(a);

	/* A GMS no lock fences cannot tell the holder: it refuses the pool. */
	struct gt_server plain;
	assert_int_equal(gt_start(&plain, w->dir, "plain", 0), 0);
	gf_gms *g;
	assert_int_equal(gf_gms_connect(&g, plain.uri, w->mem, GF_GMS_RW_OR_RO, 3000, NULL), 0);
	assert_int_equal(gf_gms_kv_map(g, &pa, POOL, BLOCK, L1, 0, &(int){ 0 }, NULL), GF_ERR_NOT_SUPPORTED);
	gf_gms_free(g);
	gt_stop(&plain);
}

/* A revoked holder's map and publish are refused; the new holder adopts its directory. */
static void test_stale_epoch_refused(void **state)
{
	struct world *w = *state;
	gf_gms *ga = reader(w), *gb = reader(w);
	struct gf_gms_kv_map_info info;
	int rc;
	gf_lock *a, *b;
	struct gf_lock_proof pa = acquire(w, "a", &a);
	uint8_t *ma = kv_map(ga, &pa, L1, 0, &info, &rc);
	assert_int_equal(rc, 0);
	struct gf_gms_kv_block b0 = blk(3, 0xb3);
	assert_int_equal(gf_gms_kv_publish(ga, pa.epoch, 0, &b0, 1, NULL, 0), 0);

	assert_int_equal(gf_lock_revoke(w->lock_uri, NULL, 0, pa.epoch, 2000), 0);
	struct gf_lock_proof pb = acquire(w, "b", &b);
	assert_true(pb.epoch > pa.epoch);
	/* The revoked holder does not know yet: its map again is refused. */
	assert_null(kv_map(ga, &pa, L1, 0, &info, &rc));
	assert_int_equal(rc, GF_ERR_PERMISSION);
	uint8_t *mb = kv_map(gb, &pb, L1, pa.epoch, &info, &rc);
	assert_int_equal(rc, 0);
	assert_int_equal(info.created, 0);
	assert_string_equal(info.start, "adopted");
	assert_int_equal(info.previous_epoch, pa.epoch);
	assert_int_equal(info.blocks, 1);
	assert_true(json_has(w->gms.uri, "event=kv_takeover"));
	/* The old map's connection is no longer the pool's: its publish is refused. */
	struct gf_gms_kv_block b1 = blk(4, 0xb4);
	assert_int_equal(gf_gms_kv_publish(ga, pa.epoch, 0, &b1, 1, NULL, 0), GF_ERR_PERMISSION);
	assert_int_equal(gf_gms_kv_publish(gb, pa.epoch, 0, &b1, 1, NULL, 0), GF_ERR_PERMISSION);
	assert_int_equal(gf_gms_kv_publish(gb, pb.epoch, 0, &b1, 1, NULL, 0), 0);
	/* Both see the same memory: the pool is one. */
	ma[BLOCK * 4] = 0x77;
	assert_int_equal(mb[BLOCK * 4], 0x77);
	struct gf_gms_kv_block *bs;
	assert_int_equal(dir_of(gb, &bs, NULL), 2);
	free(bs);
	munmap(ma, POOL);
	munmap(mb, POOL);
	gf_gms_free(ga);
	gf_gms_free(gb);
	gf_lock_free(a);
	gf_lock_free(b);
}

/* Another layout, or a chain that does not hold, starts the directory empty. */
static void test_layout_change_empties(void **state)
{
	struct world *w = *state;
	struct gf_gms_kv_map_info info;
	int rc;
	gf_lock *a;
	gf_gms *g = reader(w);
	struct gf_lock_proof pa = acquire(w, "a", &a);
	uint8_t *m = kv_map(g, &pa, L1, 0, &info, &rc);
	assert_int_equal(rc, 0);
	struct gf_gms_kv_block bl[300];
	for (uint32_t i = 0; i < 300; i++)
		bl[i] = blk(i, (uint8_t)i);
	assert_int_equal(gf_gms_kv_publish(g, pa.epoch, 0, bl, 300, NULL, 0), 0); /* two batches */
	uint32_t gone[2] = { 7, 299 };
	assert_int_equal(gf_gms_kv_publish(g, pa.epoch, 0, NULL, 0, gone, 2), 0);
	struct gf_gms_kv_block *bs;
	assert_int_equal(dir_of(g, &bs, NULL), 298); /* two replies */
	assert_int_equal(bs[7].index, 8);
	free(bs);
	munmap(m, POOL);
	gf_gms_free(g);
	gf_lock_free(a);

	/* The next holder names another previous holder: the chain breaks. */
	gf_lock *b;
	g = reader(w);
	struct gf_lock_proof pb = acquire(w, "b", &b);
	m = kv_map(g, &pb, L1, pa.epoch + 100, &info, &rc);
	assert_int_equal(rc, 0);
	assert_string_equal(info.start, "chain");
	assert_int_equal(info.blocks, 0);
	assert_int_equal(gf_gms_kv_publish(g, pb.epoch, 0, bl, 5, NULL, 0), 0);
	munmap(m, POOL);
	gf_gms_free(g);
	gf_lock_free(b);

	/* Another layout: empty, whatever the chain. */
	gf_lock *c;
	g = reader(w);
	struct gf_lock_proof pc = acquire(w, "c", &c);
	m = kv_map(g, &pc, L2, pb.epoch, &info, &rc);
	assert_int_equal(rc, 0);
	assert_string_equal(info.start, "layout");
	assert_int_equal(info.blocks, 0);
	assert_int_equal(dir_of(g, &bs, NULL), 0);
	assert_null(bs);
	assert_true(json_has(w->gms.uri, "\"start\":\"layout\""));
	munmap(m, POOL);
	gf_gms_free(g);
	gf_lock_free(c);
}

/* A holder killed while writing a block: the blocks it finished are in the
 * directory with their content, the one it was writing is not. */
static void test_killed_mid_write(void **state)
{
	struct world *w = *state;
	int ready[2];
	assert_int_equal(pipe(ready), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(ready[0]);
		gf_mem *mem;
		gf_gms *g;
		gf_lock *a;
		struct gf_lock_grant gr;
		struct gf_lock_proof p;
		int fd;
		if (gf_mem_open(&mem, GF_MEM_HOST, 0) || gf_gms_connect(&g, w->gms.uri, mem, GF_GMS_RO, 3000, NULL) ||
		    gf_lock_new(&a, w->lock_uri, "dying") || gf_lock_acquire(a, 5000, &gr) ||
		    gf_lock_grant_proof(&gr, &p) || gf_gms_kv_map(g, &p, POOL, BLOCK, L1, 0, &fd, NULL))
			_exit(2);
		uint8_t *m = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED)
			_exit(3);
		/* Block 1: written, then published. Block 2: being written when killed. */
		memset(m + BLOCK, 0x11, BLOCK);
		struct gf_gms_kv_block b1 = blk(1, 0xc1);
		if (gf_gms_kv_publish(g, p.epoch, 0, &b1, 1, NULL, 0))
			_exit(4);
		memset(m + 2 * BLOCK, 0x22, BLOCK / 2);
		uint64_t e = p.epoch;
		if (write(ready[1], &e, sizeof(e)) != sizeof(e))
			_exit(5);
		for (;;)
			pause();
	}
	close(ready[1]);
	uint64_t dead_epoch = 0;
	assert_int_equal(read(ready[0], &dead_epoch, sizeof(dead_epoch)), (ssize_t)sizeof(dead_epoch));
	close(ready[0]);
	kill(pid, SIGKILL);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);

	gf_lock *b;
	gf_gms *g = reader(w);
	struct gf_lock_proof pb = acquire(w, "b", &b); /* granted once the dead holder's connection is gone */
	struct gf_gms_kv_map_info info;
	int rc;
	uint8_t *m = kv_map(g, &pb, L1, dead_epoch, &info, &rc);
	assert_int_equal(rc, 0);
	assert_string_equal(info.start, "adopted");
	assert_int_equal(info.previous_epoch, dead_epoch);
	assert_int_equal(info.blocks, 1);
	struct gf_gms_kv_block *bs;
	assert_int_equal(dir_of(g, &bs, NULL), 1);
	assert_int_equal(bs[0].index, 1);
	free(bs);
	/* The same memory: block 1's content survived, no zeroing. */
	assert_int_equal(m[BLOCK], 0x11);
	assert_int_equal(m[2 * BLOCK + BLOCK - 1], 0);     /* the half never written */
	assert_int_equal(m[2 * BLOCK], 0x22);                 /* written, but not in the directory */
	assert_true(json_has(w->gms.uri, "event=kv_unmapped"));
	munmap(m, POOL);
	gf_gms_free(g);
	gf_lock_free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_only_holder_maps, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stale_epoch_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_layout_change_empties, setup, teardown),
		cmocka_unit_test_setup_teardown(test_killed_mid_write, setup, teardown),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
