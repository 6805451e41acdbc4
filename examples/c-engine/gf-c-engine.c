/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gf-c-engine: a small but real inference engine in C on libgpufailover.
 *
 * Init: the loader reads a safetensors file (or generates deterministic
 * weights) and places the tensors in GMS allocations; the follower imports
 * the same weights zero-copy. Then the shadow loop runs: sleep (unmap),
 * acquire the lock (blocks while another engine is active), wake (remap at
 * the same addresses, allocate the KV memory), serve /infer over HTTP.
 * Each step is logged as `event=...` lines with timestamps so a demo can
 * build a failover timeline.
 *
 * The example computes on the CPU and reads the weights through host
 * pointers, so it runs on the host memory backend.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <jansson.h>
#include <microhttpd.h>
#include <xxhash.h>

#include "gf-config.h"
#include "gpufailover.h"
#include "model.h"
#include "ranks.h"
#include "secret_file.h"
#include "gpufailover/safetensors.h"

#define PROG "gf-c-engine"
/* Weights are packed into allocations of up to this size (fewer handles map
 * faster than many; docs/design.md, rule 19). */
#define CHUNK_LIMIT (256ull << 20)
/* Tensor alignment inside an allocation. */
#define TENSOR_ALIGN 256ull
/* GMS metadata key of the weights file's __metadata__ (JSON object of strings). */
#define META_FILE_KEY "__metadata__"
/* The GMS's limit on one metadata value (gpufailover/gms.h). */
#define META_VALUE_MAX 1024

struct app {
	gf_engine *engine;
	const char *id;
	char *id_json; /* the id as a JSON string, made at the first answer (the warm-up's) */
	const char *weights_path;
	int port;
	const char *listener; /* serve from the lock's listener of this name, not --port */
	struct model src;  /* what the loader writes (file or generated) */
	gf_safetensors *file; /* the loader's weights file, when one is given */
	void *gen_buf;
	struct model live; /* the tensors as mapped from the GMS */
	struct MHD_Daemon *http;
	int lfd; /* with --listener: our duplicate of the lock's listener while serving, else -1 */
	int serve_port; /* the port serving answers on, logged once the backlog is served */
	atomic_int serving; /* read by the probe server's thread */
	int stop_pipe[2];
	atomic_int stopping;
	atomic_int lost; /* the loss policy ran (on a watcher thread) */
	atomic_int weights_mapped; /* init_weights is over */
	/* The signal thread uses the engine only under sig_mu and while
	 * engine_gone is false: main sets it before gf_engine_free(), so a
	 * SIGTERM (the loss policy's own, or a second one) handled late never
	 * touches a freed engine. */
	pthread_mutex_t sig_mu;
	bool engine_gone;
	atomic_int stepping_down; /* a planned switchover asked us to step down */
	struct ranks *ranks; /* --ranks N > 1: ranks 1..N-1, each its own process */
	int64_t waking_ms;   /* the waking timeout, which bounds the ranks' wake too */
};

/* Set while draining for a switchover: answers close their connection. */
static atomic_int draining;
/* How long in-flight requests may take to finish before a switchover releases anyway. */
#define DRAIN_TIMEOUT_MS 30000

static void logf_(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(int level, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	gf_log_stderr(level, "c-engine", msg, PROG);
}

static void usage(FILE *to)
{
	fprintf(to,
		"Usage: " PROG " --lock URI --gms URI [--gms URI ...] [options]\n"
		"       " PROG " --write-weights FILE\n"
		"\n"
		"A small inference engine in C that fails over through libgpufailover.\n"
		"\n"
		"  --lock URI             lock server (unix:///path or tcp://host:port)\n"
		"  --lock-secret-file PATH  the shared secret a tcp:// lock server requires (as\n"
		"                         gf-lockd --secret-file: trailing newline ignored)\n"
		"  --gms URI              GMS of the next device (repeatable; device 0 first)\n"
		"  --role loader|follower loader connects RW_OR_RO and loads the weights (default),\n"
		"                         follower connects RO and imports the loader's weights\n"
		"  --id ID                engine id for the lock (default c-engine-PID)\n"
		"  --weights FILE         safetensors file to load (loader; default: generated\n"
		"                         deterministic weights, 4 layers of F32 256x256 + biases)\n"
		"  --port N               inference HTTP port, served once active (default 8080; 0: any)\n"
		"  --listener NAME        serve from the listening socket the lock carries under NAME\n"
		"                         (gf-lockd --listener NAME=URI) instead of --port: connections\n"
		"                         wait in its backlog during a failover instead of being refused\n"
		"  --probe-port N         probe server port: /live /ready /startup /state /metrics\n"
		"                         (default 8081; 0: any; -1: off)\n"
		"  --probe-address ADDR   probe server IPv4 address (default 0.0.0.0)\n"
		"  --backend host|auto    memory backend (this engine computes on the CPU: host)\n"
		"  --waking-timeout DUR   /live fails after this long in Waking (default 120s)\n"
		"  --remap-timeout DUR    GMS remap timeout on wake (default 30s)\n"
		"  --init-timeout DUR     how long to wait for each GMS at init (default: loader forever,\n"
		"                         follower 30m: a follower whose loader never commits exits)\n"
		"  --startup-deadline DUR not in standby this long after start: dead, exit 70\n"
		"                         (default: none)\n"
		"  --lock-reconnect-timeout DUR  after losing the lock server, how long to try to\n"
		"                         get the lock back before giving up (default 12s; on\n"
		"                         unix:// it holds on past it until the server returns)\n"
		"  --kv-bytes N           private (KV) memory per device, e.g. 64M (default 16M)\n"
		"  --wake-priority N      wait for the lock and wake under SCHED_FIFO priority N (1..99)\n"
		"                         until Active, where permitted (CAP_SYS_NICE); 0: off (default)\n"
		"  --ranks N              one process per rank (N = the number of --gms): this one is\n"
		"                         rank 0 (device 0, the lock, the endpoints), ranks 1..N-1 are\n"
		"                         its children, rank engines with one GMS each, registered\n"
		"                         with the lock; any rank's death ends the whole engine\n"
		"                         (exit 70), and the lock passes on once every rank exited\n"
		"  --gpu UUID             a GPU this engine runs on, declared to the lock server's\n"
		"                         standby pool (repeatable, at most 8; GPU-xxxxxxxx-xxxx-...)\n"
		"  --asleep-bytes N       memory kept while asleep, declared to the pool (default 0)\n"
		"  --pin                  never evicted to keep a GPU's standby budget\n"
		"  --model NAME           the model served, for readiness queries\n"
		"  --write-weights FILE   write the generated weights as safetensors and exit\n"
		"  --help, --version\n"
		"\n"
		"Endpoint: GET or POST /infer?seed=N -> {\"result\": [8 values], \"checksum\": XXH64 hex,\n"
		"          \"epoch\": lock epoch, \"engine\": id}\n"
		"Test hooks: GF_ENGINE_TEST_HANG_WAKE_MS=N makes serve_endpoint hang N ms;\n"
		"GF_ENGINE_TEST_SIGNAL_LAG_MS=N keeps the signal thread N ms after a stop request.\n"
		"Exit: 0 on SIGTERM/SIGINT, 1 on a failed step, 2 on bad usage,\n"
		"      75 after a planned switchover (gfctl switchover: drained, lock released),\n"
		"      70 when the lock or GMS was lost or the startup deadline passed\n"
		"      (default loss policy), 73 when the lock server evicted this standby\n"
		"      to keep a GPU's standby budget (not a crash: do not restart).\n"
		"Memory gate: the wake waits, up to the waking timeout, for --kv-bytes of\n"
		"MemAvailable (GF_MEM_HOST_AVAILABLE=bytes overrides it, for tests).\n");
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

static int parse_bytes(const char *s, uint64_t *out)
{
	return gf_parse_bytes(s, out) < 0 ? -1 : 0;
}

static int parse_duration(const char *opt, const char *s, int64_t *out)
{
	uint64_t ms;
	if (gf_parse_duration_ms(s, &ms) != 0 || ms > INT64_MAX / 2000) {
		fprintf(stderr, PROG ": %s: %s\n", opt, gf_error_detail());
		return -1;
	}
	*out = (int64_t)ms;
	return 0;
}

/* ---- weights into the GMS ---- */

static uint64_t align_up(uint64_t v)
{
	return (v + TENSOR_ALIGN - 1) & ~(TENSOR_ALIGN - 1);
}

static int meta_value(const struct model_tensor *t, uint64_t offset, size_t index, char **out)
{
	json_t *shape = json_array();
	for (unsigned d = 0; d < t->ndim; d++)
		json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
	json_t *v = json_pack("{s:s,s:o,s:I,s:I,s:I}", "dtype", t->dtype, "shape", shape, "offset",
			      (json_int_t)offset, "index", (json_int_t)index, "nbytes", (json_int_t)t->nbytes);
	*out = v ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	json_decref(v);
	return *out ? 0 : GF_ERR_NOMEM;
}

static int find_alloc(gf_gms *gms, uint64_t id, struct gf_gms_alloc_info *info)
{
	for (size_t k = gf_gms_alloc_count(gms); k-- > 0;)
		if (gf_gms_alloc_at(gms, k, info) == 0 && info->id == id)
			return 0;
	return GF_ERR_NOT_FOUND;
}

/* The file's __metadata__ goes into the GMS under META_FILE_KEY (attached
 * to the first allocation), so a follower sees what the loader read. A value
 * over the GMS's limit is left out with a warning: the weights still load.
 * A file with no tensors gets one small allocation ("metadata") to carry
 * it, since GMS metadata is always attached to an allocation. */
static int put_file_metadata(struct app *a, gf_gms *gms, uint64_t first_id)
{
	const char *json = gf_safetensors_metadata(a->file);
	if (!json)
		return 0;
	if (strlen(json) > META_VALUE_MAX) {
		logf_(GF_LOG_WARN, "event=metadata_skipped bytes=%zu msg=\"__metadata__ over the GMS's %d-byte value limit\"",
		      strlen(json), META_VALUE_MAX);
		return 0;
	}
	if (!a->src.n) {
		int rc = gf_gms_allocate(gms, 1, "metadata", &first_id);
		if (rc)
			return rc;
	}
	return gf_gms_put_meta(gms, META_FILE_KEY, first_id, 0, json, strlen(json));
}

static int load_weights(gf_engine *e, int device, gf_gms *gms, void *userdata)
{
	struct app *a = userdata;
	const struct model *m = &a->src;
	size_t i = 0, chunks = 0;
	uint64_t total = 0, first_id = 0;
	int rc;
	while (i < m->n) {
		/* Plan one allocation: as many tensors in order as fit the limit. */
		uint64_t size = 0, last_off = 0;
		size_t j = i;
		while (j < m->n) {
			uint64_t off = align_up(size);
			if (j > i && off + m->t[j].nbytes > CHUNK_LIMIT)
				break;
			last_off = off;
			size = off + m->t[j].nbytes;
			j++;
		}
		if (size <= last_off)
			size = last_off + 1; /* a trailing empty tensor still needs its offset inside */
		char tag[64];
		snprintf(tag, sizeof(tag), "weights.%zu", chunks);
		uint64_t id;
		struct gf_gms_alloc_info info;
		rc = gf_gms_allocate(gms, size, tag, &id);
		if (rc)
			return rc;
		if (!chunks)
			first_id = id;
		rc = find_alloc(gms, id, &info);
		if (rc)
			return rc;
		uint8_t *base = (uint8_t *)(uintptr_t)info.addr;
		uint64_t off = 0;
		for (size_t k = i; k < j; k++) {
			const struct model_tensor *t = &m->t[k];
			off = align_up(off);
			if (strlen(t->name) > 255) {
				logf_(GF_LOG_ERR, "event=load_failed msg=\"tensor name longer than 255 bytes: %.64s...\"",
				      t->name);
				return GF_ERR_INVALID_ARG;
			}
			if (t->nbytes)
				memcpy(base + off, t->data, t->nbytes);
			char *val;
			rc = meta_value(t, off, k, &val);
			if (rc)
				return rc;
			rc = gf_gms_put_meta(gms, t->name, id, off, val, strlen(val));
			free(val);
			if (rc)
				return rc;
			off += t->nbytes;
		}
		total += size;
		chunks++;
		i = j;
	}
	rc = put_file_metadata(a, gms, first_id);
	if (rc)
		return rc;
	uint64_t generation = 0;
	rc = gf_gms_commit(gms, &generation);
	if (rc)
		return rc;
	logf_(GF_LOG_INFO, "event=weights_loaded device=%d tensors=%zu allocations=%zu bytes=%" PRIu64
	      " generation=%" PRIu64, device, m->n, chunks, total, generation);
	(void)e;
	return 0;
}

static int cmp_index(const void *x, const void *y)
{
	const size_t *a = x, *b = y;
	return (a[0] > b[0]) - (a[0] < b[0]);
}

/* Build the tensor table from device 0's metadata: the same table on the
 * loader and the follower, at addresses that stay valid across sleep/wake. */
static void warm_up(struct app *a);

static int weights_ready(gf_engine *e, void *userdata)
{
	struct app *a = userdata;
	atomic_store(&a->weights_mapped, 1);
	gf_gms *gms = gf_engine_gms(e, 0);
	size_t n = gf_gms_meta_count(gms);
	size_t(*order)[2] = calloc(n ? n : 1, sizeof(*order));
	struct model m = { 0 };
	int rc = GF_ERR_NOMEM;
	if (!order)
		return rc;
	m.t = calloc(n ? n : 1, sizeof(*m.t));
	if (!m.t)
		goto out;
	for (size_t k = 0; k < n; k++) {
		struct gf_gms_meta meta;
		json_error_t je;
		rc = gf_gms_meta_at(gms, k, &meta);
		if (rc)
			goto out;
		if (!strcmp(meta.key, META_FILE_KEY))
			continue;
		json_t *v = json_loadb(meta.value, meta.value_len, 0, &je);
		json_t *shape = json_object_get(v, "shape");
		const char *dtype = json_string_value(json_object_get(v, "dtype"));
		struct model_tensor *t = &m.t[m.n];
		rc = GF_ERR_PROTOCOL;
		if (!v || !dtype || !json_is_array(shape) || json_array_size(shape) > GF_SAFETENSORS_MAX_DIMS ||
		    !json_is_integer(json_object_get(v, "index")) || !json_is_integer(json_object_get(v, "nbytes"))) {
			logf_(GF_LOG_ERR, "event=bad_metadata key=\"%s\" msg=\"not the example engine's tensor metadata\"",
			      meta.key);
			json_decref(v);
			goto out;
		}
		t->name = strdup(meta.key);
		snprintf(t->dtype, sizeof(t->dtype), "%s", dtype);
		t->ndim = (unsigned)json_array_size(shape);
		uint64_t bits = gf_safetensors_dtype_bits(dtype), count = 1;
		for (unsigned d = 0; d < t->ndim; d++) {
			t->shape[d] = (uint64_t)json_integer_value(json_array_get(shape, d));
			count *= t->shape[d];
		}
		t->nbytes = (uint64_t)json_integer_value(json_object_get(v, "nbytes"));
		t->data = (const void *)(uintptr_t)meta.addr;
		order[m.n][0] = (size_t)json_integer_value(json_object_get(v, "index"));
		order[m.n][1] = m.n;
		json_decref(v);
		m.n++;
		if (!t->name || !bits || count * bits / 8 != t->nbytes) {
			logf_(GF_LOG_ERR, "event=bad_metadata key=\"%s\" msg=\"size does not match dtype and shape\"",
			      meta.key);
			goto out;
		}
	}
	qsort(order, m.n, sizeof(*order), cmp_index);
	a->live.t = calloc(m.n ? m.n : 1, sizeof(*a->live.t));
	if (!a->live.t) {
		rc = GF_ERR_NOMEM;
		goto out;
	}
	for (size_t k = 0; k < m.n; k++) {
		a->live.t[k] = m.t[order[k][1]];
		m.t[order[k][1]].name = NULL;
	}
	a->live.n = m.n;
	logf_(GF_LOG_INFO, "event=weights_ready tensors=%zu", a->live.n);
	warm_up(a);
	/* Standby only once every rank holds its weights and sleeps. */
	rc = a->ranks ? ranks_wait_asleep(a->ranks) : 0;
	if (rc)
		logf_(GF_LOG_ERR, "event=ranks_failed step=init msg=\"%s\"", ranks_error());
	else if (a->ranks)
		logf_(GF_LOG_INFO, "event=ranks_asleep ranks=%d", ranks_count(a->ranks));
out:
	model_clear(&m);
	free(order);
	return rc;
}

/* ---- inference endpoint ---- */

static int64_t mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t mono_ms(void)
{
	return mono_us() / 1000;
}

/*
 * The answer to /infer?seed=@seed as JSON text (malloc'd, its length in
 * *@len_out); NULL when out of memory or the model's output is not a
 * number. Written with snprintf rather than built as a jansson object: a
 * failover's first answer waits on it, and the object's allocations and
 * its dump cost more than the formatting. The engine id, which may need
 * escaping, is encoded once.
 */
static char *infer_answer(struct app *a, uint64_t seed, size_t *len_out)
{
	if (!a->id_json) {
		json_t *id = json_string(a->id);
		a->id_json = id ? json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
		json_decref(id);
		if (!a->id_json)
			return NULL;
	}
	float *out;
	size_t len;
	if (model_infer(&a->live, seed, &out, &len))
		return NULL;
	int nranks = a->ranks ? ranks_count(a->ranks) : 0;
	size_t cap = 512 + strlen(a->id_json) + (size_t)(nranks > 0 ? nranks : 0) * 24;
	char *text = malloc(cap);
	size_t n = 0;
	bool ok = text != NULL;
#define PUT(...)                                                                      \
	do {                                                                          \
		int w_ = ok ? snprintf(text + n, cap - n, __VA_ARGS__) : -1;          \
		ok = w_ >= 0 && (size_t)w_ < cap - n;                                 \
		n += ok ? (size_t)w_ : 0;                                             \
	} while (0)
	PUT("{\"result\":[");
	for (size_t i = 0; i < len && i < 8; i++) {
		ok = ok && isfinite(out[i]);
		PUT("%s%.17g", i ? "," : "", (double)out[i]);
	}
	PUT("],\"checksum\":\"%016llx\",\"epoch\":%" PRIu64 ",\"engine\":%s,\"seed\":%" PRIu64 ",\"dim\":%zu",
	    (unsigned long long)XXH64(out, len * sizeof(float), 0), gf_engine_epoch(a->engine), a->id_json, seed, len);
	free(out);
	if (nranks > 0) {
		/* Each other rank's weights, as it read them at its wake (hex digests). */
		PUT(",\"ranks\":[");
		for (int i = 1; i < nranks; i++)
			PUT("%s\"%s\"", i > 1 ? "," : "", ranks_checksum(a->ranks, i));
		PUT("]");
	}
	PUT("}");
#undef PUT
	if (!ok) {
		free(text);
		return NULL;
	}
	*len_out = n;
	return text;
}

/*
 * Answer once now, while nobody waits: a standby's first answer after a
 * failover would otherwise also pay for the first run of this code and of
 * the libraries it calls (their pages faulted in, caches cold).
 */
static void warm_up(struct app *a)
{
	int64_t t0 = mono_us();
	size_t len;
	free(infer_answer(a, 0, &len));
	logf_(GF_LOG_DEBUG, "event=warmed_up us=%lld", (long long)(mono_us() - t0));
}

/* Queue @text (malloc'd JSON, taken) as the answer. */
static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, char *text, size_t len)
{
	if (!text)
		return MHD_NO;
	struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	if (atomic_load(&draining))
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *body)
{
	char *text = body ? json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	json_decref(body);
	return send_text(c, status, text, text ? strlen(text) : 0);
}

static enum MHD_Result handle_http(void *cls, struct MHD_Connection *c, const char *url, const char *method,
				   const char *version, const char *upload_data, size_t *upload_data_size,
				   void **req_cls)
{
	static int first_call_marker;
	struct app *a = cls;
	(void)version;
	(void)upload_data;
	if (!*req_cls) {
		/* Headers only so far; answer once the (ignored) body is read. */
		*req_cls = &first_call_marker;
		return MHD_YES;
	}
	if (*upload_data_size) {
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (strcmp(url, "/infer") != 0)
		return send_json(c, MHD_HTTP_NOT_FOUND, json_pack("{s:s}", "error", "not found; use /infer?seed=N"));
	if (strcmp(method, "GET") != 0 && strcmp(method, "POST") != 0)
		return send_json(c, MHD_HTTP_METHOD_NOT_ALLOWED, json_pack("{s:s}", "error", "use GET or POST"));
	uint64_t seed = 0;
	const char *s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "seed");
	if (s) {
		char *end;
		errno = 0;
		unsigned long long v = strtoull(s, &end, 10);
		if (!*s || *s == '-' || *end || errno)
			return send_json(c, MHD_HTTP_BAD_REQUEST,
					 json_pack("{s:s}", "error", "seed must be a non-negative integer"));
		seed = v;
	}
	size_t len;
	char *answer = infer_answer(a, seed, &len);
	if (!answer)
		return send_json(c, MHD_HTTP_INTERNAL_SERVER_ERROR, json_pack("{s:s}", "error", "out of memory"));
	return send_text(c, MHD_HTTP_OK, answer, len);
}

/* Waits up to @ms for a stop request; 1 when stopping. */
static int wait_stop(struct app *a, int ms)
{
	struct pollfd p = { .fd = a->stop_pipe[0], .events = POLLIN };
	int r;
	while ((r = poll(&p, 1, ms)) < 0 && errno == EINTR)
		;
	return r > 0;
}

/*
 * With --listener the HTTP server (started at init, without a socket of its
 * own) is handed the connections this loop accepts from the lock's
 * listener, at most @max per round: nothing of it is set up at wake.
 * Returns how many it accepted, or -1 when it stopped because the grant may
 * no longer be current.
 */
static int accept_pending(struct app *a, int max)
{
	int got = 0;
	for (int n = 0; n < max; n++) {
		/* Before each accept: a holder revoked while stopped and then
		 * resumed sees the server's hang-up before the loss path ran. */
		if (!gf_engine_may_accept(a->engine))
			return -1;
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		int c = accept4(a->lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (c < 0) {
			if (errno == ECONNABORTED || errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				logf_(GF_LOG_WARN, "event=accept_failed errno=%d msg=\"%s\"", errno, strerror(errno));
			return got;
		}
		/* MHD closes the socket itself when it cannot take it. */
		MHD_add_connection(a->http, c, (const struct sockaddr *)&ss, len);
		got++;
	}
	return got;
}

/*
 * The HTTP server runs on the main thread (MHD's external epoll mode): the
 * wake starts no thread for it, and the connections the lock's listener
 * kept in its backlog are accepted the moment the engine is Active, by the
 * thread that made it so. Serves for up to @ms (-1: for ever); 1 when a
 * stop was requested (only looked at with @until_stop: a drain serves on
 * after one).
 */
static int serve_http(struct app *a, int ms, bool until_stop)
{
	const union MHD_DaemonInfo *ei = MHD_get_daemon_info(a->http, MHD_DAEMON_INFO_EPOLL_FD);
	int64_t end = ms < 0 ? INT64_MAX : mono_ms() + ms;
	bool hold = false; /* the grant may be gone: leave the backlog to the next holder a while */
	for (;;) {
		MHD_run(a->http);
		int64_t now = mono_ms();
		if (now >= end)
			return 0;
		MHD_UNSIGNED_LONG_LONG to;
		int64_t wait = end == INT64_MAX ? -1 : end - now;
		if (MHD_get_timeout(a->http, &to) == MHD_YES && (wait < 0 || (int64_t)to < wait))
			wait = to > INT32_MAX ? INT32_MAX : (int64_t)to;
		if (hold && (wait < 0 || wait > 20))
			wait = 20;
		struct pollfd p[3] = { { .fd = until_stop ? a->stop_pipe[0] : -1, .events = POLLIN },
				       { .fd = ei ? ei->epoll_fd : -1, .events = POLLIN },
				       { .fd = hold ? -1 : a->lfd, .events = POLLIN } };
		if (poll(p, 3, (int)(wait > INT32_MAX ? INT32_MAX : wait)) < 0 && errno != EINTR)
			return 1;
		if (p[0].revents & POLLIN)
			return 1;
		hold = false;
		if (p[2].revents & POLLIN)
			hold = accept_pending(a, 64) < 0;
	}
}

static int serve_endpoint(gf_engine *e, void *userdata)
{
	struct app *a = userdata;
	const char *hang = getenv("GF_ENGINE_TEST_HANG_WAKE_MS");
	long hang_ms;
	if (hang && *hang && parse_int(hang, 0, 86400000, &hang_ms) == 0 && hang_ms > 0) {
		logf_(GF_LOG_WARN, "event=test_hang_wake ms=%ld msg=\"GF_ENGINE_TEST_HANG_WAKE_MS set\"", hang_ms);
		if (wait_stop(a, (int)hang_ms))
			return GF_ERR_INTERRUPTED;
	}
	if (a->ranks) {
		int64_t t0 = mono_us();
		int rc = ranks_wake(a->ranks, gf_engine_epoch(e), a->waking_ms > 0 ? a->waking_ms : 120000);
		if (rc) {
			logf_(GF_LOG_ERR, "event=ranks_failed step=wake msg=\"%s\"", ranks_error());
			return rc;
		}
		logf_(GF_LOG_INFO, "event=ranks_awake ranks=%d us=%lld", ranks_count(a->ranks),
		      (long long)(mono_us() - t0));
	}
	int port = a->port;
	if (a->listener) {
		/* Ours (a duplicate): closed when stepping down or exiting. */
		int fd, rc = gf_engine_listener(e, a->listener, &fd);
		if (rc < 0) {
			logf_(GF_LOG_ERR, "event=serve_failed listener=%s msg=\"%s\"", a->listener, gf_error_detail());
			return rc;
		}
		/* Non-blocking for every holder (the flag is the socket's): a
		 * connection reset before accept() must not block this loop. The
		 * lock server's listeners are already. */
		int fl = fcntl(fd, F_GETFL);
		if (fl < 0 || (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)) {
			logf_(GF_LOG_ERR, "event=serve_failed listener=%s msg=\"%s\"", a->listener, strerror(errno));
			close(fd);
			return GF_ERR_IO;
		}
		a->lfd = fd;
		port = -1; /* looked up when logged, after the first answers */
	} else {
		a->http = MHD_start_daemon(MHD_USE_EPOLL, (uint16_t)a->port, NULL, NULL,
					   handle_http, a, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
		if (!a->http) {
			logf_(GF_LOG_ERR, "event=serve_failed port=%d msg=\"cannot listen (port in use?)\"", a->port);
			return GF_ERR_IO;
		}
	}
	atomic_store(&a->serving, 1);
	if (!a->listener) {
		const union MHD_DaemonInfo *info = MHD_get_daemon_info(a->http, MHD_DAEMON_INFO_BIND_PORT);
		if (info)
			port = info->port;
	}
	/* Logged by run() once the connections waiting now are answered. */
	a->serve_port = port;
	return 0;
}

/* The default loss policy, remembering that it ran so the exit status can
 * say why the engine stopped. */
static void on_loss(gf_engine *e, int err, const char *detail, void *userdata)
{
	struct app *a = userdata;
	atomic_store(&a->lost, 1);
	gf_engine_default_loss(e, err, detail, NULL);
}

/* On the ranks' watcher thread: a rank is gone, so is the engine (it cannot
 * serve a part of the model). Dead, and the loss policy ends this process
 * (the other ranks are already killed); the lock passes on. */
static void on_rank_death(int rank, int status, void *userdata)
{
	struct app *a = userdata;
	char reason[128];
	if (WIFSIGNALED(status))
		snprintf(reason, sizeof(reason), "rank %d was killed by signal %d", rank, WTERMSIG(status));
	else
		snprintf(reason, sizeof(reason), "rank %d exited with status %d", rank, WEXITSTATUS(status));
	logf_(GF_LOG_ERR, "event=rank_lost rank=%d msg=\"%s: the whole engine ends\"", rank, reason);
	gf_engine_mark_dead(a->engine, reason);
	on_loss(a->engine, GF_ERR_CLOSED, reason, a);
}

/* On the lock's watcher thread: the main thread drains and steps down. */
static void on_step_down(gf_engine *e, void *userdata)
{
	struct app *a = userdata;
	(void)e;
	atomic_store(&a->stepping_down, 1);
	if (write(a->stop_pipe[1], "s", 1) < 0) {
		/* The pipe is never full before the first stop; nothing to do. */
	}
}

/*
 * Planned switchover: stop accepting (the lock's listener keeps new
 * connections in its backlog for the next holder), let the requests in
 * flight finish, release the lock, exit GF_ENGINE_EXIT_SWITCHOVER.
 */
static int step_down(struct app *a)
{
	int64_t t0 = mono_ms();
	atomic_store(&draining, 1);
	if (a->http) {
		if (a->lfd >= 0) {
			close(a->lfd); /* our duplicate: the lock server keeps the socket */
			a->lfd = -1;
		} else {
			MHD_socket lfd = MHD_quiesce_daemon(a->http);
			if (lfd != MHD_INVALID_SOCKET)
				close(lfd);
		}
		for (;;) {
			const union MHD_DaemonInfo *i = MHD_get_daemon_info(a->http, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
			if (!i || i->num_connections == 0 || mono_ms() - t0 > DRAIN_TIMEOUT_MS)
				break;
			serve_http(a, 1, false); /* the requests in flight finish on this thread */
		}
	}
	int rc = gf_engine_step_down(a->engine);
	logf_(rc ? GF_LOG_ERR : GF_LOG_INFO, "event=stepped_down drain_ms=%lld rc=%d", (long long)(mono_ms() - t0), rc);
	return rc ? 1 : GF_ENGINE_EXIT_SWITCHOVER;
}

static int healthy(gf_engine *e, void *userdata)
{
	struct app *a = userdata;
	(void)e;
	return atomic_load(&a->serving);
}

/* ---- signals ---- */

struct sigctx {
	struct app *app;
	sigset_t set;
};

/* How long the signal thread lingers after a stop request
 * (GF_ENGINE_TEST_SIGNAL_LAG_MS, tests only): a thread preempted there on a
 * busy machine while main tears the engine down. */
static long signal_lag_ms(void)
{
	const char *v = getenv("GF_ENGINE_TEST_SIGNAL_LAG_MS");
	long ms;
	return v && *v && parse_int(v, 0, 60000, &ms) == 0 ? ms : 0;
}

static void *signal_thread(void *arg)
{
	struct sigctx *s = arg;
	struct app *a = s->app;
	long lag_ms = signal_lag_ms();
	int sig;
	for (;;) {
		if (sigwait(&s->set, &sig) != 0)
			continue;
		if (sig == SIGPIPE)
			continue;
		pthread_mutex_lock(&a->sig_mu);
		if (a->engine_gone) {
			/* main is past run(): the process is ending anyway. */
			pthread_mutex_unlock(&a->sig_mu);
			continue;
		}
		int st = gf_engine_state(a->engine);
		logf_(GF_LOG_INFO, "event=signal sig=%s state=%s", sig == SIGTERM ? "TERM" : "INT",
		      gf_engine_state_name(st));
		if (st == GF_ENGINE_INIT || (st == GF_ENGINE_DEAD && !atomic_load(&a->weights_mapped))) {
			/* Init blocks in the GMS (a follower waits for the commit)
			 * where no interrupt reaches; nothing is held yet that the
			 * kernel does not release, so leave right away (70 when
			 * the startup watchdog ran the loss policy). */
			int status = atomic_load(&a->lost) ? 70 : 0;
			logf_(GF_LOG_INFO, "event=exit status=%d msg=\"stopped during init\"", status);
			_exit(status);
		}
		atomic_store(&a->stopping, 1);
		/* The engine first: once the pipe is written, main may tear it down. */
		gf_engine_interrupt(a->engine);
		if (write(a->stop_pipe[1], "x", 1) < 0) {
			/* The pipe is never full before the first stop; nothing to do. */
		}
		pthread_mutex_unlock(&a->sig_mu);
		if (lag_ms > 0)
			usleep((useconds_t)lag_ms * 1000);
	}
	return NULL;
}

/* main, done with the engine: from now on the signal thread leaves it alone. */
static void engine_release_signals(struct app *a)
{
	pthread_mutex_lock(&a->sig_mu);
	a->engine_gone = true;
	pthread_mutex_unlock(&a->sig_mu);
}

/* ---- main, in steps ---- */

/* The command line beyond what struct app keeps. */
struct opts {
	const char *lock_uri, *write_path, *probe_addr;
	const char *lock_secret_file;
	char *lock_secret; /* read from lock_secret_file; wiped once the engine holds its copy */
	size_t lock_secret_len;
	const char *gms[16];
	int ngms, role, probe_port, nranks, wake_priority;
	int64_t waking_ms, remap_ms, init_ms, reconnect_ms, startup_ms;
	uint64_t kv_bytes;
	/* the lock server's standby pool */
	const char *gpus[8];
	size_t ngpus;
	uint64_t asleep_bytes;
	int pinned;
	const char *model;
};


/* parse_args() result that means "exit 0 now" (--help, --version). */
#define EXIT_DONE (-1)

/* Step 1: the command line into @a and @o. 0 to go on, EXIT_DONE, or 2. */
static int parse_args(int argc, char **argv, struct app *a, struct opts *o)
{
	static const struct option opts[] = {
		{ "lock", required_argument, NULL, 'l' },      { "gms", required_argument, NULL, 'g' },
		{ "role", required_argument, NULL, 'r' },      { "id", required_argument, NULL, 'i' },
		{ "weights", required_argument, NULL, 'w' },   { "port", required_argument, NULL, 'p' },
		{ "probe-port", required_argument, NULL, 'P' }, { "probe-address", required_argument, NULL, 'A' },
		{ "backend", required_argument, NULL, 'b' },   { "waking-timeout", required_argument, NULL, 'W' },
		{ "remap-timeout", required_argument, NULL, 'R' }, { "init-timeout", required_argument, NULL, 'I' },
		{ "lock-reconnect-timeout", required_argument, NULL, 'L' },
		{ "startup-deadline", required_argument, NULL, 'D' },
		{ "gpu", required_argument, NULL, 'G' },       { "asleep-bytes", required_argument, NULL, 'a' },
		{ "pin", no_argument, NULL, 'n' },             { "model", required_argument, NULL, 'm' },
		{ "kv-bytes", required_argument, NULL, 'k' },  { "write-weights", required_argument, NULL, 'o' },
		{ "listener", required_argument, NULL, 'S' },   { "ranks", required_argument, NULL, 'N' },
		{ "wake-priority", required_argument, NULL, 'F' },
		{ "lock-secret-file", required_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' },            { "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	long v;
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			o->lock_uri = optarg;
			break;
		case 'g':
			if (o->ngms == 16) {
				fprintf(stderr, PROG ": at most 16 --gms\n");
				return 2;
			}
			o->gms[o->ngms++] = optarg;
			break;
		case 'r':
			if (!strcmp(optarg, "loader"))
				o->role = GF_ENGINE_LOADER;
			else if (!strcmp(optarg, "follower"))
				o->role = GF_ENGINE_FOLLOWER;
			else {
				fprintf(stderr, PROG ": --role must be loader or follower, not \"%s\"\n", optarg);
				return 2;
			}
			break;
		case 'i':
			a->id = optarg;
			break;
		case 's':
			o->lock_secret_file = optarg;
			break;
		case 'w':
			a->weights_path = optarg;
			break;
		case 'p':
			if (parse_int(optarg, 0, 65535, &v)) {
				fprintf(stderr, PROG ": --port must be 0..65535, not \"%s\"\n", optarg);
				return 2;
			}
			a->port = (int)v;
			break;
		case 'P':
			if (parse_int(optarg, -1, 65535, &v)) {
				fprintf(stderr, PROG ": --probe-port must be -1..65535, not \"%s\"\n", optarg);
				return 2;
			}
			o->probe_port = (int)v;
			break;
		case 'A':
			o->probe_addr = optarg;
			break;
		case 'S':
			a->listener = optarg;
			break;
		case 'b':
			if (!strcmp(optarg, "cuda")) {
				fprintf(stderr, PROG ": --backend cuda: this example computes on the CPU and reads the "
						"weights through host pointers; use --backend host\n");
				return 2;
			}
			if (strcmp(optarg, "host") != 0 && strcmp(optarg, "auto") != 0) {
				fprintf(stderr, PROG ": --backend must be host or auto, not \"%s\"\n", optarg);
				return 2;
			}
			break;
		case 'W':
			if (parse_duration("--waking-timeout", optarg, &o->waking_ms) || o->waking_ms == 0) {
				if (o->waking_ms == 0)
					fprintf(stderr, PROG ": --waking-timeout must be > 0\n");
				return 2;
			}
			break;
		case 'R':
			if (parse_duration("--remap-timeout", optarg, &o->remap_ms) || o->remap_ms == 0) {
				if (o->remap_ms == 0)
					fprintf(stderr, PROG ": --remap-timeout must be > 0\n");
				return 2;
			}
			break;
		case 'I':
			if (parse_duration("--init-timeout", optarg, &o->init_ms))
				return 2;
			break;
		case 'L':
			if (parse_duration("--lock-reconnect-timeout", optarg, &o->reconnect_ms))
				return 2;
			break;
		case 'D':
			if (parse_duration("--startup-deadline", optarg, &o->startup_ms))
				return 2;
			break;
		case 'k':
			if (parse_bytes(optarg, &o->kv_bytes)) {
				fprintf(stderr, PROG ": --kv-bytes: \"%s\" is not a size (e.g. 1048576, 64M, 2G)\n",
					optarg);
				return 2;
			}
			break;
		case 'o':
			o->write_path = optarg;
			break;
		case 'F':
			if (parse_int(optarg, 0, 99, &v)) {
				fprintf(stderr, PROG ": --wake-priority: \"%s\" is not 0..99\n", optarg);
				return 2;
			}
			o->wake_priority = (int)v;
			break;
		case 'N':
			if (parse_int(optarg, 1, 16, &v)) {
				fprintf(stderr, PROG ": --ranks must be 1..16, not \"%s\"\n", optarg);
				return 2;
			}
			o->nranks = (int)v;
			break;
		case 'G':
			if (o->ngpus == sizeof(o->gpus) / sizeof(o->gpus[0])) {
				fprintf(stderr, PROG ": at most 8 --gpu\n");
				return 2;
			}
			o->gpus[o->ngpus++] = optarg;
			break;
		case 'a':
			if (parse_bytes(optarg, &o->asleep_bytes)) {
				fprintf(stderr, PROG ": --asleep-bytes: \"%s\" is not a size (e.g. 1048576, 64M, 2G)\n",
					optarg);
				return 2;
			}
			break;
		case 'n':
			o->pinned = 1;
			break;
		case 'm':
			o->model = optarg;
			break;
		case 'h':
			usage(stdout);
			return EXIT_DONE;
		case 'V':
			printf(PROG " %s (libgpufailover %s)\n", GF_VERSION_STRING, gf_version());
			return EXIT_DONE;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, PROG ": unexpected argument \"%s\" (see --help)\n", argv[optind]);
		return 2;
	}
	if (o->write_path)
		return 0;
	if (!o->lock_uri || o->ngms == 0) {
		fprintf(stderr, PROG ": --lock and at least one --gms are required (see --help)\n");
		return 2;
	}
	if (o->nranks > 1 && o->nranks != o->ngms) {
		fprintf(stderr, PROG ": --ranks %d needs one --gms per rank (%d given)\n", o->nranks, o->ngms);
		return 2;
	}
	if (o->role == GF_ENGINE_FOLLOWER && a->weights_path) {
		fprintf(stderr, PROG ": --weights is for the loader; a follower imports the loader's weights\n");
		return 2;
	}
	if (o->lock_secret_file && secret_file_read(o->lock_secret_file, &o->lock_secret, &o->lock_secret_len) < 0) {
		fprintf(stderr, PROG ": --lock-secret-file %s: %s\n", o->lock_secret_file,
			errno == EINVAL ? "empty secret" : strerror(errno));
		return 2;
	}
	return 0;
}

/* --write-weights: the generated weights as a file. Exit status. */
static int write_weights(const char *path)
{
	struct model m;
	void *buf;
	char err[512];
	if (model_generate(&m, 4, 256, &buf)) {
		fprintf(stderr, PROG ": out of memory\n");
		return 1;
	}
	int rc = model_write(&m, path, err, sizeof(err));
	model_clear(&m);
	free(buf);
	if (rc) {
		fprintf(stderr, PROG ": %s\n", err);
		return 1;
	}
	logf_(GF_LOG_INFO, "event=weights_written path=%s", path);
	return 0;
}

/* Step 2 (loader): the source weights, so a bad file is reported before
 * connecting. 0 or 1 after a message. */
static int open_weights(struct app *a)
{
	if (a->weights_path) {
		if (gf_safetensors_open(&a->file, a->weights_path)) {
			fprintf(stderr, PROG ": bad weights file: %s\n", gf_error_detail());
			return 1;
		}
		if (model_from_safetensors(&a->src, a->file)) {
			fprintf(stderr, PROG ": out of memory\n");
			return 1;
		}
	} else if (model_generate(&a->src, 4, 256, &a->gen_buf)) {
		fprintf(stderr, PROG ": out of memory\n");
		return 1;
	}
	logf_(GF_LOG_INFO, "event=weights_source tensors=%zu source=%s", a->src.n,
	      a->weights_path ? a->weights_path : "generated");
	return 0;
}

/* Step 3: signals are taken by one thread; every thread made from here on
 * (probe server, watchers) inherits the blocked mask. 0 or 1. */
static int start_signal_thread(struct sigctx *sc)
{
	sigemptyset(&sc->set);
	sigaddset(&sc->set, SIGTERM);
	sigaddset(&sc->set, SIGINT);
	sigaddset(&sc->set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &sc->set, NULL);
	if (pipe2(sc->app->stop_pipe, O_CLOEXEC) < 0) {
		perror(PROG ": pipe");
		return 1;
	}
	int rc = gf_engine_new(&sc->app->engine);
	if (rc) {
		fprintf(stderr, PROG ": %s\n", gf_error_detail());
		return 1;
	}
	pthread_t tid;
	if (pthread_create(&tid, NULL, signal_thread, sc) != 0) {
		fprintf(stderr, PROG ": cannot start the signal thread\n");
		return 1;
	}
	pthread_detach(tid);
	return 0;
}

/* Step 4: the engine's settings from the command line. 0 or an error. */
static int configure(gf_engine *e, const struct opts *o, struct app *a)
{
	int rc = gf_engine_set_lock(e, o->lock_uri, a->id);
	if (!rc && o->lock_secret)
		rc = gf_engine_set_lock_secret(e, o->lock_secret, o->lock_secret_len);
	/* With ranks, this process is rank 0: device 0 only. */
	for (int i = 0; !rc && i < (o->nranks > 1 ? 1 : o->ngms); i++)
		rc = gf_engine_add_gms(e, o->gms[i]);
	if (!rc)
		rc = gf_engine_set_role(e, o->role);
	if (!rc)
		rc = gf_engine_set_backend(e, GF_MEM_HOST);
	if (!rc && o->waking_ms > 0)
		rc = gf_engine_set_waking_timeout(e, o->waking_ms);
	if (!rc && o->remap_ms > 0)
		rc = gf_engine_set_remap_timeout(e, o->remap_ms);
	if (!rc && o->init_ms >= 0)
		rc = gf_engine_set_init_timeout(e, o->init_ms);
	if (!rc)
		rc = gf_engine_set_lock_reconnect_timeout(e, o->reconnect_ms);
	if (!rc)
		rc = gf_engine_set_private_bytes(e, o->kv_bytes);
	if (!rc)
		rc = gf_engine_set_wake_priority(e, o->wake_priority);
	/* run() answers what waited through a failover, then settles. */
	if (!rc)
		rc = gf_engine_set_settle_deferred(e, 1);
	if (!rc && o->startup_ms > 0)
		rc = gf_engine_set_startup_deadline(e, o->startup_ms);
	if (!rc)
		rc = gf_engine_set_gpus(e, o->gpus, o->ngpus);
	if (!rc)
		rc = gf_engine_set_asleep_bytes(e, o->asleep_bytes);
	if (!rc)
		rc = gf_engine_set_pinned(e, o->pinned);
	if (!rc)
		rc = gf_engine_set_model(e, o->model);
	if (!rc)
		rc = gf_engine_set_probe_address(e, o->probe_addr, o->probe_port);
	if (!rc)
		rc = gf_engine_set_health_fn(e, healthy, a);
	if (!rc)
		rc = gf_engine_set_loss_fn(e, on_loss, a);
	if (!rc)
		rc = gf_engine_set_step_down_fn(e, on_step_down, a);
	return rc;
}

/* Step 5: the shadow loop until Active, then serve until stopped. Exit status. */
static int run(struct app *a)
{
	gf_engine *e = a->engine;
	struct gf_engine_callbacks cb = {
		.load_weights = load_weights,
		.weights_ready = weights_ready,
		.serve = serve_endpoint,
		.userdata = a,
	};
	int rc = gf_engine_run_shadow(e, &cb);
	int status = 0;
	if (rc == 0) {
		/* The connections that waited through the failover first: their
		 * answers are what the failover is measured by; the readiness
		 * report and the log lines after them (settling deferred). The
		 * oldest is answered before the rest of the backlog is taken. */
		if (a->listener && accept_pending(a, 1) > 0) {
			MHD_run(a->http);
			/* The client that answer woke may be queued on this CPU,
			 * and the scheduler does not always preempt us for it (a
			 * traced failover: 70 us): let it take the answer before
			 * the backlog and the settling work run. */
			sched_yield();
			if (accept_pending(a, 64) > 0)
				MHD_run(a->http);
		}
		gf_engine_settle(e);
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		if (a->serve_port < 0) {
			a->serve_port = a->port;
			if (a->lfd >= 0 && getsockname(a->lfd, (struct sockaddr *)&ss, &len) == 0 &&
			    (ss.ss_family == AF_INET || ss.ss_family == AF_INET6))
				a->serve_port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
									      : ((struct sockaddr_in6 *)&ss)->sin6_port);
		}
		logf_(GF_LOG_INFO, "event=endpoint_listening port=%d epoch=%" PRIu64, a->serve_port, gf_engine_epoch(e));
		struct gf_engine_metrics m;
		gf_engine_metrics(e, &m);
		logf_(GF_LOG_INFO, "event=active epoch=%" PRIu64 " lock_wait_us=%" PRId64 " remap_us=%" PRId64
		      " kv_us=%" PRId64 " serve_us=%" PRId64 " wake_total_us=%" PRId64, m.epoch, m.lock_wait_us,
		      m.remap_us, m.private_alloc_us, m.serve_us, m.wake_total_us);
		while (!serve_http(a, -1, true))
			;
		if (atomic_load(&a->stepping_down) && !atomic_load(&a->stopping) && !atomic_load(&a->lost))
			status = step_down(a);
	} else if (rc == GF_ERR_EVICTED) {
		/* Not a failure: the lock server made room on a GPU. */
		logf_(GF_LOG_WARN, "event=evicted status=%d detail=\"%s\"", GF_ENGINE_EXIT_EVICTED, gf_error_detail());
		status = GF_ENGINE_EXIT_EVICTED;
	} else if (atomic_load(&a->stopping)) {
		logf_(GF_LOG_INFO, "event=stopped_before_active state=%s",
		      gf_engine_state_name(gf_engine_state(e)));
	} else {
		logf_(GF_LOG_ERR, "event=failed state=%s err=%s detail=\"%s\"",
		      gf_engine_state_name(gf_engine_state(e)), gf_error_name(rc) ? gf_error_name(rc) : "?",
		      gf_error_detail());
		status = 1;
	}
	return atomic_load(&a->lost) ? 70 : status; /* 70: lost the lock or the GMS, or the startup deadline passed: the loss policy sent SIGTERM */
}

int main(int argc, char **argv)
{
	/* Static, not on main's stack: the detached signal thread reads both
	 * until the process ends, also while exit() runs after main returned. */
	static struct app a = { .port = 8080, .lfd = -1, .stop_pipe = { -1, -1 }, .sig_mu = PTHREAD_MUTEX_INITIALIZER };
	struct opts o = { .role = GF_ENGINE_LOADER, .probe_port = 8081, .waking_ms = -1, .remap_ms = -1,
			  .init_ms = -1, .reconnect_ms = -1, .startup_ms = -1, .kv_bytes = 16ull << 20 };
	int rc = parse_args(argc, argv, &a, &o);
	if (rc)
		return rc == EXIT_DONE ? 0 : rc;
	gf_set_log_fn(gf_log_stderr, (void *)PROG);
	if (o.write_path)
		return write_weights(o.write_path);
	char idbuf[64];
	if (!a.id) {
		snprintf(idbuf, sizeof(idbuf), "c-engine-%ld", (long)getpid());
		a.id = idbuf;
	}
	if (o.role == GF_ENGINE_LOADER && open_weights(&a))
		return 1;
	a.waking_ms = o.waking_ms;
	if (o.nranks > 1) {
		/* Forked before any thread exists. */
		int64_t init_ms = o.init_ms >= 0 ? o.init_ms
				  : o.role == GF_ENGINE_FOLLOWER ? GF_ENGINE_FOLLOWER_INIT_TIMEOUT_MS
								 : -1;
		const struct ranks_config rc_cfg = {
			.id = a.id,
			.role = o.role,
			.init_ms = init_ms,
			.remap_ms = o.remap_ms > 0 ? o.remap_ms : 30000,
			.waking_ms = o.waking_ms,
			.kv_bytes = o.kv_bytes,
			.load = load_weights,
			.load_ud = &a,
		};
		rc = ranks_start(&a.ranks, o.nranks, o.gms, &rc_cfg);
		if (rc) {
			fprintf(stderr, PROG ": %s\n", ranks_error());
			return 1;
		}
	}
	static struct sigctx sc = { .app = &a };
	if (start_signal_thread(&sc))
		return 1;
	if (a.ranks && ranks_watch(a.ranks, on_rank_death, &a)) {
		fprintf(stderr, PROG ": %s\n", ranks_error());
		return 1;
	}
	rc = configure(a.engine, &o, &a);
	/* The engine keeps its own copy. */
	if (o.lock_secret) {
		explicit_bzero(o.lock_secret, o.lock_secret_len);
		free(o.lock_secret);
		o.lock_secret = NULL;
	}
	if (rc) {
		fprintf(stderr, PROG ": %s\n", gf_error_detail());
		engine_release_signals(&a);
		gf_engine_free(a.engine);
		return 2;
	}
	/* Every rank is this engine's: the lock passes on once all have exited. */
	for (int i = 1; i < ranks_count(a.ranks); i++) {
		if (gf_engine_add_holder_pid(a.engine, ranks_pid(a.ranks, i)) < 0) {
			fprintf(stderr, PROG ": %s\n", gf_error_detail());
			gf_engine_free(a.engine);
			return 1;
		}
	}
	logf_(GF_LOG_INFO, "event=starting id=%s role=%s lock=%s devices=%d kv_bytes=%" PRIu64, a.id,
	      o.role == GF_ENGINE_LOADER ? "loader" : "follower", o.lock_uri, o.ngms, o.kv_bytes);
	if (a.listener) {
		/* The HTTP server, without a socket: serving only hands it what
		 * this thread accepts from the lock's listener. */
		a.http = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_NO_LISTEN_SOCKET, 0, NULL, NULL, handle_http, &a,
					  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
		if (!a.http) {
			logf_(GF_LOG_ERR, "event=http_failed msg=\"cannot start the HTTP server\"");
			engine_release_signals(&a);
			gf_engine_free(a.engine);
			return 1;
		}
	}
	if (o.probe_port >= 0) {
		rc = gf_engine_start_probe_server(a.engine);
		if (rc) {
			logf_(GF_LOG_ERR, "event=probe_failed detail=\"%s\"", gf_error_detail());
			engine_release_signals(&a);
			gf_engine_free(a.engine);
			return 1;
		}
		logf_(GF_LOG_INFO, "event=probe_listening port=%d", gf_engine_probe_port(a.engine));
	}
	int status = run(&a);
	ranks_free(a.ranks);
	if (a.lfd >= 0)
		close(a.lfd);
	if (a.http)
		MHD_stop_daemon(a.http);
	engine_release_signals(&a);
	gf_engine_free(a.engine);
	model_clear(&a.live);
	model_clear(&a.src);
	gf_safetensors_free(a.file);
	free(a.gen_buf);
	free(a.id_json);
	logf_(GF_LOG_INFO, "event=exit status=%d", status);
	return status;
}
