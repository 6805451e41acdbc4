/* SPDX-License-Identifier: Apache-2.0 */
/* The lock's status as JSON: shared by the client (gf_lock_status_json) and the server (gf_lockd_status_json). */
#include <stdint.h>
#include <string.h>

#include <jansson.h>

#include "lockint.h"

/* An engine's pool declaration into @o. */
static void pool_fields(json_t *o, const gf_LockWaiter *w)
{
	json_t *g = json_array();
	for (pb_size_t i = 0; g && i < w->gpus_count; i++)
		json_array_append_new(g, json_string(w->gpus[i]));
	json_object_set_new(o, "gpus", g ? g : json_null());
	json_object_set_new(o, "wake_bytes", json_integer(w->wake_bytes > INT64_MAX ? -1 : (json_int_t)w->wake_bytes));
	json_object_set_new(o, "asleep_bytes",
			    json_integer(w->asleep_bytes > INT64_MAX ? -1 : (json_int_t)w->asleep_bytes));
	json_object_set_new(o, "pinned", json_boolean(w->pinned));
	json_object_set_new(o, "model", w->model[0] ? json_string(w->model) : json_null());
	json_object_set_new(o, "last_active_us", json_integer(w->last_active_us));
	json_object_set_new(o, "pids", json_integer(w->pids));
}

/* The "pool" object: budget, counters and per GPU totals with the listed standbys in LRU order. */
static json_t *pool_json(const gf_LockStatus *s)
{
	json_t *p = json_object(), *gpus = json_array();
	if (!p || !gpus) {
		json_decref(p);
		json_decref(gpus);
		return json_null();
	}
	json_object_set_new(p, "max_standby_per_gpu", json_integer(s->max_standby_per_gpu));
	json_object_set_new(p, "min_standby_age_ms", json_integer(s->min_standby_age_ms));
	json_object_set_new(p, "evicted", json_integer((json_int_t)s->evicted));
	json_object_set_new(p, "over_budget", json_integer((json_int_t)s->over_budget));
	for (pb_size_t g = 0; g < s->gpus_count; g++) {
		const gf_LockGpu *u = &s->gpus[g];
		json_t *o = json_object(), *lru = json_array();
		/* Selection by the least recently Active first (ties: FIFO order), over the listed waiters. */
		bool taken[GF_ARRAY_SIZE(s->waiters)] = { false };
		for (;;) {
			int best = -1;
			for (pb_size_t i = 0; i < s->waiters_count; i++) {
				const gf_LockWaiter *w = &s->waiters[i];
				bool on = false;
				for (pb_size_t k = 0; k < w->gpus_count && !on; k++)
					on = !strcmp(w->gpus[k], u->uuid);
				if (!on || taken[i])
					continue;
				if (best < 0 || w->last_active_us < s->waiters[best].last_active_us)
					best = (int)i;
			}
			if (best < 0)
				break;
			taken[best] = true;
			json_array_append_new(lru, json_string(s->waiters[best].engine_id));
		}
		json_object_set_new(o, "uuid", json_string(u->uuid));
		json_object_set_new(o, "standbys", json_integer(u->standbys));
		json_object_set_new(o, "asleep_bytes", json_integer(u->asleep_bytes > INT64_MAX ? -1 : (json_int_t)u->asleep_bytes));
		json_object_set_new(o, "wake_bytes_max",
				    json_integer(u->wake_bytes_max > INT64_MAX ? -1 : (json_int_t)u->wake_bytes_max));
		json_object_set_new(o, "active", json_boolean(u->active));
		json_object_set_new(o, "lru", lru);
		json_array_append_new(gpus, o);
	}
	json_object_set_new(p, "gpus", gpus);
	return p;
}

int gf_lock_status_to_json(const gf_LockStatus *s, char **json)
{
	json_t *root = json_object(), *w = json_array();
	if (!root || !w) {
		json_decref(root);
		json_decref(w);
		return gf_err(GF_ERR_NOMEM, "status: out of memory");
	}
	json_object_set_new(root, "holder", s->holder[0] ? json_string(s->holder) : json_null());
	json_object_set_new(root, "epoch", json_integer((json_int_t)s->epoch));
	json_object_set_new(root, "granted_at_us", json_integer(s->granted_at_us));
	json_object_set_new(root, "holder_pid", json_integer(s->holder_pid));
	for (pb_size_t i = 0; i < s->waiters_count; i++) {
		json_t *o = json_object();
		json_object_set_new(o, "id", json_string(s->waiters[i].engine_id));
		json_object_set_new(o, "since_us", json_integer(s->waiters[i].since_us));
		json_object_set_new(o, "pid", json_integer(s->waiters[i].pid));
		pool_fields(o, &s->waiters[i]);
		json_array_append_new(w, o);
	}
	json_object_set_new(root, "waiters", w);
	json_object_set_new(root, "waiter_count", json_integer(s->waiter_count));
	json_object_set_new(root, "reconnect_window", json_boolean(s->reconnect_window));
	json_object_set_new(root, "reconnect_window_left_ms", json_integer(s->reconnect_window_left_ms));
	json_object_set_new(root, "previous_holder",
			    s->previous_holder[0] ? json_string(s->previous_holder) : json_null());
	json_object_set_new(root, "exit_wait", json_boolean(s->exit_wait));
	json_object_set_new(root, "exit_wait_processes", json_integer(s->exit_wait_processes));
	json_t *xp = json_array();
	for (pb_size_t i = 0; xp && i < s->exit_wait_pids_count; i++)
		json_array_append_new(xp, json_integer(s->exit_wait_pids[i]));
	json_object_set_new(root, "exit_wait_pids", xp ? xp : json_null());
	json_object_set_new(root, "holder_pids", json_integer(s->has_holder_info ? s->holder_info.pids : 0));
	json_object_set_new(root, "state_write_failing", json_boolean(s->state_write_failing));
	json_object_set_new(root, "state_write_failures", json_integer((json_int_t)s->state_write_failures));
	json_object_set_new(root, "uptime_ms", json_integer(s->uptime_ms));
	json_object_set_new(root, "connections", json_integer(s->connections));
	json_object_set_new(root, "fd_limit", json_integer(s->fd_limit > INT64_MAX ? -1 : (json_int_t)s->fd_limit));
	json_object_set_new(root, "refused_no_pidfd", json_integer((json_int_t)s->refused_no_pidfd));
	json_object_set_new(root, "accept_paused", json_integer((json_int_t)s->accept_paused));
	json_object_set_new(root, "refused_auth_rate", json_integer((json_int_t)s->refused_auth_rate));
	if (s->has_holder_info) {
		json_t *h = json_object();
		json_object_set_new(h, "id", json_string(s->holder_info.engine_id));
		json_object_set_new(h, "pid", json_integer(s->holder_info.pid));
		json_object_set_new(h, "since_us", json_integer(s->holder_info.since_us));
		pool_fields(h, &s->holder_info);
		json_object_set_new(root, "holder_info", h);
	} else {
		json_object_set_new(root, "holder_info", json_null());
	}
	json_object_set_new(root, "pool", pool_json(s));
	json_t *ls = json_array();
	for (pb_size_t i = 0; ls && i < s->listeners_count; i++)
		json_array_append_new(ls, json_string(s->listeners[i]));
	json_object_set_new(root, "listeners", ls ? ls : json_null());
	json_object_set_new(root, "listeners_pending", json_integer(s->listeners_pending));
	json_object_set_new(root, "step_down_requested", json_boolean(s->step_down_requested));
	const char *serving = gf_lock_serving_name(s);
	json_object_set_new(root, "holder_serving", serving ? json_string(serving) : json_null());
	char *text = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	if (!text)
		return gf_err(GF_ERR_NOMEM, "status: out of memory");
	*json = text;
	return 0;
}
