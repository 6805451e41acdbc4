/* SPDX-License-Identifier: Apache-2.0 */
#include "pool.h"

static bool is_victim(const size_t *victims, size_t nv, size_t i)
{
	for (size_t k = 0; k < nv; k++)
		if (victims[k] == i)
			return true;
	return false;
}

/* Whether @a was Active less recently than @b (the eviction order). */
static bool older(const struct gf_pool_member *a, const struct gf_pool_member *b)
{
	if (a->last_active_us != b->last_active_us)
		return a->last_active_us < b->last_active_us;
	return a->since_us < b->since_us;
}

size_t gf_pool_choose_evictions(const struct gf_pool_member *m, size_t n, size_t newcomer,
				const struct gf_pool_policy *p, int64_t now_us, size_t *victims, size_t cap,
				size_t *short_by)
{
	size_t nv = 0, worst = 0;
	if (short_by)
		*short_by = 0;
	if (newcomer >= n || !m[newcomer].decl || p->max_standby_per_gpu == 0)
		return 0;
	const struct gf_pool_decl *nd = m[newcomer].decl;
	for (size_t g = 0; g < nd->ngpus; g++) {
		const char *uuid = nd->gpus[g];
		size_t count = 0;
		for (size_t i = 0; i < n; i++)
			if (!m[i].holder && !is_victim(victims, nv, i) && gf_pool_on_gpu(m[i].decl, uuid))
				count++;
		while (count > p->max_standby_per_gpu) {
			size_t best = n;
			for (size_t i = 0; i < n; i++) {
				const struct gf_pool_member *c = &m[i];
				if (c->holder || !gf_pool_on_gpu(c->decl, uuid) || c->decl->pinned ||
				    is_victim(victims, nv, i) || now_us - c->since_us < p->min_standby_age_us)
					continue;
				if (best == n || older(c, &m[best]))
					best = i;
			}
			if (best == n || nv == cap)
				break;
			victims[nv++] = best;
			count--;
		}
		if (count > p->max_standby_per_gpu && count - p->max_standby_per_gpu > worst)
			worst = count - p->max_standby_per_gpu;
	}
	if (short_by)
		*short_by = worst;
	return nv;
}
