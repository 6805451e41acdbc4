/* SPDX-License-Identifier: Apache-2.0 */
/* A GMS fenced by a lock (gf_gmsd_set_lock): the committed layout is dropped
 * only for the lock's current holder, proven by its grant's fence proof; the
 * public epoch alone, a forged proof, stale, missing or revoked grants are
 * refused and the weights stay. The fence's question to the lock server does
 * not hold up the GMS's other clients. Real in-process lock server and GMS. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gmslock.h"
#include "testutil.h"

static int setup(void **state)
{
	*state = gl_start();
	return 0;
}

static int setup_mute(void **state)
{
	*state = gl_start_mute();
	return 0;
}

static int teardown(void **state)
{
	gl_free(*state);
	return 0;
}

/* Load and commit one allocation holding @byte as writer with @proof (NULL:
 * none; epoch only when @token is false); returns the connect's result. */
static int load_as(struct world *w, const struct gf_lock_proof *proof, bool token, uint8_t byte)
{
	gf_gms *g;
	/* Without the token only the epoch goes: a fenced GMS refuses a drop on it. */
	const struct gf_gms_connect_opts o = token ? (struct gf_gms_connect_opts){ .proof = proof }
						   : (struct gf_gms_connect_opts){ .lock_epoch = proof ? proof->epoch : 0 };
	int rc = gf_gms_connect(&g, w->gms.uri, w->mem, GF_GMS_RW, 3000, &o);
	if (rc < 0)
		return rc;
	uint64_t id;
	assert_int_equal(gf_gms_allocate(g, 4096, "weights", &id), 0);
	struct gf_gms_alloc_info ai;
	assert_int_equal(gf_gms_alloc_at(g, 0, &ai), 0);
	memset((void *)(uintptr_t)ai.addr, byte, 4096);
	assert_int_equal(gf_gms_put_meta(g, "w", id, 0, "x", 1), 0);
	assert_int_equal(gf_gms_commit(g, NULL), 0);
	gf_gms_free(g);
	return 0;
}

static int load(struct world *w, const struct gf_lock_proof *proof, uint8_t byte)
{
	return load_as(w, proof, true, byte);
}

static struct gf_lock_proof proof_of(const struct gf_lock_grant *g)
{
	struct gf_lock_proof p;
	assert_int_equal(gf_lock_grant_proof(g, &p), 0);
	return p;
}

/* A grant from gf-lockd carries its proof, made by the server ahead of the
 * grant: the same MAC the holder would compute from the token. */
static void assert_carries_proof(const struct gf_lock_grant *g)
{
	assert_int_equal(g->has_fence_proof, 1);
	struct gf_lock_grant bare = *g;
	bare.has_fence_proof = 0;
	memset(bare.fence_proof, 0, sizeof(bare.fence_proof));
	struct gf_lock_proof computed = proof_of(&bare), carried = proof_of(g);
	assert_int_equal(carried.epoch, g->epoch);
	assert_memory_equal(computed.token, g->fence_proof, GF_LOCK_PROOF_LEN);
	assert_memory_equal(carried.token, computed.token, GF_LOCK_PROOF_LEN);
}

/* The first byte of the committed weights, read by an RO client. */
static int first_byte(struct world *w)
{
	gf_gms *g;
	assert_int_equal(gf_gms_connect(&g, w->gms.uri, w->mem, GF_GMS_RO, 2000, NULL), 0);
	assert_int_equal(gf_gms_map_all(g), 0);
	struct gf_gms_alloc_info ai;
	assert_int_equal(gf_gms_alloc_at(g, 0, &ai), 0);
	int b = *(volatile uint8_t *)(uintptr_t)ai.addr;
	gf_gms_free(g);
	return b;
}

static int json_has(const char *uri, const char *needle)
{
	char *js;
	assert_int_equal(gf_gms_status_json(uri, 2000, &js), 0);
	int r = strstr(js, needle) != NULL;
	free(js);
	return r;
}

static void test_fence(void **state)
{
	struct world *w = *state;
	/* The first load needs no grant: nothing is committed yet. */
	assert_int_equal(load(w, NULL, 0x11), 0);
	assert_int_equal(first_byte(w), 0x11);

	/* No holder at all: a drop is refused. */
	assert_int_equal(load(w, NULL, 0x22), GF_ERR_PERMISSION);
	assert_non_null(strstr(gf_error_detail(), "only the lock's current holder"));

	gf_lock *a;
	struct gf_lock_grant ga;
	assert_int_equal(gf_lock_new(&a, w->lock_uri, "a"), 0);
	assert_int_equal(gf_lock_acquire(a, 2000, &ga), 0);
	struct gf_lock_proof pa = proof_of(&ga);
	assert_carries_proof(&ga);
	/* A writer without the grant, or with a wrong one, cannot drop the weights. */
	assert_int_equal(load(w, NULL, 0x22), GF_ERR_PERMISSION);
	struct gf_lock_grant wrong = ga;
	wrong.epoch++;
	wrong.has_fence_proof = 0; /* computed for the wrong epoch, not the server's copy */
	struct gf_lock_proof pw = proof_of(&wrong);
	assert_int_equal(load(w, &pw, 0x22), GF_ERR_PERMISSION);
	/* Nor can anyone quoting the public epoch (gfctl lock status shows it), or a forged proof. */
	assert_int_equal(load_as(w, &pa, false, 0x22), GF_ERR_PERMISSION);
	assert_non_null(strstr(gf_error_detail(), "without a proof"));
	struct gf_lock_proof forged = pa;
	forged.token[0] ^= 1;
	assert_int_equal(load(w, &forged, 0x22), GF_ERR_PERMISSION);
	assert_int_equal(first_byte(w), 0x11);
	/* RW_OR_RO on a committed GMS becomes RO: never fenced. */
	gf_gms *ro;
	assert_int_equal(gf_gms_connect(&ro, w->gms.uri, w->mem, GF_GMS_RW_OR_RO, 2000, NULL), 0);
	assert_int_equal(gf_gms_granted_mode(ro), GF_GMS_RO);
	gf_gms_free(ro);

	/* The holder may reload. */
	assert_int_equal(load(w, &pa, 0x33), 0);
	assert_int_equal(first_byte(w), 0x33);

	/* Revoked: its proof no longer opens the fence; the new holder's does. */
	gf_lock *b;
	struct gf_lock_grant gb;
	assert_int_equal(gf_lock_new(&b, w->lock_uri, "b"), 0);
	assert_int_equal(gf_lock_revoke(w->lock_uri, NULL, 0, ga.epoch, 2000), 0);
	assert_int_equal(gf_lock_acquire(b, 2000, &gb), 0);
	assert_true(gb.epoch > ga.epoch);
	assert_int_equal(load(w, &pa, 0x44), GF_ERR_PERMISSION);
	assert_int_equal(first_byte(w), 0x33);
	struct gf_lock_proof pb = proof_of(&gb);
	assert_carries_proof(&gb);
	assert_int_equal(load(w, &pb, 0x55), 0);
	assert_int_equal(first_byte(w), 0x55);

	assert_true(json_has(w->gms.uri, "\"fenced\":true"));
	assert_true(json_has(w->gms.uri, "\"fence_refusals\":6"));
	assert_true(json_has(w->gms.uri, "event=rw_refused"));
	gf_lock_free(a);
	gf_lock_free(b);
}

struct stray {
	struct world *w;
	int rc;
};

static void *stray_writer(void *arg)
{
	struct stray *s = arg;
	gf_gms *g;
	s->rc = gf_gms_connect(&g, s->w->gms.uri, s->w->mem, GF_GMS_RW, 20000, NULL);
	if (s->rc == 0)
		gf_gms_free(g);
	return NULL;
}

/* A stray RW (no grant) while a layout is committed is refused when it
 * arrives, or when the layout it waited on is committed: it never queues
 * behind the readers, where writer priority would keep every new reader
 * (a standby waking) out until its timeout. */
static void test_stray_writer_never_holds_back_readers(void **state)
{
	struct world *w = *state;
	assert_int_equal(load(w, NULL, 0x11), 0);
	gf_lock *a;
	struct gf_lock_grant ga;
	assert_int_equal(gf_lock_new(&a, w->lock_uri, "a"), 0);
	assert_int_equal(gf_lock_acquire(a, 2000, &ga), 0);

	/* The primary reads; a stray writer arrives with a long timeout. */
	gf_gms *primary, *standby;
	assert_int_equal(gf_gms_connect(&primary, w->gms.uri, w->mem, GF_GMS_RO, 2000, NULL), 0);
	struct stray s = { .w = w };
	stray_writer(&s);
	assert_int_equal(s.rc, GF_ERR_PERMISSION);
	assert_non_null(strstr(gf_error_detail(), "only the lock's current holder"));
	assert_int_equal(gf_gms_connect(&standby, w->gms.uri, w->mem, GF_GMS_RO, 2000, NULL), 0);
	gf_gms_free(standby);
	gf_gms_free(primary);

	/* The holder reloads; a stray writer queues meanwhile (nothing committed to drop yet). */
	gf_gms *writer;
	struct gf_lock_proof pa = proof_of(&ga);
	const struct gf_gms_connect_opts o = { .proof = &pa };
	assert_int_equal(gf_gms_connect(&writer, w->gms.uri, w->mem, GF_GMS_RW, 2000, &o), 0);
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, stray_writer, &s), 0);
	while (!json_has(w->gms.uri, "\"waiters\":1"))
		usleep(1000);
	uint64_t id;
	assert_int_equal(gf_gms_allocate(writer, 4096, "weights", &id), 0);
	assert_int_equal(gf_gms_put_meta(writer, "w", id, 0, "x", 1), 0);
	assert_int_equal(gf_gms_commit(writer, NULL), 0);
	/* The commit made it a drop: refused then, and readers go in beside the writer. */
	pthread_join(th, NULL);
	assert_int_equal(s.rc, GF_ERR_PERMISSION);
	assert_int_equal(gf_gms_connect(&standby, w->gms.uri, w->mem, GF_GMS_RO, 2000, NULL), 0);
	gf_gms_free(standby);
	gf_gms_free(writer);
	assert_true(json_has(w->gms.uri, "\"fence_refusals\":2"));
	gf_lock_free(a);
}

static void test_lock_server_gone(void **state)
{
	struct world *w = *state;
	assert_int_equal(load(w, NULL, 0x11), 0);
	lt_halt(&w->lock); /* the GMS goes on without it */
	/* Unknown grant: refused, and the weights stay. */
	struct gf_lock_grant g = { .epoch = 7 };
	struct gf_lock_proof p = proof_of(&g);
	assert_int_equal(load(w, &p, 0x22), GF_ERR_UNREACHABLE);
	assert_int_equal(first_byte(w), 0x11);
}

/* The fence holds at commit: a writer revoked mid-load cannot publish its layout. */
static void test_revoked_writer_cannot_commit(void **state)
{
	struct world *w = *state;
	assert_int_equal(load(w, NULL, 0x11), 0);
	gf_lock *a;
	struct gf_lock_grant ga;
	assert_int_equal(gf_lock_new(&a, w->lock_uri, "a"), 0);
	assert_int_equal(gf_lock_acquire(a, 2000, &ga), 0);
	struct gf_lock_proof pa = proof_of(&ga);
	gf_gms *g;
	const struct gf_gms_connect_opts o = { .proof = &pa };
	assert_int_equal(gf_gms_connect(&g, w->gms.uri, w->mem, GF_GMS_RW, 3000, &o), 0);
	uint64_t id;
	assert_int_equal(gf_gms_allocate(g, 4096, "weights", &id), 0);
	struct gf_gms_alloc_info ai;
	assert_int_equal(gf_gms_alloc_at(g, 0, &ai), 0);
	memset((void *)(uintptr_t)ai.addr, 0x22, 4096);
	assert_int_equal(gf_gms_put_meta(g, "w", id, 0, "x", 1), 0);
	assert_int_equal(gf_lock_revoke(w->lock_uri, NULL, 0, ga.epoch, 2000), 0);
	assert_int_equal(gf_gms_commit(g, NULL), GF_ERR_PERMISSION);
	assert_non_null(strstr(gf_error_detail(), "not the lock's current one"));
	gf_gms_free(g);
	assert_true(json_has(w->gms.uri, "event=commit_refused"));
	assert_true(json_has(w->gms.uri, "\"allocation_count\":0"));
	/* The next holder loads and commits. */
	gf_lock *b;
	struct gf_lock_grant gb;
	assert_int_equal(gf_lock_new(&b, w->lock_uri, "b"), 0);
	assert_int_equal(gf_lock_acquire(b, 2000, &gb), 0);
	struct gf_lock_proof pb = proof_of(&gb);
	assert_int_equal(load(w, &pb, 0x33), 0);
	assert_int_equal(first_byte(w), 0x33);
	gf_lock_free(a);
	gf_lock_free(b);
}

struct writer {
	struct world *w;
	struct gf_lock_proof proof;
	atomic_int done;
	int rc;
};

static void *write_fenced(void *arg)
{
	struct writer *wr = arg;
	wr->rc = load(wr->w, &wr->proof, 0x22);
	atomic_store(&wr->done, 1);
	return NULL;
}

/* The fence asks a lock server that never answers: meanwhile the GMS serves
 * its other clients (the writer waits in the queue, seen in the status). */
static void test_slow_lock_server(void **state)
{
	struct world *w = *state;
	assert_int_equal(load(w, NULL, 0x11), 0);
	struct gf_lock_grant g = { .epoch = 3 };
	struct writer wr = { .w = w, .proof = proof_of(&g) };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, write_fenced, &wr), 0);
	/* Another client's status answer shows the writer waiting on the fence, while its request is still pending. */
	bool seen = false;
	for (int i = 0; i < 400 && !seen; i++) {
		seen = json_has(w->gms.uri, "\"waiters\":1");
		if (!seen)
			usleep(5000);
	}
	assert_true(seen);
	assert_int_equal(atomic_load(&wr.done), 0);
	/* The lock server goes away: the fence refuses, and the weights stay. */
	close(w->mute_fd);
	w->mute_fd = -1;
	pthread_join(th, NULL);
	assert_int_equal(wr.rc, GF_ERR_UNREACHABLE);
	assert_int_equal(first_byte(w), 0x11);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_fence, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stray_writer_never_holds_back_readers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lock_server_gone, setup, teardown),
		cmocka_unit_test_setup_teardown(test_slow_lock_server, setup_mute, teardown),
		cmocka_unit_test_setup_teardown(test_revoked_writer_cannot_commit, setup, teardown),
	};
	return tu_run_group_tests(tests, NULL, NULL);
}
