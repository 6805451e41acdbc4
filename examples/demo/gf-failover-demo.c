/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The failover demo: gf-lockd, one gf-gmsd per device, a primary and a
 * shadow example engine, and a client sending inference requests without
 * pause, each on a new connection, to the one port the lock carries
 * (gf-lockd --listener): whoever holds the lock serves it, and connections
 * made while nobody does wait in its backlog. It SIGKILLs the primary (or,
 * with --gms-crash, the GMS: it comes back from its WARM snapshot, the
 * primary dies with its GMS connection and the shadow remaps the restored
 * layout), watches the shadow take over, checks that
 * every answer after the failover equals the one before, restarts the
 * killed engine as the new standby, prints a timeline and exits non-zero if
 * anything did not happen as it should. Every process it starts is reaped.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "gpufailover.h"

#define MAX_SEEDS 8
#define MAX_CHILDREN 16

struct child {
	pid_t pid;
	char name[32];
	char log[512];
};

static struct child children[MAX_CHILDREN];
static int nchildren;
static char rundir[256];
static volatile sig_atomic_t stop_requested;

struct options {
	const char *bindir;   /* where gf-lockd, gf-gmsd, gf-c-engine live (installed layout) */
	char lockd[512], gmsd[512], c_engine[512];
	const char *engine;   /* "c" | "python" | "torch" */
	const char *weights;
	const char *python_engine; /* path of examples/python-engine/engine.py */
	const char *torch_engine;  /* path of examples/torch-engine/engine.py */
	const char *backend;
	const char *json_path; /* timeline as JSON, for the benchmark report */
	int devices;
	bool short_mode;
	bool keep;
	bool gms_crash;       /* kill gf-gmsd instead of the primary; it restarts from WARM */
	int priority;         /* SCHED_FIFO priority of the failover's parties, 0: none */
};

static int64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fflush(stdout);
}

static struct child *spawn(const char *name, char *const argv[])
{
	if (nchildren == MAX_CHILDREN)
		return NULL;
	struct child *c = &children[nchildren];
	snprintf(c->name, sizeof(c->name), "%s", name);
	snprintf(c->log, sizeof(c->log), "%s/%s.log", rundir, name);
	int fd = open(c->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0)
		return NULL;
	pid_t pid = fork();
	if (pid < 0) {
		close(fd);
		return NULL;
	}
	if (pid == 0) {
		dup2(fd, 1);
		dup2(fd, 2);
		setenv("GF_LOG", "info", 0);
		execv(argv[0], argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(fd);
	c->pid = pid;
	nchildren++;
	return c;
}

/*
 * The failover's parties (the lock server's and the GMS's event loops, the
 * waking engine, the client) run under SCHED_FIFO @prio where permitted, so a
 * busy machine's ordinary work does not delay a hand-off by a wait for a CPU.
 * Reset on fork: threads they start get the ordinary policy. @pid 0: the
 * calling thread. false when not permitted (the demo then runs without).
 */
static bool prioritize(pid_t pid, int prio)
{
	struct sched_param p = { .sched_priority = prio };
	return prio > 0 && sched_setscheduler(pid, SCHED_FIFO | SCHED_RESET_ON_FORK, &p) == 0;
}

static void stop_child(struct child *c, int sig)
{
	if (c->pid <= 0)
		return;
	kill(c->pid, sig);
	for (int i = 0; i < 300; i++) { /* 3 s for a clean SIGTERM */
		if (waitpid(c->pid, NULL, WNOHANG) == c->pid) {
			c->pid = 0;
			return;
		}
		usleep(10000);
	}
	kill(c->pid, SIGKILL);
	waitpid(c->pid, NULL, 0);
	c->pid = 0;
}

static void dump_logs(void)
{
	for (int i = 0; i < nchildren; i++) {
		char cmd[700];
		say("---- last lines of %s ----\n", children[i].log);
		snprintf(cmd, sizeof(cmd), "tail -n 15 '%s'", children[i].log);
		if (system(cmd) != 0)
			say("(unreadable)\n");
	}
}

static void cleanup(const struct options *o, bool failed)
{
	for (int i = nchildren - 1; i >= 0; i--)
		stop_child(&children[i], SIGTERM);
	if (failed)
		dump_logs();
	if (!o->keep && rundir[0]) {
		char cmd[400];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rundir);
		if (system(cmd) != 0)
			fprintf(stderr, "demo: could not remove %s\n", rundir);
	}
}

static void on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

/* ---- HTTP ---- */

struct buf {
	char data[8192];
	size_t len;
	int64_t arrived_us; /* when the last bytes of the body came in */
};

static size_t collect(char *p, size_t sz, size_t n, void *ud)
{
	struct buf *b = ud;
	size_t k = sz * n;
	if (b->len + k >= sizeof(b->data))
		k = sizeof(b->data) - b->len - 1;
	memcpy(b->data + b->len, p, k);
	b->len += k;
	b->data[b->len] = '\0';
	b->arrived_us = now_us();
	return sz * n;
}

/* GET http://127.0.0.1:port/path → HTTP status (0 when nothing answered; *@cres says why). */
static long http_get_res(CURL *h, int port, const char *path, struct buf *out, long timeout_ms, CURLcode *cres)
{
	char url[256];
	long code = 0;
	snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
	out->len = 0;
	out->data[0] = '\0';
	out->arrived_us = 0;
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	*cres = curl_easy_perform(h);
	if (*cres != CURLE_OK)
		return 0;
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
	return code;
}

static long http_get(CURL *h, int port, const char *path, struct buf *out, long timeout_ms)
{
	CURLcode res;
	return http_get_res(h, port, path, out, timeout_ms, &res);
}

static char *engine_state(CURL *h, int probe_port)
{
	struct buf b;
	static char state[32];
	if (http_get(h, probe_port, "/state", &b, 500) != 200)
		return NULL;
	json_error_t e;
	json_t *j = json_loads(b.data, 0, &e);
	const char *s = j ? json_string_value(json_object_get(j, "state")) : NULL;
	snprintf(state, sizeof(state), "%s", s ? s : "?");
	json_decref(j);
	return state;
}

static bool wait_state(CURL *h, int probe_port, const char *want, int64_t timeout_ms)
{
	int64_t end = now_us() + timeout_ms * 1000;
	while (now_us() < end && !stop_requested) {
		const char *s = engine_state(h, probe_port);
		if (s && !strcasecmp(s, want))
			return true;
		usleep(20000);
	}
	return false;
}

/* ---- the client ---- */

struct engine_ports {
	int probe_port;
};

/* A request waiting in the listener's backlog through a failover must not time out. */
#define REQUEST_TIMEOUT_MS 30000

struct client {
	pthread_t thread;
	struct engine_ports eng[2];
	int serve_port; /* the lock's listener */
	volatile int stop;
	pthread_mutex_t mu;
	char reference[MAX_SEEDS][80]; /* checksum per seed before the failover */
	long ok_before, ok_after, mismatched;
	long refused;          /* connections refused (nobody listening) */
	long failed_in_flight; /* connected, then broken: the killed engine had accepted it */
	int64_t longest_wait_us; /* the slowest answered request, connection included */
	int64_t first_ok_after_us;
	char first_ok_engine[64];
	uint64_t epoch_before, epoch_after;
	/* --gms-crash: the primary keeps answering from its mapping until it notices
	 * its GMS is gone; only answers from this engine count as the failover's. */
	char after_from[64];
	long ok_old_primary;
	int priority;
	bool prioritized; /* the client thread got the priority */
};

static void *client_main(void *p)
{
	struct client *c = p;
	bool prio = prioritize(0, c->priority);
	pthread_mutex_lock(&c->mu);
	c->prioritized = prio;
	pthread_mutex_unlock(&c->mu);
	CURL *h = curl_easy_init();
	/* A new connection per request, as a client behind a load balancer makes. */
	curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
	curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, 1L);
	bool failed_last = false;
	for (long n = 0; !c->stop; n++) {
		int seed = (int)(n % MAX_SEEDS);
		char path[64];
		struct buf b;
		snprintf(path, sizeof(path), "/infer?seed=%d", seed);
		CURLcode res = CURLE_OK;
		int64_t t0 = now_us();
		long code = http_get_res(h, c->serve_port, path, &b, REQUEST_TIMEOUT_MS, &res);
		int64_t t_answered = now_us(), waited = t_answered - t0;
		json_t *j = NULL;
		const char *sum = NULL, *who = NULL;
		json_int_t epoch = 0;
		if (code == 200) {
			json_error_t e;
			j = json_loads(b.data, 0, &e);
			sum = j ? json_string_value(json_object_get(j, "checksum")) : NULL;
			who = j ? json_string_value(json_object_get(j, "engine")) : NULL;
			epoch = j ? json_integer_value(json_object_get(j, "epoch")) : 0;
		}
		pthread_mutex_lock(&c->mu);
		/* One port for both engines: the answer says who served it. Before
		 * means the primary's, after the standby's (it may answer before
		 * this process has even reaped the primary). */
		if (sum && waited > c->longest_wait_us)
			c->longest_wait_us = waited;
		if (!sum) {
			if (res == CURLE_COULDNT_CONNECT)
				c->refused++;
			else
				c->failed_in_flight++;
		} else if (who && !strcmp(who, "engine-a")) {
			if (!c->reference[seed][0])
				snprintf(c->reference[seed], sizeof(c->reference[seed]), "%s", sum);
			else if (strcmp(c->reference[seed], sum))
				c->mismatched++;
			c->ok_before++;
			c->epoch_before = (uint64_t)epoch;
		} else if (c->after_from[0] && who && strcmp(who, c->after_from)) {
			if (c->reference[seed][0] && strcmp(c->reference[seed], sum))
				c->mismatched++;
			c->ok_old_primary++;
		} else {
			if (!c->first_ok_after_us) {
				/* When the answer arrived, not when curl closed the
				 * connection or this thread got to count it. */
				c->first_ok_after_us = b.arrived_us ? b.arrived_us : t_answered;
				snprintf(c->first_ok_engine, sizeof(c->first_ok_engine), "%s", who ? who : "?");
				c->epoch_after = (uint64_t)epoch;
			}
			if (c->reference[seed][0] && strcmp(c->reference[seed], sum))
				c->mismatched++;
			c->ok_after++;
		}
		pthread_mutex_unlock(&c->mu);
		json_decref(j);
		/* Retry soon: a refused connection would show the gap. A request
		 * broken in flight (the killed engine had accepted it) is retried at
		 * once, as a client behind a load balancer would; only a second
		 * failure in a row waits. */
		if (!sum && (res == CURLE_COULDNT_CONNECT || failed_last))
			usleep(200);
		failed_last = !sum;
	}
	curl_easy_cleanup(h);
	return NULL;
}

/* Whether @log contains @what anywhere. */
static bool log_has(const char *log, const char *what)
{
	FILE *f = fopen(log, "r");
	char line[2048];
	bool found = false;
	while (f && !found && fgets(line, sizeof(line), f))
		found = strstr(line, what) != NULL;
	if (f)
		fclose(f);
	return found;
}

/* Wait until the GMS at @uri reports a Checkpointed snapshot operation. */
static bool wait_warm(const char *uri, int64_t timeout_ms)
{
	int64_t end = now_us() + timeout_ms * 1000;
	while (now_us() < end && !stop_requested) {
		char *text = NULL;
		if (gf_gms_status_json(uri, 500, &text) == 0) {
			json_t *st = json_loads(text, 0, NULL);
			const char *phase = json_string_value(json_object_get(json_object_get(st, "operation"), "phase"));
			bool done = phase && !strcmp(phase, "Checkpointed");
			json_decref(st);
			free(text);
			if (done)
				return true;
		}
		usleep(20000);
	}
	return false;
}

/* ---- timeline from the logs ---- */

/* mono_us of the first line in @log (at or after @after) containing all of @needles; 0 if none. */
static int64_t find_event(const char *log, int64_t after, const char *n1, const char *n2, char *line_out,
			  size_t line_len)
{
	FILE *f = fopen(log, "r");
	char line[2048];
	int64_t found = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		const char *m = strstr(line, "mono_us=");
		if (!m || !strstr(line, n1) || (n2 && !strstr(line, n2)))
			continue;
		int64_t t = strtoll(m + 8, NULL, 10);
		if (t < after)
			continue;
		found = t;
		if (line_out)
			snprintf(line_out, line_len, "%s", line);
		break;
	}
	fclose(f);
	return found;
}

static const char *field(const char *line, const char *key, char *out, size_t len)
{
	char k[64];
	snprintf(k, sizeof(k), " %s=", key);
	const char *p = strstr(line, k);
	out[0] = '\0';
	if (!p)
		return out;
	p += strlen(k);
	size_t i = 0;
	while (p[i] && p[i] != ' ' && p[i] != '\n' && i + 1 < len) {
		out[i] = p[i];
		i++;
	}
	out[i] = '\0';
	return out;
}

/* ---- main ---- */

static void usage(FILE *f)
{
	fputs("usage: gf-failover-demo [--engine c|python|torch] [--weights FILE.safetensors] [--devices N]\n"
	      "                        [--backend auto|host|cuda] [--short] [--keep] [--bindir DIR]\n"
	      "                        [--python-engine PATH] [--torch-engine PATH] [--lockd PATH] [--gmsd PATH]\n"
	      "                        [--c-engine PATH] [--json FILE] [--gms-crash] [--priority N]\n"
	      "Starts gf-lockd, gf-gmsd per device, a primary and a shadow engine and a client;\n"
	      "kills the primary and shows the failover. Exits non-zero if it did not go as it should.\n"
	      "--gms-crash: kill gf-gmsd during service instead; it restarts from its WARM snapshot\n"
	      "(docs/tiers.md) and the shadow serves the same answers without a reload.\n"
	      "--priority N: gf-lockd, gf-gmsd, the client and the waking C engine under SCHED_FIFO N,\n"
	      "the engines at nice -10, where permitted (default 0: all at the ordinary priority).\n",
	      f);
}

static int engine_argv(const struct options *o, char **argv, char *store, size_t storelen, const char *id,
		       const char *role, int probe_port)
{
	int n = 0;
	char *p = store;
#define ARG(...)                                                          \
	do {                                                              \
		int w = snprintf(p, storelen - (size_t)(p - store), __VA_ARGS__); \
		argv[n++] = p;                                            \
		p += w + 1;                                               \
	} while (0)
	if (!strcmp(o->engine, "python") || !strcmp(o->engine, "torch")) {
		ARG("/usr/bin/env");
		ARG("python3");
		ARG("%s", !strcmp(o->engine, "torch") ? o->torch_engine : o->python_engine);
	} else {
		ARG("%s", o->c_engine);
	}
	ARG("--lock");
	ARG("unix://%s/lock.sock", rundir);
	for (int d = 0; d < o->devices; d++) {
		ARG("--gms");
		ARG("unix://%s/gms%d.sock", rundir, d);
	}
	ARG("--role");
	ARG("%s", role);
	ARG("--id");
	ARG("%s", id);
	ARG("--listener");
	ARG("http");
	ARG("--probe-port");
	ARG("%d", probe_port);
	ARG("--backend");
	ARG("%s", o->backend);
	if (o->priority > 0 && !strcmp(o->engine, "c")) {
		ARG("--wake-priority");
		ARG("%d", o->priority);
	}
	if (o->weights && !strcmp(role, "loader")) { /* a follower imports the loader's weights */
		ARG("--weights");
		ARG("%s", o->weights);
	}
#undef ARG
	argv[n] = NULL;
	return n;
}

/*
 * A port below the usual ephemeral range (so no outgoing connection takes it
 * between now and its use), found free on every address: engines bind their
 * probe servers on 0.0.0.0. Starts at a per-process offset so parallel demos
 * do not race for the same one.
 */
static int pick_port(void)
{
	static int next;
	if (!next)
		next = 20000 + (int)(getpid() % 800) * 16;
	for (int tries = 0; tries < 12000; tries++) {
		int port = next++;
		if (next >= 32700)
			next = 20000;
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
					  .sin_addr.s_addr = htonl(INADDR_ANY) };
		bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		if (fd >= 0)
			close(fd);
		if (ok)
			return port;
	}
	return -1;
}

/* parse_args() result when --help or --version was answered: exit 0. */
#define EXIT_DONE (-1)

/* Apply one flag: 0, an exit code, or EXIT_DONE. */
static int apply_option(int opt, const char *arg, struct options *o)
{
	switch (opt) {
	case 'e':
		o->engine = arg;
		return 0;
	case 'w':
		o->weights = arg;
		return 0;
	case 'd':
		o->devices = atoi(arg);
		return 0;
	case 'b':
		o->backend = arg;
		return 0;
	case 's':
		o->short_mode = true;
		return 0;
	case 'k':
		o->keep = true;
		return 0;
	case 'B':
		o->bindir = arg;
		return 0;
	case 'P':
		o->python_engine = arg;
		return 0;
	case 'T':
		o->torch_engine = arg;
		return 0;
	case 'J':
		o->json_path = arg;
		return 0;
	case 'L':
		snprintf(o->lockd, sizeof(o->lockd), "%s", arg);
		return 0;
	case 'G':
		snprintf(o->gmsd, sizeof(o->gmsd), "%s", arg);
		return 0;
	case 'C':
		snprintf(o->c_engine, sizeof(o->c_engine), "%s", arg);
		return 0;
	case 'X':
		o->gms_crash = true;
		return 0;
	case 'R': {
		char *end;
		long v = strtol(arg, &end, 10);
		if (*arg == '\0' || *end != '\0' || v < 0 || v > 99) {
			fprintf(stderr, "demo: --priority: \"%s\" is not 0..99\n", arg);
			return 2;
		}
		o->priority = (int)v;
		return 0;
	}
	case 'h':
		usage(stdout);
		return EXIT_DONE;
	case 'V':
		printf("gf-failover-demo (libgpufailover) %s\n", gf_version());
		return EXIT_DONE;
	default:
		usage(stderr);
		return 2;
	}
}

/* Check the combination of options and fill in the program paths: 0 or an exit code. */
static int validate_options(struct options *o)
{
	if ((strcmp(o->engine, "c") && strcmp(o->engine, "python") && strcmp(o->engine, "torch")) || o->devices < 1 || o->devices > 8 ||
	    (strcmp(o->backend, "auto") && strcmp(o->backend, "host") && strcmp(o->backend, "cuda"))) {
		usage(stderr);
		return 2;
	}
	if (o->devices > 1 && !strcmp(o->backend, "host")) {
		fprintf(stderr, "demo: the host backend has one device; --devices N > 1 needs --backend cuda and N GPUs\n");
		return 2;
	}
	if (!o->bindir)
		o->bindir = GF_BINDIR;
	if (!o->lockd[0])
		snprintf(o->lockd, sizeof(o->lockd), "%s/gf-lockd", o->bindir);
	if (!o->gmsd[0])
		snprintf(o->gmsd, sizeof(o->gmsd), "%s/gf-gmsd", o->bindir);
	if (!o->c_engine[0])
		snprintf(o->c_engine, sizeof(o->c_engine), "%s/gf-c-engine", o->bindir);
	if (!strcmp(o->engine, "python") && !o->python_engine) {
		fprintf(stderr, "demo: --engine python needs --python-engine PATH\n");
		return 2;
	}
	if (!strcmp(o->engine, "torch") && !o->torch_engine) {
		fprintf(stderr, "demo: --engine torch needs --torch-engine PATH\n");
		return 2;
	}
	if (!strcmp(o->engine, "torch") && o->devices != 1) {
		fprintf(stderr, "demo: the torch engine computes on the CPU over one host GMS: --devices 1\n");
		return 2;
	}
	if (o->weights && access(o->weights, R_OK) != 0) {
		fprintf(stderr, "demo: cannot read weights file %s: %s\n", o->weights, strerror(errno));
		return 2;
	}
	return 0;
}

/* Parse argv into @o: 0, an exit code, or EXIT_DONE. */
static int parse_args(int argc, char **argv, struct options *o)
{
	static const struct option longopts[] = {
		{ "engine", required_argument, NULL, 'e' }, { "weights", required_argument, NULL, 'w' },
		{ "devices", required_argument, NULL, 'd' }, { "backend", required_argument, NULL, 'b' },
		{ "short", no_argument, NULL, 's' }, { "keep", no_argument, NULL, 'k' },
		{ "bindir", required_argument, NULL, 'B' }, { "python-engine", required_argument, NULL, 'P' },
		{ "json", required_argument, NULL, 'J' },
		{ "lockd", required_argument, NULL, 'L' }, { "gmsd", required_argument, NULL, 'G' },
		{ "c-engine", required_argument, NULL, 'C' }, { "torch-engine", required_argument, NULL, 'T' },
		{ "gms-crash", no_argument, NULL, 'X' }, { "priority", required_argument, NULL, 'R' },
		{ "help", no_argument, NULL, 'h' }, { "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	int opt;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		int rc = apply_option(opt, optarg, o);
		if (rc)
			return rc;
	}
	if (optind < argc) {
		usage(stderr);
		return 2;
	}
	return validate_options(o);
}

/* Everything the steps of one demo run share. */
struct demo {
	struct options o;
	CURL *h;
	struct client cl;
	char lock_uri[400];
	struct child *lockd, *gms0, *gms0b, *ea, *eb;
	char gms0_args[5][600]; /* to restart gf-gmsd 0 as it was started */
	bool prioritized;       /* --priority was permitted */
	int64_t kill_at, t_gms_spawn;
};

/* What the logs say happened after the kill (mono_us, 0: not logged). */
struct timeline {
	int64_t release, grant, remap, kv, serve, restored, lost;
	char epoch[64];
};

/* A failed check ends the run: the step reports it and returns false. */
#define CHECK(cond, ...)                                                                                               \
	do {                                                                                                           \
		if (!(cond)) {                                                                                         \
			say("FAIL: " __VA_ARGS__);                                                                     \
			say("\n");                                                                                     \
			return false;                                                                                  \
		}                                                                                                      \
	} while (0)

static bool start_lockd(struct demo *s)
{
	struct client *cl = &s->cl;
	cl->serve_port = pick_port();
	CHECK(cl->serve_port > 0, "no free TCP port");
	char a1[600], a2[600], a3[600], a4[128];
	snprintf(s->lock_uri, sizeof(s->lock_uri), "unix://%s/lock.sock", rundir);
	snprintf(a1, sizeof(a1), "%s", s->o.lockd);
	snprintf(a2, sizeof(a2), "--state-file=%s/lock.state", rundir);
	snprintf(a3, sizeof(a3), "--listen=%s", s->lock_uri);
	snprintf(a4, sizeof(a4), "--listener=http=tcp://127.0.0.1:%d", cl->serve_port);
	char *lockd_argv[] = { a1, a3, a2, a4, "--reconnect-window=2s", "--exit-wait-timeout=5s", NULL };
	s->lockd = spawn("gf-lockd", lockd_argv);
	CHECK(s->lockd, "could not start gf-lockd");
	s->prioritized = prioritize(s->lockd->pid, s->o.priority);
	int64_t end = now_us() + 10000000;
	while (gf_lock_ping(s->lock_uri, NULL, 0, 200) < 0 && now_us() < end)
		usleep(10000);
	CHECK(gf_lock_ping(s->lock_uri, NULL, 0, 500) == 0, "gf-lockd did not come up (see %s)", s->lockd->log);
	say("  lock server ready %s, carrying the listener http=127.0.0.1:%d\n", s->lock_uri, cl->serve_port);
	return true;
}

static bool start_gms(struct demo *s, int d)
{
	char gms_uri[400], g1[600], g2[600], g3[64], g4[64], g5[600], name[32];
	snprintf(gms_uri, sizeof(gms_uri), "unix://%s/gms%d.sock", rundir, d);
	snprintf(g1, sizeof(g1), "%s", s->o.gmsd);
	snprintf(g2, sizeof(g2), "--listen=%s", gms_uri);
	snprintf(g3, sizeof(g3), "--device=%d", d);
	snprintf(g4, sizeof(g4), "--backend=%s", s->o.backend);
	/* WARM lives in the run directory, on /dev/shm when there is one. */
	snprintf(g5, sizeof(g5), "--warm=%s/warm%d", rundir, d);
	snprintf(name, sizeof(name), "gf-gmsd-%d", d);
	char *gargv[] = { g1, g2, g3, g4, s->o.gms_crash ? g5 : NULL, NULL };
	struct child *g = spawn(name, gargv);
	CHECK(g, "could not start %s", name);
	prioritize(g->pid, s->o.priority);
	if (d == 0) {
		s->gms0 = g;
		memcpy(s->gms0_args[0], g1, sizeof(g1));
		memcpy(s->gms0_args[1], g2, sizeof(g2));
		snprintf(s->gms0_args[2], sizeof(s->gms0_args[2]), "%s", g3);
		snprintf(s->gms0_args[3], sizeof(s->gms0_args[3]), "%s", g4);
		memcpy(s->gms0_args[4], g5, sizeof(g5));
	}
	char *json = NULL;
	int64_t end = now_us() + 10000000;
	while (gf_gms_status_json(gms_uri, 200, &json) < 0 && now_us() < end)
		usleep(10000);
	CHECK(json, "gf-gmsd for device %d did not come up (see %s)", d, g->log);
	free(json);
	say("  GMS ready %s\n", gms_uri);
	return true;
}

static bool start_sidecars(struct demo *s)
{
	if (!start_lockd(s))
		return false;
	for (int d = 0; d < s->o.devices; d++)
		if (!start_gms(s, d))
			return false;
	return true;
}

/* Engines serve at nice ENGINE_NICE under --priority (where permitted): the
 * SCHED_FIFO of their wake ends at Active, and their first answers must not
 * then queue behind the machine's ordinary work. */
#define ENGINE_NICE (-10)

static struct child *spawn_engine(const struct demo *s, const char *name, const char *id, const char *role, int port)
{
	char *eargv[64], store[8192];
	engine_argv(&s->o, eargv, store, sizeof(store), id, role, port);
	struct child *c = spawn(name, eargv);
	/* Before the engine starts its threads, which inherit it. */
	if (c && s->o.priority > 0)
		setpriority(PRIO_PROCESS, (id_t)c->pid, ENGINE_NICE);
	return c;
}

static bool start_engines(struct demo *s)
{
	struct client *cl = &s->cl;
	for (int i = 0; i < 2; i++)
		cl->eng[i].probe_port = pick_port();
	/* The primary starts first so that it, not the shadow, takes the lock;
	 * engines started together work as well, but either may win. */
	s->ea = spawn_engine(s, "engine-a", "engine-a", "loader", cl->eng[0].probe_port);
	CHECK(s->ea, "could not start engine-a");
	CHECK(wait_state(s->h, cl->eng[0].probe_port, "active", 30000), "engine-a did not become Active (see %s)", s->ea->log);
	say("  engine-a Active (loaded the weights, holds the lock)\n");
	s->eb = spawn_engine(s, "engine-b", "engine-b", "follower", cl->eng[1].probe_port);
	CHECK(s->eb, "could not start engine-b");
	CHECK(wait_state(s->h, cl->eng[1].probe_port, "standby", 30000), "engine-b did not reach Standby (see %s)", s->eb->log);
	say("  engine-b Standby (imported the same weights, slept, waits on the lock)\n");
	return true;
}

static bool await_warm_snapshot(struct demo *s)
{
	char gms_uri[400];
	snprintf(gms_uri, sizeof(gms_uri), "unix://%s/gms0.sock", rundir);
	CHECK(wait_warm(gms_uri, 60000), "gf-gmsd did not write its WARM snapshot (see %s)", s->gms0->log);
	say("  GMS WARM snapshot %s/warm0 (Checkpointed)\n", rundir);
	return true;
}

static void start_client(struct demo *s)
{
	if (s->o.gms_crash)
		snprintf(s->cl.after_from, sizeof(s->cl.after_from), "engine-b");
	s->cl.priority = s->o.priority;
	pthread_create(&s->cl.thread, NULL, client_main, &s->cl);
	usleep(s->o.short_mode ? 300000 : 1500000);
}

/* SIGKILL the primary (or GMS 0, restarted at once); kill_at is the timeline's zero. */
static bool kill_victim(struct demo *s)
{
	struct client *cl = &s->cl;
	pthread_mutex_lock(&cl->mu);
	long before = cl->ok_before;
	s->kill_at = now_us();
	struct child *victim = s->o.gms_crash ? s->gms0 : s->ea;
	kill(victim->pid, SIGKILL);
	pthread_mutex_unlock(&cl->mu);
	waitpid(victim->pid, NULL, 0);
	victim->pid = 0;
	if (s->o.gms_crash) {
		/* Restart at once, as a supervisor would: it restores from WARM before it says ready. */
		char *gargv[] = { s->gms0_args[0], s->gms0_args[1], s->gms0_args[2], s->gms0_args[3], s->gms0_args[4], NULL };
		s->gms0b = spawn("gf-gmsd-0-restarted", gargv);
		s->t_gms_spawn = now_us();
		CHECK(s->gms0b, "could not restart gf-gmsd");
		prioritize(s->gms0b->pid, s->o.priority);
		say("\n== SIGKILL gf-gmsd after %ld good responses; restarted it with --warm\n", before);
	} else {
		say("\n== SIGKILL engine-a after %ld good responses\n", before);
	}
	return true;
}

/* Let the client run until engine-b has answered enough, then stop it. */
static bool await_takeover(struct demo *s)
{
	struct client *cl = &s->cl;
	int64_t end = now_us() + 30000000;
	for (;;) {
		pthread_mutex_lock(&cl->mu);
		bool done = cl->first_ok_after_us && cl->ok_after >= (s->o.short_mode ? 20 : 200);
		pthread_mutex_unlock(&cl->mu);
		if (done || now_us() > end || stop_requested)
			break;
		usleep(10000);
	}
	cl->stop = 1;
	pthread_join(cl->thread, NULL);
	CHECK(cl->first_ok_after_us, "engine-b never answered after the kill (see %s)", s->eb->log);
	return true;
}

/* The lock server's and engine-b's log lines carry mono_us. */
static void collect_timeline(const struct demo *s, struct timeline *tl)
{
	char line[2048];
	tl->release = find_event(s->lockd->log, s->kill_at, "released", NULL, line, sizeof(line));
	/* The line is written after the next grant is sent; it says when the exit was seen. */
	char seen[32];
	if (tl->release && *field(line, "seen_mono_us", seen, sizeof(seen)))
		tl->release = strtoll(seen, NULL, 10);
	tl->grant = find_event(s->lockd->log, s->kill_at, "granted", "engine-b", line, sizeof(line));
	if (tl->grant && *field(line, "send_mono_us", seen, sizeof(seen)))
		tl->grant = strtoll(seen, NULL, 10); /* the line, like the release's, is written after the send */
	tl->remap = find_event(s->eb->log, s->kill_at, "weights_remapped", NULL, NULL, 0);
	tl->kv = find_event(s->eb->log, s->kill_at, "kv_allocated", NULL, NULL, 0);
	tl->serve = find_event(s->eb->log, s->kill_at, "event=serving", NULL, NULL, 0);
	if (tl->grant)
		field(line, "epoch", tl->epoch, sizeof(tl->epoch));
	if (s->o.gms_crash) {
		tl->restored = find_event(s->gms0b->log, s->kill_at, "phase=Restored", NULL, NULL, 0);
		tl->lost = find_event(s->ea->log, s->kill_at, "engine_lost", NULL, NULL, 0);
	}
}

static void row(const char *label, int64_t t, int64_t kill_at)
{
	if (t)
		say("  %-34s %7lld us\n", label, (long long)(t - kill_at));
	else
		say("  %-34s %10s\n", label, "(not logged)");
}

static void print_report(const struct demo *s, const struct timeline *tl)
{
	const struct client *cl = &s->cl;
	int64_t k = s->kill_at;
	say("\n== timeline (from the kill, monotonic clock)\n");
	say("  %-34s %10s\n", s->o.gms_crash ? "gf-gmsd killed (SIGKILL)" : "primary killed (SIGKILL)", "0 us");
	if (s->o.gms_crash) {
		row("gf-gmsd restarted", s->t_gms_spawn, k);
		row("layout restored from WARM", tl->restored, k);
		row("engine-a saw its GMS lost", tl->lost, k);
	}
	row("lock released (holder exit seen)", tl->release, k);
	row("lock granted to engine-b", tl->grant, k);
	/* The engine allocates its KV memory while the GMS answers the wake, then remaps. */
	row("private (KV) memory allocated", tl->kv, k);
	row("weights remapped", tl->remap, k);
	row("serving", tl->serve, k);
	row("first response served", cl->first_ok_after_us, k);
	say("\n  epoch before %llu -> after %llu (%s)\n", (unsigned long long)cl->epoch_before,
	    (unsigned long long)cl->epoch_after, tl->epoch[0] ? "from the grant" : "from responses");
	say("  connections refused: %ld\n", cl->refused);
	say("  requests failed in flight (accepted by the killed engine): %ld\n", cl->failed_in_flight);
	say("  longest wait a client saw: %.1f ms\n", (double)cl->longest_wait_us / 1000.0);
	if (s->o.gms_crash)
		say("  answered by engine-a from its mapping before it saw the GMS lost: %ld\n", cl->ok_old_primary);
	say("  responses after failover: %ld, all identical to before: %s\n", cl->ok_after,
	    cl->mismatched ? "NO" : "yes");
	if (s->o.priority > 0)
		say("  SCHED_FIFO %d for the lock server, GMS, waking engine and client: %s\n", s->o.priority,
		    s->prioritized && cl->prioritized ? "yes" : "not permitted, ordinary priority");
}

/* The timeline as JSON, for the benchmark report. */
static void write_json(const struct demo *s, const struct timeline *tl)
{
	const struct client *cl = &s->cl;
	int64_t k = s->kill_at;
	json_t *j = json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "engine", s->o.engine,
			      "release_us", (json_int_t)(tl->release ? tl->release - k : -1),
			      "grant_us", (json_int_t)(tl->grant ? tl->grant - k : -1),
			      "remapped_us", (json_int_t)(tl->remap ? tl->remap - k : -1),
			      "kv_allocated_us", (json_int_t)(tl->kv ? tl->kv - k : -1),
			      "serving_us", (json_int_t)(tl->serve ? tl->serve - k : -1),
			      "first_response_us", (json_int_t)(cl->first_ok_after_us - k),
			      "refused", (json_int_t)cl->refused, "failed_in_flight", (json_int_t)cl->failed_in_flight,
			      "longest_wait_us", (json_int_t)cl->longest_wait_us, "mismatched", (json_int_t)cl->mismatched);
	if (!j || json_dump_file(j, s->o.json_path, JSON_COMPACT) != 0)
		say("demo: could not write %s\n", s->o.json_path);
	json_decref(j);
}

static bool check_failover(struct demo *s, const struct timeline *tl)
{
	const struct client *cl = &s->cl;
	CHECK(!strcmp(cl->first_ok_engine, "engine-b"), "the answer after the kill came from '%s'", cl->first_ok_engine);
	CHECK(cl->epoch_after > cl->epoch_before, "epoch did not increase (%llu -> %llu)",
	      (unsigned long long)cl->epoch_before, (unsigned long long)cl->epoch_after);
	CHECK(cl->mismatched == 0, "%ld responses differ from the ones before the failover", cl->mismatched);
	CHECK(cl->refused == 0, "%ld connections refused: the listener the lock carries should keep them", cl->refused);
	/* One client, one connection at a time: the killed engine had at most one of its requests. */
	CHECK(cl->failed_in_flight <= 1, "%ld requests failed in flight with one client", cl->failed_in_flight);
	CHECK(tl->grant && (!tl->release || tl->release <= tl->grant), "the lock server's log shows no grant to engine-b");
	if (s->o.gms_crash) {
		CHECK(tl->restored, "the restarted gf-gmsd did not restore from WARM (see %s)", s->gms0b->log);
		/* Nobody loaded: the layout came from the snapshot, not from the model files. */
		CHECK(!log_has(s->gms0b->log, "granted=RW"), "a writer loaded the weights again (see %s)", s->gms0b->log);
		say("  weights reloaded from the model files: no (restored from WARM, no writer since)\n");
		/* engine-a ends itself (its loss policy); reap it before restarting it. */
		int64_t until = now_us() + 20000000;
		while (s->ea->pid && waitpid(s->ea->pid, NULL, WNOHANG) == 0 && now_us() < until)
			usleep(10000);
		s->ea->pid = 0;
	}
	return true;
}

static bool report(struct demo *s)
{
	struct timeline tl = { 0 };
	collect_timeline(s, &tl);
	print_report(s, &tl);
	if (s->o.json_path)
		write_json(s, &tl);
	return check_failover(s, &tl);
}

/* The killed engine comes back as the new standby. */
static bool restart_engine(struct demo *s)
{
	int64_t t_restart = now_us();
	s->ea = spawn_engine(s, "engine-a-restarted", "engine-a", "loader", s->cl.eng[0].probe_port);
	CHECK(s->ea, "could not restart engine-a");
	CHECK(wait_state(s->h, s->cl.eng[0].probe_port, "standby", 30000),
	      "restarted engine-a did not reach Standby (see %s)", s->ea->log);
	say("\n== engine-a restarted and is the new standby after %lld ms\n", (long long)(now_us() - t_restart) / 1000);
	CHECK(wait_state(s->h, s->cl.eng[1].probe_port, "active", 1000), "engine-b is no longer Active");
	return true;
}

#undef CHECK

/* Every step in order; false after the first that failed. */
static bool run_demo(struct demo *s)
{
	if (!start_sidecars(s) || !start_engines(s))
		return false;
	if (s->o.gms_crash && !await_warm_snapshot(s))
		return false;
	start_client(s);
	return kill_victim(s) && await_takeover(s) && report(s) && restart_engine(s);
}

int main(int argc, char **argv)
{
	/* The example engines compute on the CPU over host pointers, so the GMS
	 * they share uses the host backend unless told otherwise. */
	struct demo s = { .o = { .engine = "c", .backend = "host", .devices = 1 },
			  .cl = { .mu = PTHREAD_MUTEX_INITIALIZER } };
	int rc = parse_args(argc, argv, &s.o);
	if (rc)
		return rc == EXIT_DONE ? 0 : rc;

	const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	snprintf(rundir, sizeof(rundir), "%s/gf-demo-XXXXXX", base);
	if (!mkdtemp(rundir)) {
		perror("demo: mkdtemp");
		return 1;
	}
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	s.h = curl_easy_init();
	say("== libgpufailover failover demo (engine: %s, devices: %d, run dir: %s)\n", s.o.engine, s.o.devices, rundir);

	bool ok = run_demo(&s);
	curl_easy_cleanup(s.h);
	cleanup(&s.o, !ok);
	curl_global_cleanup();
	if (!ok) {
		say("\nRESULT: FAILED\n");
		return 1;
	}
	say("\nRESULT: OK: failover happened, answers identical, every process cleaned up\n");
	return 0;
}
