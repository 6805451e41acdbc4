/* SPDX-License-Identifier: Apache-2.0 */
/* What the lock server tells outside: its status as JSON, readiness, and /metrics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

/* A scraper asks every 15 s or so; eight asking at once still cost one rendering. */
#define METRICS_REUSE_US 1000000

static int render_metrics(gf_lockd *d, char **text);

int gf_lockd_status_json(gf_lockd *d, char **json)
{
	if (!d || !json)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL argument");
	gf_LockStatus *s = malloc(sizeof(*s));
	if (!s)
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	lockd_fill_status(d, s);
	int rc = gf_lock_status_to_json(s, json);
	free(s);
	return rc;
}

static void metric(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void engine_metrics(FILE *f, const char *name, const struct conn *c, const char *role)
{
	const struct gf_pool_decl *decl = c->decl;
	uint64_t v = 0;
	if (!strcmp(name, "gf_lock_engine_last_active_seconds")) {
		int64_t t = !strcmp(role, "holder") ? gf_wall_us() : c->last_active_us;
		fprintf(f, "%s{id=\"%s\",role=\"%s\"} %.6f\n", name, c->peer->id, role, (double)t / 1e6);
		return;
	}
	if (!strcmp(name, "gf_lock_engine_wake_bytes"))
		v = decl ? decl->wake_bytes : 0;
	else if (!strcmp(name, "gf_lock_engine_asleep_bytes"))
		v = decl ? decl->asleep_bytes : 0;
	else if (!strcmp(name, "gf_lock_engine_pids"))
		v = c->npids;
	else
		v = decl && decl->pinned;
	fprintf(f, "%s{id=\"%s\",role=\"%s\"} %llu\n", name, c->peer->id, role, (unsigned long long)v);
}

int gf_lockd_metrics(gf_lockd *d, char **text)
{
	if (!d || !text)
		return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL argument");
	int64_t now = gf_now_us();
	if (!d->metrics || now - d->metrics_at >= METRICS_REUSE_US) {
		char *fresh = NULL;
		int rc = render_metrics(d, &fresh);
		if (rc < 0)
			return rc;
		free(d->metrics);
		d->metrics = fresh;
		d->metrics_len = strlen(fresh);
		d->metrics_at = now;
	}
	char *copy = malloc(d->metrics_len + 1);
	if (!copy)
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	memcpy(copy, d->metrics, d->metrics_len + 1);
	*text = copy;
	return 0;
}

static int render_metrics(gf_lockd *d, char **text)
{
	struct pool_gpu *t;
	size_t n;
	int rc = lockd_pool_gpus(d, &t, &n);
	if (rc < 0)
		return rc;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f) {
		free(t);
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	}
	struct gf_srv_stats st;
	gf_srv_stats(d->srv, &st);
	metric(f, "gf_lock_held", "gauge", "1 while an engine holds the lock");
	fprintf(f, "gf_lock_held %d\n", d->holder != NULL);
	metric(f, "gf_lock_epoch", "gauge", "the last epoch granted");
	fprintf(f, "gf_lock_epoch %llu\n", (unsigned long long)d->epoch);
	metric(f, "gf_lock_waiters", "gauge", "standby engines waiting for the lock");
	fprintf(f, "gf_lock_waiters %zu\n", d->nwaiters);
	metric(f, "gf_lock_holder_pids", "gauge",
	       "further processes (other ranks) the holder registered: the next grant waits for each to exit");
	fprintf(f, "gf_lock_holder_pids %zu\n", d->holder ? d->holder->npids : 0);
	metric(f, "gf_lock_exit_wait_processes", "gauge",
	       "processes of the released holder not exited yet: the next grant waits for them (exit wait)");
	fprintf(f, "gf_lock_exit_wait_processes %zu\n", d->exit_left);
	metric(f, "gf_lock_grants_held", "gauge", "1 while grants are held: the last state-file write failed and is retried");
	fprintf(f, "gf_lock_grants_held %d\n", d->store_retry_at != 0);
	metric(f, "gf_lock_state_write_failures_total", "counter", "state-file writes that failed");
	fprintf(f, "gf_lock_state_write_failures_total %llu\n", (unsigned long long)d->store_failures);
	metric(f, "gf_lock_connections", "gauge", "open connections");
	fprintf(f, "gf_lock_connections %u\n", st.connections);
	metric(f, "gf_lock_pool_max_standby_per_gpu", "gauge", "standby budget per GPU (0: none)");
	fprintf(f, "gf_lock_pool_max_standby_per_gpu %u\n", d->pool.max_standby_per_gpu);
	metric(f, "gf_lock_pool_min_standby_age_seconds", "gauge", "standbys younger than this are never evicted");
	fprintf(f, "gf_lock_pool_min_standby_age_seconds %.3f\n", (double)d->pool.min_standby_age_us / 1e6);
	metric(f, "gf_lock_pool_evicted_total", "counter", "standbys evicted to keep a GPU's budget");
	fprintf(f, "gf_lock_pool_evicted_total %llu\n", (unsigned long long)d->evicted);
	metric(f, "gf_lock_pool_over_budget_total", "counter",
	       "registrations that left a GPU over budget because nothing was evictable");
	fprintf(f, "gf_lock_pool_over_budget_total %llu\n", (unsigned long long)d->over_budget);
	static const struct {
		const char *name, *help;
	} per_gpu[] = {
		{ "gf_lock_pool_gpu_standbys", "standby engines that declared this GPU" },
		{ "gf_lock_pool_gpu_asleep_bytes", "memory the standbys on this GPU keep while asleep" },
		{ "gf_lock_pool_gpu_wake_bytes_max", "the largest wake need among the standbys on this GPU" },
		{ "gf_lock_pool_gpu_active", "1 when the holder declared this GPU" },
	};
	for (size_t k = 0; k < GF_ARRAY_SIZE(per_gpu); k++) {
		metric(f, per_gpu[k].name, "gauge", per_gpu[k].help);
		for (size_t g = 0; g < n; g++) {
			uint64_t v = k == 0 ? t[g].standbys : k == 1 ? t[g].asleep_bytes : k == 2 ? t[g].wake_bytes_max : t[g].active;
			fprintf(f, "%s{uuid=\"%s\"} %llu\n", per_gpu[k].name, t[g].uuid, (unsigned long long)v);
		}
	}
	static const struct {
		const char *name, *type, *help;
	} per_engine[] = {
		{ "gf_lock_engine_last_active_seconds", "gauge",
		  "wall clock when the engine was last Active (holder: now; 0: never), the LRU order" },
		{ "gf_lock_engine_wake_bytes", "gauge", "private memory the engine's wake needs, as declared" },
		{ "gf_lock_engine_asleep_bytes", "gauge", "memory the engine keeps while asleep, as declared" },
		{ "gf_lock_engine_pinned", "gauge", "1 when the engine is never evicted" },
		{ "gf_lock_engine_pids", "gauge", "further processes (ranks) the engine registered with the lock" },
	};
	for (size_t k = 0; k < GF_ARRAY_SIZE(per_engine); k++) {
		metric(f, per_engine[k].name, per_engine[k].type, per_engine[k].help);
		if (d->holder)
			engine_metrics(f, per_engine[k].name, d->holder, "holder");
		for (struct conn *w = d->whead; w; w = w->wnext)
			engine_metrics(f, per_engine[k].name, w, "standby");
	}
	free(t);
	if (fclose(f) != 0 || !buf) {
		free(buf);
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	}
	*text = buf;
	return 0;
}

int gf_lockd_ready_json(gf_lockd *d, const char *const *gpus, size_t ngpus, const char *model, char **json)
{
	if (!d || !json || (ngpus && !gpus))
		return gf_err(GF_ERR_INVALID_ARG, "lockd: NULL argument");
	gf_LockStatus *s = malloc(sizeof(*s));
	if (!s)
		return gf_err(GF_ERR_NOMEM, "lockd: out of memory");
	lockd_fill_status(d, s);
	int rc = gf_lock_ready_from_status(s, gpus, ngpus, model, json);
	free(s);
	return rc;
}
