/* SPDX-License-Identifier: Apache-2.0 */
/* gf-lockd: the lock server sidecar, a thin main() around gf_lockd_*. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "gf-config.h"
#include "gpufailover.h"
#include "secret_file.h"
#include "sidecar_http.h"
#if GF_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

static void usage(FILE *f)
{
	fputs("usage: gf-lockd --listen URI [options]\n"
	      "\n"
	      "The lock server: the connection is the lock; grants carry fencing epochs.\n"
	      "\n"
	      "  --listen URI               unix:///path/lock.sock or tcp://host:port (repeatable)\n"
	      "  --listener NAME=URI        a listening socket (tcp://host:port or unix:///path) that the\n"
	      "                             lock carries: passed to every holder with its grant, so no\n"
	      "                             connection is refused during a failover (repeatable). Under\n"
	      "                             systemd socket activation, an inherited socket named NAME\n"
	      "                             (FileDescriptorName=) is used instead of binding URI\n"
	      "  --state-file PATH          persist grants here (put it on tmpfs); strongly advised\n"
	      "  --reconnect-window DUR     after a restart, keep the lock for the holder on record (default 10s)\n"
	      "  --exit-wait-timeout DUR    wait this long for a released holder's process to exit (default 10s)\n"
	      "  --allow-uid UID            allow unix peers with this uid (repeatable; default: the\n"
	      "                             server's own uid and root; given: exactly the listed uids)\n"
	      "  --secret-file PATH         shared secret (mandatory with tcp://; trailing newline ignored)\n"
	      "  --heartbeat DUR            TCP heartbeat interval (default 1s)\n"
	      "  --detect-timeout DUR       TCP T_detect: re-grant after this silence (default 6s, >= 3 heartbeats)\n"
	      "  --handshake-timeout DUR    drop peers that do not finish the handshake, or a frame\n"
	      "                             they began, in time (default 3s)\n"
	      "  --max-standby-per-gpu N    standby budget: when a standby registers and one of its GPUs\n"
	      "                             has more than N, the least recently Active standbys there\n"
	      "                             are evicted (they exit 73); 0: no budget (default). Counts\n"
	      "                             only standbys that declared GPUs (host backend: --gpu)\n"
	      "  --min-standby-age DUR      never evict a standby registered less than DUR ago (default 0)\n"
	      "  --metrics ADDR:PORT        serve GET /metrics (Prometheus), /status (JSON) and\n"
	      "                             /ready?gpu=UUID&model=NAME over HTTP (IPv4; port 0: any)\n"
	      "  --help, --version\n"
	      "\n"
	      "Durations: 250ms, 10s, 2m. Logs: key=value lines on stderr.\n",
	      f);
}

/*
 * sd_listen_fds(3) without libsystemd: the fd systemd passed under @name
 * (LISTEN_FDS fds from 3, LISTEN_FDNAMES colon-separated), or -1. Only for
 * this process (LISTEN_PID), so a child never mistakes its parent's fds.
 */
static int inherited_fd(const char *name)
{
	const char *pid = getenv("LISTEN_PID"), *nfds = getenv("LISTEN_FDS"), *names = getenv("LISTEN_FDNAMES");
	if (!pid || !nfds || !names || strtol(pid, NULL, 10) != (long)getpid())
		return -1;
	long n = strtol(nfds, NULL, 10);
	size_t len = strlen(name);
	const char *p = names;
	for (long i = 0; i < n && p; i++) {
		const char *end = strchr(p, ':');
		size_t l = end ? (size_t)(end - p) : strlen(p);
		if (l == len && !strncmp(p, name, len))
			return 3 + (int)i;
		p = end ? end + 1 : NULL;
	}
	return -1;
}

static void add_listener(gf_lockd *d, const char *arg)
{
	const char *eq = strchr(arg, '=');
	char name[64];
	if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof(name)) {
		fprintf(stderr, "gf-lockd: --listener: expected NAME=URI (NAME 1..63 characters), got '%s'\n", arg);
		exit(2);
	}
	snprintf(name, sizeof(name), "%.*s", (int)(eq - arg), arg);
	int fd = inherited_fd(name);
	if ((fd >= 0 ? gf_lockd_add_listener_fd(d, name, fd) : gf_lockd_add_listener(d, name, eq + 1)) < 0) {
		fprintf(stderr, "gf-lockd: --listener %s: %s\n", arg, gf_error_detail());
		exit(2);
	}
}


/* Parse a duration flag; on failure the detail is left for die_cfg(). */
static int duration(const char *text, int64_t *out)
{
	uint64_t ms;
	if (gf_parse_duration_ms(text, &ms) < 0)
		return -1;
	*out = (int64_t)ms;
	return 0;
}

static void die_cfg(const char *what)
{
	fprintf(stderr, "gf-lockd: %s: %s\n", what, gf_error_detail());
	exit(2);
}

/* parse_args() result when --help or --version was answered: exit 0. */
#define EXIT_DONE (-1)

/* What the flags set that is not applied to the server as it is parsed. */
struct lockd_opts {
	int64_t hb, detect;
	int nlisten;
	const char *metrics_addr;
};

enum { O_LISTEN = 1, O_LISTENER, O_STATE, O_WINDOW, O_EXITWAIT, O_UID, O_SECRET, O_HB, O_DETECT, O_HS, O_HELP,
       O_VERSION, O_MAXSTANDBY, O_MINAGE, O_METRICS };

static int allow_uid(gf_lockd *d, const char *arg)
{
	char *end;
	errno = 0;
	unsigned long u = strtoul(arg, &end, 10);
	if (errno || *end || !*arg || u > 0xffffffffUL) {
		fprintf(stderr, "gf-lockd: --allow-uid: '%s' is not a uid\n", arg);
		return 2;
	}
	if (gf_lockd_add_allow_uid(d, (uint32_t)u) < 0)
		die_cfg("--allow-uid");
	return 0;
}

/* The secret is wiped from this copy as soon as the server holds its own. */
static int set_secret(gf_lockd *d, const char *path)
{
	char *s;
	size_t len;
	if (secret_file_read(path, &s, &len) < 0) {
		fprintf(stderr, "gf-lockd: --secret-file %s: %s\n", path, errno == EINVAL ? "empty secret" : strerror(errno));
		return 2;
	}
	gf_lockd_set_secret(d, s, len);
	memset(s, 0, len);
	free(s);
	return 0;
}

static int max_standby(gf_lockd *d, const char *arg)
{
	char *end;
	errno = 0;
	unsigned long n = strtoul(arg, &end, 10);
	if (errno || *end || !*arg || arg[0] == '-' || n > 1000000) {
		fprintf(stderr, "gf-lockd: --max-standby-per-gpu: expected 0..1000000, got '%s'\n", arg);
		return 2;
	}
	gf_lockd_set_max_standby_per_gpu(d, (uint32_t)n);
	return 0;
}

/* Apply one flag: 0, an exit code, or EXIT_DONE. */
static int apply_option(gf_lockd *d, int opt, const char *arg, struct lockd_opts *o)
{
	int64_t v;
	switch (opt) {
	case O_LISTEN:
		if (gf_lockd_add_listen(d, arg) < 0)
			die_cfg("--listen");
		o->nlisten++;
		return 0;
	case O_LISTENER:
		add_listener(d, arg);
		return 0;
	case O_STATE:
		if (gf_lockd_set_state_file(d, arg) < 0)
			die_cfg("--state-file");
		return 0;
	case O_WINDOW:
		if (duration(arg, &v) < 0 || gf_lockd_set_reconnect_window(d, v) < 0)
			die_cfg("--reconnect-window");
		return 0;
	case O_EXITWAIT:
		if (duration(arg, &v) < 0 || gf_lockd_set_exit_wait_timeout(d, v) < 0)
			die_cfg("--exit-wait-timeout");
		return 0;
	case O_UID:
		return allow_uid(d, arg);
	case O_SECRET:
		return set_secret(d, arg);
	case O_HB:
		if (duration(arg, &o->hb) < 0)
			die_cfg("--heartbeat");
		return 0;
	case O_DETECT:
		if (duration(arg, &o->detect) < 0)
			die_cfg("--detect-timeout");
		return 0;
	case O_HS:
		if (duration(arg, &v) < 0 || gf_lockd_set_handshake_timeout(d, v) < 0)
			die_cfg("--handshake-timeout");
		return 0;
	case O_MAXSTANDBY:
		return max_standby(d, arg);
	case O_MINAGE:
		if (duration(arg, &v) < 0 || gf_lockd_set_min_standby_age(d, v) < 0)
			die_cfg("--min-standby-age");
		return 0;
	case O_METRICS:
		o->metrics_addr = arg;
		return 0;
	case O_HELP:
		usage(stdout);
		return EXIT_DONE;
	case O_VERSION:
		printf("gf-lockd (libgpufailover) %s\n", gf_version());
		return EXIT_DONE;
	default:
		usage(stderr);
		return 2;
	}
}

/* Parse argv into @d and @o: 0, an exit code, or EXIT_DONE. */
static int parse_args(int argc, char **argv, gf_lockd *d, struct lockd_opts *o)
{
	static const struct option opts[] = {
		{ "listen", required_argument, NULL, O_LISTEN },
		{ "listener", required_argument, NULL, O_LISTENER },
		{ "state-file", required_argument, NULL, O_STATE },
		{ "reconnect-window", required_argument, NULL, O_WINDOW },
		{ "exit-wait-timeout", required_argument, NULL, O_EXITWAIT },
		{ "allow-uid", required_argument, NULL, O_UID },
		{ "secret-file", required_argument, NULL, O_SECRET },
		{ "heartbeat", required_argument, NULL, O_HB },
		{ "detect-timeout", required_argument, NULL, O_DETECT },
		{ "handshake-timeout", required_argument, NULL, O_HS },
		{ "max-standby-per-gpu", required_argument, NULL, O_MAXSTANDBY },
		{ "min-standby-age", required_argument, NULL, O_MINAGE },
		{ "metrics", required_argument, NULL, O_METRICS },
		{ "help", no_argument, NULL, O_HELP },
		{ "version", no_argument, NULL, O_VERSION },
		{ 0 },
	};
	int opt;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		int rc = apply_option(d, opt, optarg, o);
		if (rc)
			return rc;
	}
	if (optind < argc) {
		fprintf(stderr, "gf-lockd: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (o->nlisten == 0) {
		fprintf(stderr, "gf-lockd: --listen URI is required\n");
		usage(stderr);
		return 2;
	}
	if (gf_lockd_set_lease(d, o->hb, o->detect) < 0)
		die_cfg("--heartbeat/--detect-timeout");
	return 0;
}

/* SIGTERM/SIGINT arrive on the returned signalfd so the loop stops cleanly; -1 on failure. */
static int block_stop_signals(void)
{
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0)
		perror("gf-lockd: signalfd");
	return sfd;
}

static void log_info(const char *line)
{
	gf_log_stderr(GF_LOG_INFO, "gf-lockd", line, (void *)"gf-lockd");
}

/* What gf-lockd --metrics answers. */
static int http_metrics(void *d, char **text)
{
	return gf_lockd_metrics(d, text);
}

static int http_status(void *d, char **json)
{
	return gf_lockd_status_json(d, json);
}

static int http_ready(void *d, const char *const *gpus, size_t ngpus, const char *model, char **json)
{
	return gf_lockd_ready_json(d, gpus, ngpus, model, json);
}

static const struct sidecar_http_ops lockd_http_ops = { http_metrics, http_status, http_ready };

/* Log the metrics address and readiness, and tell systemd. */
static void announce_ready(const struct lockd_opts *o, struct sidecar_http *http)
{
	char line[256];
	if (http) {
		snprintf(line, sizeof(line), "msg=\"metrics listening\" address=%s port=%d", o->metrics_addr,
			 sidecar_http_port(http));
		log_info(line);
	}
	snprintf(line, sizeof(line), "msg=\"ready\" pid=%d listeners=%d", (int)getpid(), o->nlisten);
	log_info(line);
#if GF_HAVE_SYSTEMD
	sd_notify(0, "READY=1");
#endif
}

/* Serve until a stop signal (0) or a fatal error (1). */
static int run_loop(gf_lockd *d, int sfd, struct sidecar_http *http)
{
	for (;;) {
		struct pollfd p[3] = { { .fd = gf_lockd_get_fd(d), .events = POLLIN },
				       { .fd = sfd, .events = POLLIN },
				       { .fd = http ? sidecar_http_fd(http) : -1, .events = POLLIN } };
		int n = poll(p, 3, gf_lockd_get_timeout_ms(d));
		if (n < 0 && errno != EINTR) {
			perror("gf-lockd: poll");
			return 1;
		}
		if (n > 0 && (p[1].revents & POLLIN)) {
			struct signalfd_siginfo si;
			if (read(sfd, &si, sizeof(si)) == sizeof(si)) {
				char sline[128];
				snprintf(sline, sizeof(sline), "msg=\"stopping\" signal=%s", sigabbrev_np((int)si.ssi_signo));
				log_info(sline);
				return 0;
			}
		}
		if (gf_lockd_process(d) < 0) {
			fprintf(stderr, "gf-lockd: %s\n", gf_error_detail());
			return 1;
		}
		if (http)
			sidecar_http_process(http);
	}
}

int main(int argc, char **argv)
{
	gf_set_log_fn(gf_log_stderr, (void *)"gf-lockd");
	/* Static: a bad option exits from inside the parser (die_cfg) with the
	 * server still allocated, and must not read as a leak. */
	static gf_lockd *d;
	if (gf_lockd_new(&d) < 0)
		die_cfg("init");
	struct lockd_opts o = { .hb = 1000, .detect = 6000 };
	int rc = parse_args(argc, argv, d, &o);
	if (rc) {
		gf_lockd_free(d);
		return rc == EXIT_DONE ? 0 : rc;
	}
	int sfd = block_stop_signals();
	if (sfd < 0)
		return 1;
	if (gf_lockd_start(d) < 0) {
		fprintf(stderr, "gf-lockd: %s\n", gf_error_detail());
		gf_lockd_free(d);
		return 1;
	}
	struct sidecar_http *http = NULL;
	if (o.metrics_addr && sidecar_http_start(&http, "gf-lockd", &lockd_http_ops, d, o.metrics_addr) < 0) {
		gf_lockd_free(d);
		return 2;
	}
	announce_ready(&o, http);
	rc = run_loop(d, sfd, http);
	sidecar_http_free(http);
#if GF_HAVE_SYSTEMD
	sd_notify(0, "STOPPING=1");
#endif
	gf_lockd_free(d);
	close(sfd);
	return rc;
}
