/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The supervisor's configuration: the operator's JSON file (or text) checked
 * key by key into the supervisor's engines, periods, probe settings and
 * lock; every error names the key that is wrong. The only JSON the
 * supervisor parses.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common.h"
#include "gpufailover/supervise.h"
#include "policy.h"
#include "supervisor_int.h"

/* ---- configuration ---------------------------------------------------- */

static int cfg_err(const char *where, const char *fmt, const char *arg)
{
	return gf_err(GF_ERR_INVALID_ARG, "%s: %s%s", where, fmt, arg ? arg : "");
}

/* A duration is a string the project's parser takes ("90s", "5m") or a
 * non-negative integer of milliseconds. */
static int cfg_duration(json_t *v, const char *where, int64_t *out)
{
	uint64_t ms;
	if (json_is_integer(v)) {
		if (json_integer_value(v) < 0)
			return cfg_err(where, "must not be negative", NULL);
		*out = json_integer_value(v);
		return 0;
	}
	if (!json_is_string(v))
		return cfg_err(where, "expected a duration (\"90s\") or milliseconds", NULL);
	const char *s = json_string_value(v);
	if (s[0] == '-')
		return cfg_err(where, "must not be negative", NULL);
	if (gf_parse_duration_ms(s, &ms) < 0 || ms > INT64_MAX / 1000)
		return cfg_err(where, "not a duration: ", s);
	*out = (int64_t)ms;
	return 0;
}

static int cfg_known_keys(json_t *obj, const char *where, const char *const *keys)
{
	const char *k;
	json_t *v;
	json_object_foreach(obj, k, v) {
		int ok = 0;
		for (const char *const *p = keys; *p; p++)
			ok |= strcmp(*p, k) == 0;
		if (!ok)
			return gf_err(GF_ERR_INVALID_ARG, "%s%s%s: unknown key", where, *where ? "." : "", k);
	}
	return 0;
}

static int cfg_periods(json_t *obj, const char *where, struct gf_sv_periods *p)
{
	/* forceful_grace: revoke_grace's deprecated name, read below. */
	static const char *const keys[] = { "admission",      "warmup",       "failure_grace",
					    "retry_pause",    "retry_limit",  "term_grace",
					    "revoke_grace",   "deletion_on_failure_grace",
					    "forceful_grace", "stable",       "maximum",
					    NULL };
	struct {
		const char *key;
		int64_t *v;
	} f[] = {
		{ "admission", &p->admission_ms },         { "warmup", &p->warmup_ms },
		{ "failure_grace", &p->failure_grace_ms }, { "retry_pause", &p->retry_pause_ms },
		{ "term_grace", &p->term_grace_ms },       { "revoke_grace", &p->revoke_grace_ms },
		{ "deletion_on_failure_grace", &p->deletion_on_failure_grace_ms },
		{ "stable", &p->stable_ms },               { "maximum", &p->maximum_ms },
	};
	char at[160];
	if (!json_is_object(obj))
		return cfg_err(where, "expected an object", NULL);
	int r = cfg_known_keys(obj, where, keys);
	if (r < 0)
		return r;
	for (size_t i = 0; i < GF_ARRAY_SIZE(f); i++) {
		json_t *v = json_object_get(obj, f[i].key);
		snprintf(at, sizeof(at), "%s.%s", where, f[i].key);
		if (v && (r = cfg_duration(v, at, f[i].v)) < 0)
			return r;
	}
	/* The old name of revoke_grace: it read as AppWrapper's
	 * ForcefulDeletionGracePeriod, which is term_grace here. Still
	 * accepted, with the same meaning as before. */
	json_t *old = json_object_get(obj, "forceful_grace");
	if (old) {
		if (json_object_get(obj, "revoke_grace"))
			return gf_err(GF_ERR_INVALID_ARG, "%s.forceful_grace: give only revoke_grace (its new name)", where);
		snprintf(at, sizeof(at), "%s.forceful_grace", where);
		if ((r = cfg_duration(old, at, &p->revoke_grace_ms)) < 0)
			return r;
		gf_log(GF_LOG_WARN, "supervise",
		       "event=option_deprecated option=%s.forceful_grace msg=\"%s.forceful_grace is deprecated: it is revoke_grace "
		       "(SIGKILL -> lock revocation); AppWrapper's ForcefulDeletionGracePeriod is term_grace\"",
		       where, where);
	}
	json_t *lim = json_object_get(obj, "retry_limit");
	if (lim) {
		if (!json_is_integer(lim) || json_integer_value(lim) < 0)
			return gf_err(GF_ERR_INVALID_ARG, "%s.retry_limit: expected a non-negative integer", where);
		p->retry_limit = json_integer_value(lim);
	}
	return 0;
}

static int cfg_strv(json_t *arr, const char *where, char ***out, int need_one)
{
	if (!json_is_array(arr) || (need_one && json_array_size(arr) == 0))
		return cfg_err(where, need_one ? "expected a non-empty array of strings" : "expected an array of strings",
			       NULL);
	size_t n = json_array_size(arr);
	char **v = calloc(n + 1, sizeof(*v));
	if (!v)
		return gf_err(GF_ERR_NOMEM, "config");
	for (size_t i = 0; i < n; i++) {
		json_t *s = json_array_get(arr, i);
		if (!json_is_string(s) || !(v[i] = strdup(json_string_value(s)))) {
			gf_sv_free_strv(v);
			return json_is_string(s) ? gf_err(GF_ERR_NOMEM, "config")
						 : cfg_err(where, "expected an array of strings", NULL);
		}
	}
	*out = v;
	return 0;
}

/* The child's environment: ours plus the config's entries (which win). */
static int cfg_env(json_t *obj, const char *where, char ***out)
{
	if (!json_is_object(obj))
		return cfg_err(where, "expected an object of strings", NULL);
	size_t base = 0;
	while (environ[base])
		base++;
	char **v = calloc(base + json_object_size(obj) + 1, sizeof(*v));
	if (!v)
		return gf_err(GF_ERR_NOMEM, "config");
	size_t n = 0;
	const char *k;
	json_t *val;
	for (size_t i = 0; i < base; i++) {
		const char *eq = strchr(environ[i], '=');
		size_t kl = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
		int overridden = 0;
		json_object_foreach(obj, k, val) {
			overridden |= strlen(k) == kl && strncmp(k, environ[i], kl) == 0;
		}
		if (!overridden && !(v[n++] = strdup(environ[i])))
			goto nomem;
	}
	json_object_foreach(obj, k, val) {
		if (!json_is_string(val) || !*k || strchr(k, '=')) {
			gf_sv_free_strv(v);
			return gf_err(GF_ERR_INVALID_ARG, "%s.%s: expected a string value and a name without '='", where, k);
		}
		if (asprintf(&v[n++], "%s=%s", k, json_string_value(val)) < 0) {
			v[n - 1] = NULL;
			goto nomem;
		}
	}
	*out = v;
	return 0;
nomem:
	gf_sv_free_strv(v);
	return gf_err(GF_ERR_NOMEM, "config");
}

static int cfg_string(json_t *v, const char *where, char **out)
{
	if (!json_is_string(v) || !*json_string_value(v))
		return cfg_err(where, "expected a non-empty string", NULL);
	if (!(*out = strdup(json_string_value(v))))
		return gf_err(GF_ERR_NOMEM, "config");
	return 0;
}

static int read_secret_file(const char *path, char **out, size_t *len)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return gf_err_errno(GF_ERR_IO, errno, "lock.secret_file %s", path);
	char *buf = malloc(4097);
	size_t n = buf ? fread(buf, 1, 4096, f) : 0;
	fclose(f);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	if (n == 0) {
		free(buf);
		return gf_err(GF_ERR_INVALID_ARG, "lock.secret_file %s: empty", path);
	}
	*out = buf;
	*len = n;
	return 0;
}

static int cfg_engine(gf_supervisor *sv, json_t *obj, size_t idx, const struct gf_sv_periods *defaults,
		      struct sv_engine *e)
{
	static const char *const keys[] = { "name", "argv", "env", "cwd", "probe_url", "lock_id", "periods", NULL };
	char where[64], at[96];
	int r;
	snprintf(where, sizeof(where), "engines[%zu]", idx);
	memset(e, 0, sizeof(*e));
	e->pidfd = e->lingering_fd = -1;
	if (!json_is_object(obj))
		return cfg_err(where, "expected an object", NULL);
	if ((r = cfg_known_keys(obj, where, keys)) < 0)
		return r;
	snprintf(at, sizeof(at), "%s.name", where);
	if ((r = cfg_string(json_object_get(obj, "name"), at, &e->name)) < 0)
		return r;
	/* Names become metric labels and log values: keep them plain. */
	if (strlen(e->name) > 63 || strspn(e->name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") !=
					    strlen(e->name))
		return cfg_err(at, "expected 1..63 characters of A-Z a-z 0-9 _ . -, got ", e->name);
	snprintf(at, sizeof(at), "%s.argv", where);
	if ((r = cfg_strv(json_object_get(obj, "argv"), at, &e->argv, 1)) < 0)
		return r;
	if (json_object_get(obj, "env")) {
		snprintf(at, sizeof(at), "%s.env", where);
		if ((r = cfg_env(json_object_get(obj, "env"), at, &e->envp)) < 0)
			return r;
	}
	if (json_object_get(obj, "cwd")) {
		snprintf(at, sizeof(at), "%s.cwd", where);
		if ((r = cfg_string(json_object_get(obj, "cwd"), at, &e->cwd)) < 0)
			return r;
	}
	snprintf(at, sizeof(at), "%s.probe_url", where);
	if ((r = cfg_string(json_object_get(obj, "probe_url"), at, &e->probe_url)) < 0)
		return r;
	if (strncmp(e->probe_url, "http://", 7) != 0)
		return cfg_err(at, "expected an http:// URL, got ", e->probe_url);
	size_t ul = strlen(e->probe_url);
	while (ul > 7 && e->probe_url[ul - 1] == '/')
		e->probe_url[--ul] = '\0';
	if (json_object_get(obj, "lock_id")) {
		snprintf(at, sizeof(at), "%s.lock_id", where);
		if ((r = cfg_string(json_object_get(obj, "lock_id"), at, &e->lock_id)) < 0)
			return r;
	}
	e->periods = *defaults;
	if (json_object_get(obj, "periods")) {
		snprintf(at, sizeof(at), "%s.periods", where);
		if ((r = cfg_periods(json_object_get(obj, "periods"), at, &e->periods)) < 0)
			return r;
		/* An engine may shorten its periods, never lift the operator's maximum. */
		e->periods.maximum_ms = defaults->maximum_ms;
		char note[256];
		if ((r = gf_sv_periods_validate(&e->periods, note, sizeof(note))) < 0)
			return gf_err(r, "%s.%s", at, gf_error_detail());
		if (note[0])
			gf_log(GF_LOG_WARN, "supervise", "event=periods_clamped engine=%s detail=\"%s\"", e->name, note);
	}
	(void)sv;
	gf_sv_init(&e->pol);
	return 0;
}

static int load(gf_supervisor *sv, json_t *root)
{
	static const char *const keys[] = { "lock", "periods", "terminal_exit_codes", "probe", "engines", NULL };
	int r;
	if (!json_is_object(root))
		return gf_err(GF_ERR_INVALID_ARG, "config: expected a JSON object at the top");
	if ((r = cfg_known_keys(root, "", keys)) < 0)
		return r;

	struct gf_sv_periods defaults;
	gf_sv_periods_default(&defaults);
	if (json_object_get(root, "periods")) {
		if ((r = cfg_periods(json_object_get(root, "periods"), "periods", &defaults)) < 0)
			return r;
	}
	char note[256];
	if ((r = gf_sv_periods_validate(&defaults, note, sizeof(note))) < 0)
		return gf_err(r, "periods.%s", gf_error_detail());
	if (note[0])
		gf_log(GF_LOG_WARN, "supervise", "event=periods_clamped detail=\"%s\"", note);

	json_t *term = json_object_get(root, "terminal_exit_codes");
	if (term) {
		if (!json_is_array(term) || json_array_size(term) > SV_MAX_TERMINAL)
			return gf_err(GF_ERR_INVALID_ARG, "terminal_exit_codes: expected an array of at most %d exit codes",
				      SV_MAX_TERMINAL);
		sv->n_terminal = 0;
		for (size_t i = 0; i < json_array_size(term); i++) {
			json_t *c = json_array_get(term, i);
			if (!json_is_integer(c) || json_integer_value(c) < 1 || json_integer_value(c) > 255)
				return gf_err(GF_ERR_INVALID_ARG, "terminal_exit_codes[%zu]: expected an exit code 1..255", i);
			sv->terminal[sv->n_terminal++] = (int)json_integer_value(c);
		}
	}

	json_t *probe = json_object_get(root, "probe");
	if (probe) {
		static const char *const pkeys[] = { "interval", "timeout", NULL };
		if (!json_is_object(probe))
			return gf_err(GF_ERR_INVALID_ARG, "probe: expected an object");
		if ((r = cfg_known_keys(probe, "probe", pkeys)) < 0)
			return r;
		if (json_object_get(probe, "interval") &&
		    (r = cfg_duration(json_object_get(probe, "interval"), "probe.interval", &sv->probe_interval_ms)) < 0)
			return r;
		if (json_object_get(probe, "timeout") &&
		    (r = cfg_duration(json_object_get(probe, "timeout"), "probe.timeout", &sv->probe_timeout_ms)) < 0)
			return r;
		if (sv->probe_interval_ms < 10 || sv->probe_interval_ms > 3600 * 1000)
			return gf_err(GF_ERR_INVALID_ARG, "probe.interval: must be between 10ms and 1h");
		if (sv->probe_timeout_ms < 10 || sv->probe_timeout_ms > 3600 * 1000)
			return gf_err(GF_ERR_INVALID_ARG, "probe.timeout: must be between 10ms and 1h");
	}

	json_t *lock = json_object_get(root, "lock");
	if (lock) {
		static const char *const lkeys[] = { "uri", "secret_file", NULL };
		if (!json_is_object(lock))
			return gf_err(GF_ERR_INVALID_ARG, "lock: expected an object");
		if ((r = cfg_known_keys(lock, "lock", lkeys)) < 0)
			return r;
		if ((r = cfg_string(json_object_get(lock, "uri"), "lock.uri", &sv->lock_uri)) < 0)
			return r;
		json_t *sf = json_object_get(lock, "secret_file");
		if (sf) {
			if (!json_is_string(sf))
				return gf_err(GF_ERR_INVALID_ARG, "lock.secret_file: expected a path");
			if ((r = read_secret_file(json_string_value(sf), &sv->lock_secret, &sv->lock_secret_len)) < 0)
				return r;
		}
	}

	json_t *engines = json_object_get(root, "engines");
	if (!json_is_array(engines) || json_array_size(engines) == 0 || json_array_size(engines) > SV_MAX_ENGINES)
		return gf_err(GF_ERR_INVALID_ARG, "engines: expected an array of 1..%d engines", SV_MAX_ENGINES);
	sv->eng = calloc(json_array_size(engines), sizeof(*sv->eng));
	if (!sv->eng)
		return gf_err(GF_ERR_NOMEM, "config");
	for (size_t i = 0; i < json_array_size(engines); i++) {
		r = cfg_engine(sv, json_array_get(engines, i), i, &defaults, &sv->eng[i]);
		sv->n = i + 1;
		if (r < 0)
			return r;
		for (size_t j = 0; j < i; j++)
			if (strcmp(sv->eng[j].name, sv->eng[i].name) == 0)
				return gf_err(GF_ERR_INVALID_ARG, "engines[%zu].name: \"%s\" is used twice", i,
					      sv->eng[i].name);
		if (sv->eng[i].lock_id && !sv->lock_uri)
			return gf_err(GF_ERR_INVALID_ARG, "engines[%zu].lock_id: needs lock.uri", i);
	}
	return 0;
}

int gf_supervisor_load_config(gf_supervisor *sv, const char *path, const char *json)
{
	if (!sv || (!path && !json))
		return gf_err(GF_ERR_INVALID_ARG, "supervisor config: no path and no text");
	if (sv->loaded)
		return gf_err(GF_ERR_STATE, "supervisor config already loaded");
	json_error_t jerr;
	/* The operator's config file (or text): the only JSON this file parses;
	 * lock state comes from the typed query (gf_lock_query_start()). */
	json_t *root = path ? json_load_file(path, JSON_REJECT_DUPLICATES, &jerr)
			    : json_loadb(json, strlen(json), JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return gf_err(GF_ERR_INVALID_ARG, "%s:%d:%d: %s", path ? path : "config", jerr.line, jerr.column,
			      jerr.text);
	int r = load(sv, root);
	json_decref(root);
	if (r < 0) {
		for (size_t i = 0; i < sv->n; i++)
			gf_sv_engine_clear(&sv->eng[i]);
		free(sv->eng);
		sv->eng = NULL;
		sv->n = 0;
		return r;
	}
	sv->loaded = 1;
	return 0;
}
