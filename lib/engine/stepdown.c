/* SPDX-License-Identifier: Apache-2.0 */
/* Planned switchover: the lock server asks the holder to step down; the application drains and calls back. */
#include "common.h"
#include "engine_int.h"
#include "gpufailover/lock.h"

int gf_engine_set_step_down_fn(gf_engine *e, gf_engine_step_down_fn fn, void *userdata)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "engine: NULL engine");
	atomic_store(&e->step_down_ud, userdata);
	atomic_store(&e->step_down, fn);
	return 0;
}

void gf_engine_lock_step_down_hook(gf_lock *lock, uint64_t epoch, void *userdata)
{
	(void)lock;
	gf_engine *e = userdata;
	gf_engine_step_down_fn fn = atomic_load(&e->step_down);
	gf_log(GF_LOG_INFO, "engine", "event=step_down_requested id=%s epoch=%llu state=%s hook=%d", e->id,
	       (unsigned long long)epoch, gf_engine_state_name(gf_engine_state(e)), fn != NULL);
	if (fn)
		fn(e, atomic_load(&e->step_down_ud));
}

int gf_engine_step_down(gf_engine *e)
{
	if (!e)
		return gf_err(GF_ERR_INVALID_ARG, "engine: NULL engine");
	gf_lock *l = atomic_load(&e->lock);
	if (!l || !gf_lock_is_held(l))
		return gf_err(GF_ERR_STATE, "engine: step down: the lock is not held");
	/* Dead first: the release must not look like a loss to anyone watching. */
	gf_engine_die(e, "switchover", "stepped down for a planned switchover");
	int rc = gf_lock_release(l);
	gf_log(GF_LOG_INFO, "engine", "event=stepped_down id=%s epoch=%llu", e->id,
	       (unsigned long long)gf_lock_epoch(l));
	return rc;
}
