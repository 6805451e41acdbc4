/* SPDX-License-Identifier: Apache-2.0 */
/* Reporting: the failover metrics as a struct, as Prometheus text and as
 * the status JSON. Thread-safe: everything is read under the engine mutex. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common.h"
#include "engine_int.h"

GF_EXPORT int gf_engine_metrics(const gf_engine *e, struct gf_engine_metrics *out)
{
	if (!e || !out)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_metrics: NULL argument");
	pthread_mutex_lock(gf_engine_mu(e));
	struct gf_engine_metrics m = e->m;
	m.state = e->state;
	m.time_in_state_us = e->clock.now_us() - e->state_since_us;
	m.transitions = e->transitions;
	pthread_mutex_unlock(gf_engine_mu(e));
	*out = m;
	return 0;
}

/* What the engine reports beyond struct gf_engine_metrics, read at once. */
struct extra {
	char dead_cause[32];
	char dead_reason[512];
	bool gate_waiting;
	int64_t gate_us;
};

static void read_extra(const gf_engine *e, struct extra *x)
{
	pthread_mutex_lock(gf_engine_mu(e));
	memcpy(x->dead_cause, e->dead_cause, sizeof(x->dead_cause));
	memcpy(x->dead_reason, e->dead_reason, sizeof(x->dead_reason));
	x->gate_waiting = e->gate_waiting;
	x->gate_us = e->gate_us;
	pthread_mutex_unlock(gf_engine_mu(e));
}

/* Phases of the failover histogram. lock_wait is not one: for a standby it
 * is how long the previous engine lived, not part of a takeover. */
static const char *const hist_phase[GF_ENGINE_HIST_PHASES] = { "remap", "private_alloc", "serve", "total" };
/* Upper bounds in microseconds: from a host-backend remap (sub-millisecond)
 * to a wake waiting minutes for memory. */
/* From 10 us (a takeover's steps take tens to hundreds of microseconds) to
 * 10 s in 1-2.5-5 steps, then up to the waking timeout's range (a wake
 * that retries its KV memory while the old engine's drains). */
static const int64_t hist_le_us[GF_ENGINE_HIST_BUCKETS] = {
	10,      25,      50,      100,      250,      500,      1000,      2500,
	5000,    10000,   25000,   50000,    100000,   250000,   500000,    1000000,
	2500000, 5000000, 10000000, 30000000, 60000000, 120000000, 300000000,
};

static void observe(struct engine_hist *h, int64_t us)
{
	if (us < 0)
		return;
	for (int b = 0; b < GF_ENGINE_HIST_BUCKETS; b++)
		if (us <= hist_le_us[b])
			h->bucket[b]++;
	h->count++;
	h->sum_us += us;
}

void gf_engine_record_failover(gf_engine *e)
{
	const int64_t us[GF_ENGINE_HIST_PHASES] = { e->m.remap_us, e->m.private_alloc_us, e->m.serve_us,
						    e->m.wake_total_us };
	for (int p = 0; p < GF_ENGINE_HIST_PHASES; p++)
		observe(&e->hist[p], us[p]);
}

/* Prometheus wants seconds; microseconds are printed exactly. */
/* How long the engine's lock client has been without its server (0: connected, or no lock yet). */
static int64_t lock_unreachable_ms(const gf_engine *e)
{
	gf_lock *lock = atomic_load(&((gf_engine *)e)->lock);
	int64_t ms = lock ? gf_lock_unreachable_ms(lock) : 0;
	return ms > 0 ? ms : 0;
}

static void put_seconds(FILE *f, int64_t us)
{
	if (us < 0)
		us = 0;
	fprintf(f, "%" PRId64 ".%06" PRId64, us / 1000000, us % 1000000);
}

static void put_histogram(const gf_engine *e, FILE *f)
{
	struct engine_hist h[GF_ENGINE_HIST_PHASES];
	pthread_mutex_lock(gf_engine_mu(e));
	memcpy(h, e->hist, sizeof(h));
	pthread_mutex_unlock(gf_engine_mu(e));
	fprintf(f, "# HELP gf_engine_failover_duration_seconds Completed takeovers by phase (grant to Active is "
		   "phase total).\n"
		   "# TYPE gf_engine_failover_duration_seconds histogram\n");
	for (int p = 0; p < GF_ENGINE_HIST_PHASES; p++) {
		for (int b = 0; b < GF_ENGINE_HIST_BUCKETS; b++) {
			fprintf(f, "gf_engine_failover_duration_seconds_bucket{phase=\"%s\",le=\"", hist_phase[p]);
			put_seconds(f, hist_le_us[b]);
			fprintf(f, "\"} %" PRIu64 "\n", h[p].bucket[b]);
		}
		fprintf(f, "gf_engine_failover_duration_seconds_bucket{phase=\"%s\",le=\"+Inf\"} %" PRIu64 "\n",
			hist_phase[p], h[p].count);
		fprintf(f, "gf_engine_failover_duration_seconds_sum{phase=\"%s\"} ", hist_phase[p]);
		put_seconds(f, h[p].sum_us);
		fprintf(f, "\ngf_engine_failover_duration_seconds_count{phase=\"%s\"} %" PRIu64 "\n", hist_phase[p],
			h[p].count);
	}
}

/* The least protected answer across the devices ("untested" before any
 * backend is open): one device with writable weights is one too many. */
static const char *read_protection(const gf_engine *e)
{
	static const int worst_first[] = { GF_MEM_READ_PROT_IGNORED, GF_MEM_READ_PROT_REJECTED,
					   GF_MEM_READ_PROT_UNTESTED, GF_MEM_READ_PROT_ENFORCED };
	int seen[GF_ARRAY_SIZE(worst_first)] = { 0 }, any = 0;
	for (int i = 0; i < e->ndev; i++) {
		if (!e->dev[i].mem)
			continue;
		int p = gf_mem_read_protection(e->dev[i].mem);
		any = 1;
		for (size_t k = 0; k < GF_ARRAY_SIZE(worst_first); k++)
			seen[k] |= p == worst_first[k];
	}
	for (size_t k = 0; any && k < GF_ARRAY_SIZE(worst_first); k++)
		if (seen[k])
			return gf_mem_read_protection_name(worst_first[k]);
	return gf_mem_read_protection_name(GF_MEM_READ_PROT_UNTESTED);
}

/* Whether a sticky fault lost the context of any device. */
static int device_lost(const gf_engine *e)
{
	for (int i = 0; i < e->ndev; i++)
		if (e->dev[i].mem && gf_mem_device_lost(e->dev[i].mem))
			return 1;
	return 0;
}

GF_EXPORT int gf_engine_metrics_text(const gf_engine *e, char **text)
{
	struct gf_engine_metrics m;
	if (!text)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_metrics_text: NULL argument");
	int rc = gf_engine_metrics(e, &m);
	if (rc)
		return rc;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return gf_err(GF_ERR_NOMEM, "metrics: out of memory");
	fprintf(f, "# HELP gf_engine_state Engine state: 1 for the current state, 0 for the others.\n"
		   "# TYPE gf_engine_state gauge\n");
	for (int s = GF_ENGINE_INIT; s <= GF_ENGINE_DEAD; s++)
		fprintf(f, "gf_engine_state{state=\"%s\"} %d\n", gf_engine_state_name(s), s == m.state);
	fprintf(f, "# HELP gf_engine_time_in_state_seconds Seconds since the last state change.\n"
		   "# TYPE gf_engine_time_in_state_seconds gauge\n"
		   "gf_engine_time_in_state_seconds ");
	put_seconds(f, m.time_in_state_us);
	fprintf(f, "\n# HELP gf_engine_transitions_total State changes since the engine was created.\n"
		   "# TYPE gf_engine_transitions_total counter\n"
		   "gf_engine_transitions_total %" PRIu64 "\n",
		m.transitions);
	fprintf(f, "# HELP gf_engine_failovers_total Takeovers completed (Standby to Active).\n"
		   "# TYPE gf_engine_failovers_total counter\n"
		   "gf_engine_failovers_total %" PRIu64 "\n",
		m.failovers);
	fprintf(f, "# HELP gf_engine_lock_epoch Fencing epoch of the lock grant (0 before).\n"
		   "# TYPE gf_engine_lock_epoch gauge\n"
		   "gf_engine_lock_epoch %" PRIu64 "\n",
		m.epoch);
	fprintf(f, "# HELP gf_engine_lock_server_unreachable_seconds How long the lock server has been out of reach (0: connected).\n"
		   "# TYPE gf_engine_lock_server_unreachable_seconds gauge\n"
		   "gf_engine_lock_server_unreachable_seconds ");
	put_seconds(f, lock_unreachable_ms(e) * 1000);
	fprintf(f, "\n# HELP gf_engine_last_failover_seconds Last takeover broken down by phase.\n"
		   "# TYPE gf_engine_last_failover_seconds gauge\n");
	struct extra x;
	read_extra(e, &x);
	const struct {
		const char *phase;
		int64_t us;
	} phases[] = { { "lock_wait", m.lock_wait_us }, { "memory_gate", x.gate_us }, { "remap", m.remap_us },
		       { "private_alloc", m.private_alloc_us }, { "serve", m.serve_us },
		       { "total", m.wake_total_us } };
	for (size_t i = 0; i < GF_ARRAY_SIZE(phases); i++)
		if (phases[i].us >= 0) {
			fprintf(f, "gf_engine_last_failover_seconds{phase=\"%s\"} ", phases[i].phase);
			put_seconds(f, phases[i].us);
			fputc('\n', f);
		}
	put_histogram(e, f);
	if (m.state == GF_ENGINE_DEAD)
		fprintf(f, "# HELP gf_engine_dead_cause Why the engine is Dead (present once Dead).\n"
			   "# TYPE gf_engine_dead_cause gauge\n"
			   "gf_engine_dead_cause{cause=\"%s\"} 1\n",
			x.dead_cause);
	/* The device's answers to the driver questions (docs/memory.md): whether
	 * read-only weights are really read-only, and whether a sticky fault
	 * has lost the context (the engine must exit to recover). */
	fprintf(f, "# HELP gf_engine_read_protection How the device treats read-only weight mappings (1 for the current "
		   "answer).\n"
		   "# TYPE gf_engine_read_protection gauge\n"
		   "gf_engine_read_protection{mode=\"%s\"} 1\n",
		read_protection(e));
	fprintf(f, "# HELP gf_engine_device_lost 1 once a sticky device error lost the GPU context in this process.\n"
		   "# TYPE gf_engine_device_lost gauge\n"
		   "gf_engine_device_lost %d\n",
		device_lost(e));
	fprintf(f, "# HELP gf_engine_rank The engine's rank: 0 holds the lock, >= 1 wakes with its holder's epoch.\n"
		   "# TYPE gf_engine_rank gauge\n"
		   "gf_engine_rank %d\n",
		e->rank);
	fprintf(f, "# HELP gf_engine_memory_need_bytes Free memory every device needs before the engine wakes (0: no "
		   "gate).\n"
		   "# TYPE gf_engine_memory_need_bytes gauge\n"
		   "gf_engine_memory_need_bytes %" PRIu64 "\n",
		gf_engine_memory_need(e));
	fprintf(f, "# HELP gf_engine_memory_gate_waiting 1 while the engine holds the lock and waits for free memory.\n"
		   "# TYPE gf_engine_memory_gate_waiting gauge\n"
		   "gf_engine_memory_gate_waiting %d\n",
		x.gate_waiting ? 1 : 0);
	fprintf(f, "# HELP gf_engine_startup_deadline_seconds Time from creation to Standby before the engine is Dead "
		   "(0: none).\n"
		   "# TYPE gf_engine_startup_deadline_seconds gauge\n"
		   "gf_engine_startup_deadline_seconds ");
	put_seconds(f, e->startup_deadline_ms * 1000);
	fputc('\n', f);
	int64_t init_ms = gf_engine_init_timeout(e);
	fprintf(f, "# HELP gf_engine_init_timeout_seconds How long Init waits for each GMS (a follower: for the "
		   "loader's commit); +Inf: forever.\n"
		   "# TYPE gf_engine_init_timeout_seconds gauge\n"
		   "gf_engine_init_timeout_seconds ");
	if (init_ms < 0)
		fputs("+Inf", f);
	else
		put_seconds(f, init_ms * 1000);
	fputc('\n', f);
	struct gf_engine_http_stats hs;
	gf_engine_http_stats(atomic_load(&((gf_engine *)e)->http), &hs);
	fprintf(f, "# HELP gf_engine_probe_connections Open connections of the probe server.\n"
		   "# TYPE gf_engine_probe_connections gauge\n"
		   "gf_engine_probe_connections %u\n",
		hs.open);
	fprintf(f, "# HELP gf_engine_probe_connections_cut_total Probe server connections cut: a request unfinished "
		   "at the deadline, or the oldest evicted for a new connection.\n"
		   "# TYPE gf_engine_probe_connections_cut_total counter\n"
		   "gf_engine_probe_connections_cut_total{reason=\"deadline\"} %" PRIu64 "\n"
		   "gf_engine_probe_connections_cut_total{reason=\"evicted\"} %" PRIu64 "\n",
		hs.cut_deadline, hs.cut_evicted);
	fprintf(f, "# HELP gf_engine_private_alloc_retries Out-of-memory retries of the last wake.\n"
		   "# TYPE gf_engine_private_alloc_retries gauge\n"
		   "gf_engine_private_alloc_retries %" PRIu64 "\n",
		m.private_alloc_retries);
	if (fclose(f) != 0 || !buf) {
		free(buf);
		return gf_err(GF_ERR_NOMEM, "metrics: out of memory");
	}
	*text = buf;
	return 0;
}

static json_t *us_or_null(int64_t us)
{
	return us >= 0 ? json_integer(us) : json_null();
}

GF_EXPORT int gf_engine_state_json(const gf_engine *e, char **out)
{
	struct gf_engine_metrics m;
	if (!out)
		return gf_err(GF_ERR_INVALID_ARG, "gf_engine_state_json: NULL argument");
	int rc = gf_engine_metrics(e, &m);
	if (rc)
		return rc;
	struct extra x;
	read_extra(e, &x);
	json_t *last = json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:I}", "lock_wait_us", us_or_null(m.lock_wait_us),
				 "memory_gate_us", us_or_null(x.gate_us),
				 "remap_us", us_or_null(m.remap_us), "private_alloc_us",
				 us_or_null(m.private_alloc_us), "serve_us", us_or_null(m.serve_us), "total_us",
				 us_or_null(m.wake_total_us), "private_alloc_retries",
				 (json_int_t)m.private_alloc_retries);
	struct gf_engine_http_stats hs;
	gf_engine_http_stats(atomic_load(&((gf_engine *)e)->http), &hs);
	json_t *cuts = json_pack("{s:I,s:I}", "deadline", (json_int_t)hs.cut_deadline, "evicted",
				 (json_int_t)hs.cut_evicted);
	json_t *o = json_pack("{s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:I,s:o}", "state", gf_engine_state_name(m.state),
			      "id", e->id ? e->id : "", "role", e->role == GF_ENGINE_LOADER ? "loader" : "follower",
			      "devices", (json_int_t)e->ndev, "epoch", (json_int_t)m.epoch, "time_in_state_us",
			      (json_int_t)m.time_in_state_us, "transitions", (json_int_t)m.transitions, "failovers",
			      (json_int_t)m.failovers, "waking_timeout_ms", (json_int_t)e->waking_timeout_ms,
			      "last_failover", last, "probe_connections", (json_int_t)hs.open,
			      "probe_connections_cut", cuts);
	if (o) {
		bool dead = m.state == GF_ENGINE_DEAD;
		json_object_set_new(o, "dead_cause", dead ? json_string(x.dead_cause) : json_null());
		/* The reason may quote outside text (a driver's or a peer's
		 * words) that is not valid UTF-8. */
		json_t *why = dead ? json_string(x.dead_reason) : json_null();
		json_object_set_new(o, "dead_reason", why ? why : json_string("(reason is not valid UTF-8)"));
		json_object_set_new(o, "memory_need_bytes", json_integer((json_int_t)gf_engine_memory_need(e)));
		json_object_set_new(o, "memory_gate_waiting", json_boolean(x.gate_waiting));
		json_object_set_new(o, "startup_deadline_ms", json_integer(e->startup_deadline_ms));
		int64_t init_ms = gf_engine_init_timeout(e);
		json_object_set_new(o, "init_timeout_ms", init_ms < 0 ? json_null() : json_integer(init_ms));
		json_object_set_new(o, "read_protection", json_string(read_protection(e)));
		json_object_set_new(o, "device_lost", json_boolean(device_lost(e)));
		/* A rank engine (>= 1) holds no lock: its epoch is its holder's, given at the wake. */
		json_object_set_new(o, "rank", json_integer(e->rank));
		pthread_mutex_lock(gf_engine_mu(e));
		json_object_set_new(o, "holder_pids", json_integer((json_int_t)e->nholder_pids));
		pthread_mutex_unlock(gf_engine_mu(e));
		/* unix: past the reconnect time the engine holds on (decision 31); say so. */
		int64_t unreach = lock_unreachable_ms(e);
		json_object_set_new(o, "lock_server", json_string(unreach > 0 ? "unreachable" : "connected"));
		json_object_set_new(o, "lock_server_unreachable_ms", json_integer(unreach));
	}
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (!s)
		return gf_err(GF_ERR_NOMEM, "state json: out of memory");
	*out = s;
	return 0;
}

