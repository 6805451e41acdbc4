/* SPDX-License-Identifier: Apache-2.0 */
/* The wake priority: the stepping thread runs under SCHED_FIFO from its wait
 * on the lock until Active, so that the grant's wake-up does not queue behind
 * ordinary work (a dying engine's teardown, a build) for a CPU. */
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "common.h"
#include "engine_int.h"

void gf_engine_boost(gf_engine *e)
{
	if (e->wake_priority <= 0 || e->boosted)
		return;
	/* sched_*() with pid 0 act on the calling thread on Linux. */
	int policy = sched_getscheduler(0);
	struct sched_param old;
	if (policy < 0 || sched_getparam(0, &old) < 0) {
		gf_log(GF_LOG_DEBUG, "engine", "event=wake_priority applied=0 msg=\"%s\"", strerror(errno));
		return;
	}
	/* Reset on fork: a thread started during the wake (or a process the
	 * engine forks) gets the ordinary policy, not this one. */
	struct sched_param p = { .sched_priority = e->wake_priority };
	if (sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &p) < 0) {
		gf_log(GF_LOG_DEBUG, "engine", "event=wake_priority applied=0 priority=%d msg=\"%s\"",
		       e->wake_priority, strerror(errno));
		return;
	}
	e->boost_old_policy = policy & ~SCHED_RESET_ON_FORK;
	e->boost_old_priority = old.sched_priority;
	e->boosted = true;
}

void gf_engine_unboost(gf_engine *e)
{
	if (!e->boosted)
		return;
	struct sched_param p = { .sched_priority = e->boost_old_priority };
	/* Lowering one's own priority is always permitted. */
	if (sched_setscheduler(0, e->boost_old_policy, &p) < 0)
		gf_log(GF_LOG_WARN, "engine", "event=wake_priority_restore msg=\"%s\"", strerror(errno));
	e->boosted = false;
}
