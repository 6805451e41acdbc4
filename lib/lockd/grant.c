/* SPDX-License-Identifier: Apache-2.0 */
#include <stdint.h>

#include "grant.h"

bool gf_lock_may_grant(const struct gf_lock_gate *g)
{
	return g->has_waiter && !g->has_holder && !g->exit_wait && !g->window && !g->store_failed;
}

enum gf_lock_acquire_decision gf_lock_decide_acquire(const struct gf_lock_acquire_in *in)
{
	if (in->is_holder)
		return GF_LOCK_REFUSE_HOLDER;
	if (in->is_waiter)
		return GF_LOCK_REFUSE_WAITER;
	if (!in->id_valid)
		return GF_LOCK_REFUSE_ID;
	if (!in->has_token)
		return GF_LOCK_QUEUE;
	/* A reclaim is never queued: it either proves the grant or loses it. */
	if (in->other_holder && in->token_matches)
		return GF_LOCK_TAKEOVER;
	if (in->window && in->token_matches)
		return GF_LOCK_RECLAIM;
	return in->window ? GF_LOCK_REFUSE_MISMATCH : GF_LOCK_REFUSE_NO_WINDOW;
}

bool gf_lock_next_epoch(uint64_t last, uint64_t *next)
{
	if (last >= (uint64_t)INT64_MAX)
		return false;
	*next = last + 1;
	return true;
}
