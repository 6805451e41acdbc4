/* SPDX-License-Identifier: Apache-2.0 */
/* XXH3-64 on a helper thread (hasher.h). */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include <xxhash.h>

#include "common.h"
#include "hasher.h"

struct gms_hasher {
	XXH3_state_t *st;
	bool threaded;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	const void *buf; /* the chunk to hash; NULL when idle */
	size_t n;
	bool quit;
};

static void *hasher_main(void *arg)
{
	struct gms_hasher *h = arg;
	pthread_mutex_lock(&h->lock);
	for (;;) {
		while (!h->buf && !h->quit)
			pthread_cond_wait(&h->cond, &h->lock);
		if (!h->buf)
			break;
		const void *buf = h->buf;
		size_t n = h->n;
		pthread_mutex_unlock(&h->lock);
		XXH3_64bits_update(h->st, buf, n);
		pthread_mutex_lock(&h->lock);
		h->buf = NULL;
		pthread_cond_broadcast(&h->cond);
	}
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

int gms_hasher_new(struct gms_hasher **out)
{
	struct gms_hasher *h = calloc(1, sizeof(*h));
	if (!h || !(h->st = XXH3_createState())) {
		free(h);
		return gf_err(GF_ERR_NOMEM, "hasher: out of memory");
	}
	XXH3_64bits_reset(h->st);
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->cond, NULL);
	h->threaded = pthread_create(&h->thread, NULL, hasher_main, h) == 0;
	if (!h->threaded)
		gf_log(GF_LOG_DEBUG, "gms", "msg=\"hashing inline: no helper thread\"");
	*out = h;
	return 0;
}

void gms_hasher_wait(struct gms_hasher *h)
{
	if (!h->threaded)
		return;
	pthread_mutex_lock(&h->lock);
	while (h->buf)
		pthread_cond_wait(&h->cond, &h->lock);
	pthread_mutex_unlock(&h->lock);
}

void gms_hasher_free(struct gms_hasher *h)
{
	if (!h)
		return;
	if (h->threaded) {
		gms_hasher_wait(h);
		pthread_mutex_lock(&h->lock);
		h->quit = true;
		pthread_cond_broadcast(&h->cond);
		pthread_mutex_unlock(&h->lock);
		pthread_join(h->thread, NULL);
	}
	pthread_cond_destroy(&h->cond);
	pthread_mutex_destroy(&h->lock);
	XXH3_freeState(h->st);
	free(h);
}

void gms_hasher_reset(struct gms_hasher *h)
{
	gms_hasher_wait(h);
	XXH3_64bits_reset(h->st);
}

void gms_hasher_submit(struct gms_hasher *h, const void *buf, size_t n)
{
	if (!n)
		return;
	if (!h->threaded) {
		XXH3_64bits_update(h->st, buf, n);
		return;
	}
	pthread_mutex_lock(&h->lock);
	while (h->buf)
		pthread_cond_wait(&h->cond, &h->lock);
	h->buf = buf;
	h->n = n;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
}

uint64_t gms_hasher_digest(struct gms_hasher *h)
{
	gms_hasher_wait(h);
	return XXH3_64bits_digest(h->st);
}
