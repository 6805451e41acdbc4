/* SPDX-License-Identifier: Apache-2.0 */
/* XXH3-64 on a helper thread (hasher.h). */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include <xxhash.h>

#include "common.h"
#include "gf-config.h"
#include "hasher.h"
#include "xfer.h"
#if GF_HAVE_XXH3_AVX2
#include "xxh3_fast.h"
#endif

/* The library's XXH3, or the AVX2 build of the same where the CPU has it. */
struct xxh3_ops {
	void *(*create)(void);
	void (*destroy)(void *st);
	void (*reset)(void *st);
	void (*update)(void *st, const void *buf, size_t n);
	uint64_t (*digest)(void *st);
};

static void *lib_create(void)
{
	XXH3_state_t *st = XXH3_createState();
	if (st)
		XXH3_64bits_reset(st);
	return st;
}

static void lib_destroy(void *st)
{
	XXH3_freeState(st);
}

static void lib_reset(void *st)
{
	XXH3_64bits_reset(st);
}

static void lib_update(void *st, const void *buf, size_t n)
{
	XXH3_64bits_update(st, buf, n);
}

static uint64_t lib_digest(void *st)
{
	return XXH3_64bits_digest(st);
}

static const struct xxh3_ops lib_ops = {lib_create, lib_destroy, lib_reset, lib_update, lib_digest};
#if GF_HAVE_XXH3_AVX2
static const struct xxh3_ops avx2_ops = {tiers_xxh3_avx2_new, tiers_xxh3_avx2_free, tiers_xxh3_avx2_reset,
					 tiers_xxh3_avx2_update, tiers_xxh3_avx2_digest};
#endif

static const struct xxh3_ops *pick_ops(void)
{
#if GF_HAVE_XXH3_AVX2
	if (__builtin_cpu_supports("avx2"))
		return &avx2_ops;
#endif
	return &lib_ops;
}

struct chunk {
	const void *buf; /* NULL: read @n bytes of @fd from @off into @dst first */
	size_t n;
	bool fault_in;
	uint64_t *digest_out; /* the chunk ends a stream: its digest goes here */
	int fd;
	uint64_t off;
	void *dst;
};

struct tiers_hasher {
	const struct xxh3_ops *ops;
	void *st;
	bool threaded;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* chunks submitted and not yet hashed, oldest at head (the one being hashed stays until done) */
	struct chunk q[TIERS_HASHER_QUEUE];
	unsigned head, pending;
	bool quit;
	int read_error; /* the first failed read of a file chunk (errno), 0: none */
	uint64_t queued, done; /* chunks handed over / hashed since the hasher was made */
};

/* A file chunk read whole into @dst, which the caller then writes out: the
 * bytes hashed are the bytes it writes. Hashed in one pass right after the
 * read, while they are in this core's cache. */
static int read_into(struct tiers_hasher *h, int fd, uint64_t off, size_t n, uint8_t *dst)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = pread(fd, dst + got, n - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? errno : ENODATA;
		got += (size_t)r;
	}
	h->ops->update(h->st, dst, n);
	return 0;
}

/* One chunk, on whichever thread runs it: 0, or the errno of a failed read.
 * Only that thread writes h->read_error (under the lock when threaded). */
static int hash_chunk(struct tiers_hasher *h, const struct chunk *c)
{
	int err = 0;
	if (!c->buf) {
		/* After a failed read the stream's digest is meaningless: read no more. */
		if (!h->read_error)
			err = read_into(h, c->fd, c->off, c->n, c->dst);
	} else {
		if (c->fault_in)
			gf_mem_populate((uint64_t)(uintptr_t)c->buf, c->n, false);
		h->ops->update(h->st, c->buf, c->n);
	}
	if (c->digest_out) {
		*c->digest_out = h->ops->digest(h->st);
		h->ops->reset(h->st);
	}
	return err;
}

static void *hasher_main(void *arg)
{
	struct tiers_hasher *h = arg;
	pthread_mutex_lock(&h->lock);
	for (;;) {
		while (!h->pending && !h->quit)
			pthread_cond_wait(&h->cond, &h->lock);
		if (!h->pending)
			break;
		struct chunk c = h->q[h->head];
		pthread_mutex_unlock(&h->lock);
		int err = hash_chunk(h, &c);
		pthread_mutex_lock(&h->lock);
		if (err && !h->read_error)
			h->read_error = err;
		h->head = (h->head + 1) % TIERS_HASHER_QUEUE;
		h->pending--;
		h->done++;
		pthread_cond_broadcast(&h->cond);
	}
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

int tiers_hasher_new(struct tiers_hasher **out)
{
	struct tiers_hasher *h = calloc(1, sizeof(*h));
	if (h)
		h->ops = pick_ops();
	if (!h || !(h->st = h->ops->create())) {
		free(h);
		return gf_err(GF_ERR_NOMEM, "hasher: out of memory");
	}
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->cond, NULL);
	h->threaded = pthread_create(&h->thread, NULL, hasher_main, h) == 0;
	if (!h->threaded)
		gf_log(GF_LOG_DEBUG, "gms", "msg=\"hashing inline: no helper thread\"");
	*out = h;
	return 0;
}

void tiers_hasher_wait(struct tiers_hasher *h)
{
	if (!h->threaded)
		return;
	pthread_mutex_lock(&h->lock);
	while (h->pending)
		pthread_cond_wait(&h->cond, &h->lock);
	pthread_mutex_unlock(&h->lock);
}

void tiers_hasher_free(struct tiers_hasher *h)
{
	if (!h)
		return;
	if (h->threaded) {
		tiers_hasher_wait(h);
		pthread_mutex_lock(&h->lock);
		h->quit = true;
		pthread_cond_broadcast(&h->cond);
		pthread_mutex_unlock(&h->lock);
		pthread_join(h->thread, NULL);
	}
	pthread_cond_destroy(&h->cond);
	pthread_mutex_destroy(&h->lock);
	h->ops->destroy(h->st);
	free(h);
}

void tiers_hasher_reset(struct tiers_hasher *h)
{
	tiers_hasher_wait(h);
	h->ops->reset(h->st);
}

/* Queue a chunk once fewer than @ahead chunks are still unhashed. */
static void enqueue(struct tiers_hasher *h, unsigned ahead, struct chunk c)
{
	if (!h->threaded) {
		int err = hash_chunk(h, &c);
		if (err && !h->read_error)
			h->read_error = err;
		h->queued++;
		h->done++;
		return;
	}
	pthread_mutex_lock(&h->lock);
	h->queued++;
	while (h->pending >= ahead)
		pthread_cond_wait(&h->cond, &h->lock);
	h->q[(h->head + h->pending) % TIERS_HASHER_QUEUE] = c;
	h->pending++;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
}

void tiers_hasher_submit_ex(struct tiers_hasher *h, const void *buf, size_t n, bool fault_in, uint64_t *digest_out)
{
	enqueue(h, 1, (struct chunk){ buf, n, fault_in && n, digest_out, -1, 0 });
}

void tiers_hasher_queue(struct tiers_hasher *h, const void *buf, size_t n, bool fault_in, uint64_t *digest_out)
{
	enqueue(h, TIERS_HASHER_QUEUE, (struct chunk){ buf, n, fault_in && n, digest_out, -1, 0 });
}

uint64_t tiers_hasher_queue_read(struct tiers_hasher *h, int fd, uint64_t off, size_t n, void *dst, uint64_t *digest_out)
{
	struct chunk c = { NULL, n, false, digest_out, fd, off, dst };
	enqueue(h, TIERS_HASHER_QUEUE, c);
	return h->queued - 1;
}

int tiers_hasher_wait_for(struct tiers_hasher *h, uint64_t ticket)
{
	if (!h->threaded)
		return h->read_error;
	pthread_mutex_lock(&h->lock);
	while (h->done <= ticket)
		pthread_cond_wait(&h->cond, &h->lock);
	int err = h->read_error;
	pthread_mutex_unlock(&h->lock);
	return err;
}

int tiers_hasher_read_error(struct tiers_hasher *h)
{
	tiers_hasher_wait(h);
	return h->read_error;
}

void tiers_hasher_submit(struct tiers_hasher *h, const void *buf, size_t n)
{
	if (n)
		tiers_hasher_submit_ex(h, buf, n, false, NULL);
}

uint64_t tiers_hasher_digest(struct tiers_hasher *h)
{
	tiers_hasher_wait(h);
	return h->ops->digest(h->st);
}
