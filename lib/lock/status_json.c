/* SPDX-License-Identifier: Apache-2.0 */
/* The lock's status as JSON: shared by the client (gf_lock_status_json) and the server (gf_lockd_status_json). */
#include <stdint.h>

#include <jansson.h>

#include "lockint.h"

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
		json_array_append_new(w, o);
	}
	json_object_set_new(root, "waiters", w);
	json_object_set_new(root, "waiter_count", json_integer(s->waiter_count));
	json_object_set_new(root, "reconnect_window", json_boolean(s->reconnect_window));
	json_object_set_new(root, "reconnect_window_left_ms", json_integer(s->reconnect_window_left_ms));
	json_object_set_new(root, "previous_holder",
			    s->previous_holder[0] ? json_string(s->previous_holder) : json_null());
	json_object_set_new(root, "exit_wait", json_boolean(s->exit_wait));
	json_object_set_new(root, "uptime_ms", json_integer(s->uptime_ms));
	json_object_set_new(root, "connections", json_integer(s->connections));
	json_object_set_new(root, "fd_limit", json_integer(s->fd_limit > INT64_MAX ? -1 : (json_int_t)s->fd_limit));
	json_object_set_new(root, "refused_no_pidfd", json_integer((json_int_t)s->refused_no_pidfd));
	json_object_set_new(root, "accept_paused", json_integer((json_int_t)s->accept_paused));
	json_object_set_new(root, "refused_auth_rate", json_integer((json_int_t)s->refused_auth_rate));
	json_t *ls = json_array();
	for (pb_size_t i = 0; ls && i < s->listeners_count; i++)
		json_array_append_new(ls, json_string(s->listeners[i]));
	json_object_set_new(root, "listeners", ls ? ls : json_null());
	json_object_set_new(root, "listeners_pending", json_integer(s->listeners_pending));
	json_object_set_new(root, "step_down_requested", json_boolean(s->step_down_requested));
	char *text = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	if (!text)
		return gf_err(GF_ERR_NOMEM, "status: out of memory");
	*json = text;
	return 0;
}
