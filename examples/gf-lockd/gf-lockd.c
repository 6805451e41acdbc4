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
	      "                             are evicted (they exit 73); 0: no budget (default)\n"
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

static int read_secret(const char *path, char **out, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	char *buf = malloc(4097);
	ssize_t n = buf ? read(fd, buf, 4096) : -1;
	close(fd);
	if (n <= 0) {
		free(buf);
		errno = n == 0 ? EINVAL : errno;
		return -1;
	}
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	if (n == 0) {
		free(buf);
		errno = EINVAL;
		return -1;
	}
	*out = buf;
	*len = (size_t)n;
	return 0;
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

int main(int argc, char **argv)
{
	enum { O_LISTEN = 1, O_LISTENER, O_STATE, O_WINDOW, O_EXITWAIT, O_UID, O_SECRET, O_HB, O_DETECT, O_HS, O_HELP,
	       O_VERSION, O_MAXSTANDBY, O_MINAGE, O_METRICS };
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
	gf_set_log_fn(gf_log_stderr, (void *)"gf-lockd");
	gf_lockd *d;
	if (gf_lockd_new(&d) < 0)
		die_cfg("init");
	int64_t hb = 1000, detect = 6000, v;
	int nlisten = 0, opt;
	const char *metrics_addr = NULL;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case O_LISTEN:
			if (gf_lockd_add_listen(d, optarg) < 0)
				die_cfg("--listen");
			nlisten++;
			break;
		case O_LISTENER:
			add_listener(d, optarg);
			break;
		case O_STATE:
			if (gf_lockd_set_state_file(d, optarg) < 0)
				die_cfg("--state-file");
			break;
		case O_WINDOW:
			if (duration(optarg, &v) < 0 || gf_lockd_set_reconnect_window(d, v) < 0)
				die_cfg("--reconnect-window");
			break;
		case O_EXITWAIT:
			if (duration(optarg, &v) < 0 || gf_lockd_set_exit_wait_timeout(d, v) < 0)
				die_cfg("--exit-wait-timeout");
			break;
		case O_UID: {
			char *end;
			errno = 0;
			unsigned long u = strtoul(optarg, &end, 10);
			if (errno || *end || !*optarg || u > 0xffffffffUL) {
				fprintf(stderr, "gf-lockd: --allow-uid: '%s' is not a uid\n", optarg);
				return 2;
			}
			if (gf_lockd_add_allow_uid(d, (uint32_t)u) < 0)
				die_cfg("--allow-uid");
			break;
		}
		case O_SECRET: {
			char *s;
			size_t len;
			if (read_secret(optarg, &s, &len) < 0) {
				fprintf(stderr, "gf-lockd: --secret-file %s: %s\n", optarg,
					errno == EINVAL ? "empty secret" : strerror(errno));
				return 2;
			}
			gf_lockd_set_secret(d, s, len);
			memset(s, 0, len);
			free(s);
			break;
		}
		case O_HB:
			if (duration(optarg, &hb) < 0)
				die_cfg("--heartbeat");
			break;
		case O_DETECT:
			if (duration(optarg, &detect) < 0)
				die_cfg("--detect-timeout");
			break;
		case O_HS:
			if (duration(optarg, &v) < 0 || gf_lockd_set_handshake_timeout(d, v) < 0)
				die_cfg("--handshake-timeout");
			break;
		case O_MAXSTANDBY: {
			char *end;
			errno = 0;
			unsigned long n = strtoul(optarg, &end, 10);
			if (errno || *end || !*optarg || optarg[0] == '-' || n > 1000000) {
				fprintf(stderr, "gf-lockd: --max-standby-per-gpu: expected 0..1000000, got '%s'\n", optarg);
				return 2;
			}
			gf_lockd_set_max_standby_per_gpu(d, (uint32_t)n);
			break;
		}
		case O_MINAGE:
			if (duration(optarg, &v) < 0 || gf_lockd_set_min_standby_age(d, v) < 0)
				die_cfg("--min-standby-age");
			break;
		case O_METRICS:
			metrics_addr = optarg;
			break;
		case O_HELP:
			usage(stdout);
			gf_lockd_free(d);
			return 0;
		case O_VERSION:
			printf("gf-lockd (libgpufailover) %s\n", gf_version());
			gf_lockd_free(d);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "gf-lockd: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (nlisten == 0) {
		fprintf(stderr, "gf-lockd: --listen URI is required\n");
		usage(stderr);
		return 2;
	}
	if (gf_lockd_set_lease(d, hb, detect) < 0)
		die_cfg("--heartbeat/--detect-timeout");

	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0) {
		perror("gf-lockd: signalfd");
		return 1;
	}
	if (gf_lockd_start(d) < 0) {
		fprintf(stderr, "gf-lockd: %s\n", gf_error_detail());
		gf_lockd_free(d);
		return 1;
	}
	struct sidecar_http *http = NULL;
	if (metrics_addr && sidecar_http_start(&http, "gf-lockd", &lockd_http_ops, d, metrics_addr) < 0) {
		gf_lockd_free(d);
		return 2;
	}
	char line[256];
	if (http) {
		snprintf(line, sizeof(line), "msg=\"metrics listening\" address=%s port=%d", metrics_addr,
			 sidecar_http_port(http));
		gf_log_stderr(GF_LOG_INFO, "gf-lockd", line, (void *)"gf-lockd");
	}
	snprintf(line, sizeof(line), "msg=\"ready\" pid=%d listeners=%d", (int)getpid(), nlisten);
	gf_log_stderr(GF_LOG_INFO, "gf-lockd", line, (void *)"gf-lockd");
#if GF_HAVE_SYSTEMD
	sd_notify(0, "READY=1");
#endif
	int rc = 0;
	for (;;) {
		struct pollfd p[3] = { { .fd = gf_lockd_get_fd(d), .events = POLLIN },
				       { .fd = sfd, .events = POLLIN },
				       { .fd = http ? sidecar_http_fd(http) : -1, .events = POLLIN } };
		int timeout = gf_lockd_get_timeout_ms(d);
		if (http) {
			int ht = sidecar_http_timeout_ms(http);
			if (ht >= 0 && (timeout < 0 || ht < timeout))
				timeout = ht;
		}
		int n = poll(p, 3, timeout);
		if (n < 0 && errno != EINTR) {
			perror("gf-lockd: poll");
			rc = 1;
			break;
		}
		if (n > 0 && (p[1].revents & POLLIN)) {
			struct signalfd_siginfo si;
			if (read(sfd, &si, sizeof(si)) == sizeof(si)) {
				char sline[128];
				snprintf(sline, sizeof(sline), "msg=\"stopping\" signal=%s", sigabbrev_np((int)si.ssi_signo));
				gf_log_stderr(GF_LOG_INFO, "gf-lockd", sline, (void *)"gf-lockd");
				break;
			}
		}
		if (gf_lockd_process(d) < 0) {
			fprintf(stderr, "gf-lockd: %s\n", gf_error_detail());
			rc = 1;
			break;
		}
		if (http)
			sidecar_http_process(http);
	}
	sidecar_http_free(http);
#if GF_HAVE_SYSTEMD
	sd_notify(0, "STOPPING=1");
#endif
	gf_lockd_free(d);
	close(sfd);
	return rc;
}
