/* SPDX-License-Identifier: Apache-2.0 */
/* gf-gmsd: the GPU memory service sidecar, one process per device. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>
#include <poll.h>

#include "gf-config.h"
#include "gpufailover.h"
#include "secret_file.h"
#include "sidecar_http.h"
#if GF_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

static void usage(FILE *f)
{
	fputs("usage: gf-gmsd --listen unix:///PATH [options]\n"
	      "\n"
	      "GPU memory service for one device: owns the weight allocations, lends them\n"
	      "to engines by file descriptor and runs the RW/RO lock.\n"
	      "\n"
	      "  --listen URI          unix:///path/to/gms.sock (required)\n"
	      "  --device INDEX|UUID   device index, or UUID (GPU-/MIG-... or a unique prefix); default 0\n"
	      "  --backend KIND        auto | cuda | host (default auto)\n"
	      "  --oom-retry DURATION  retry allocations failing with out-of-memory for this long\n"
	      "                        while the writer stays connected (e.g. 10s; default 0)\n"
	      "  --allow-uid UID       accept peers with this uid (repeatable; without it the\n"
	      "                        server's own uid and root are accepted, with it exactly\n"
	      "                        the listed uids)\n"
	      "  --handshake-timeout DURATION  drop peers that do not finish the handshake, or\n"
	      "                        a frame they began, in time (default 3s)\n"
	      "  --lock URI            fence the committed layout by this lock server: an RW\n"
	      "                        request that would drop it is granted only to the\n"
	      "                        lock's current holder, proven by its grant's fence\n"
	      "                        proof, and such a writer commits only while its grant\n"
	      "                        is current (recommended; docs/gms.md)\n"
	      "  --lock-secret-file PATH  the shared secret of a tcp:// lock server\n"
	      "  --metrics ADDR:PORT   serve /metrics (Prometheus) and /status (JSON) over HTTP\n"
	      "  --warm DIR            keep a WARM tier: every committed layout is snapshotted\n"
	      "                        to DIR (a tmpfs directory such as /dev/shm/gf-warm)\n"
	      "  --cold DIR            keep a COLD tier: ... and then to DIR on disk\n"
	      "  --restore DIR         at start, restore the snapshot in DIR (without it, with\n"
	      "                        --warm/--cold: from the best tier present, WARM before\n"
	      "                        COLD); a refused snapshot is logged and the GMS stays\n"
	      "                        EMPTY for the loader (docs/tiers.md)\n"
	      "  --min-resident DURATION  no demotion before the layout was HOT this long\n"
	      "                        (anti-thrash hysteresis; default 10m)\n"
	      "  --pin                 never demote the layout (gfctl gms demote is refused)\n"
	      "  --demote-below-free BYTES  demote (after --min-resident, when no engine holds\n"
	      "                        the lock) while free device memory is below BYTES\n"
	      "                        (e.g. 8G; K, M, G, T suffixes; needs --warm or --cold)\n"
	      "  --help, --version\n"
	      "\n"
	      "Logs key=value lines on stderr; prints msg=\"ready\" (and sd_notify READY=1)\n"
	      "once the socket accepts connections; SIGTERM/SIGINT stop it cleanly.\n",
	      f);
}

static const char *prog = "gf-gmsd";

static int fail(int rc, const char *what)
{
	fprintf(stderr, "gf-gmsd: %s: %s (%s)\n", what, gf_strerror(rc), gf_error_detail());
	return 1;
}

/* parse_args() result when --help or --version was answered: exit 0. */
#define EXIT_DONE (-1)

struct gmsd_opts {
	const char *listen_uri, *device, *lock_uri, *lock_secret_file, *metrics_addr;
	const char *warm, *cold, *restore;
	int kind;
	uint64_t oom_ms, handshake_ms, min_resident_ms, demote_below_free;
	bool pin;
	uint32_t uids[64];
	size_t nuids;
};

static int parse_backend(const char *arg, int *kind)
{
	if (!strcmp(arg, "auto"))
		*kind = GF_MEM_AUTO;
	else if (!strcmp(arg, "cuda"))
		*kind = GF_MEM_CUDA;
	else if (!strcmp(arg, "host"))
		*kind = GF_MEM_HOST;
	else {
		fprintf(stderr, "gf-gmsd: --backend must be auto, cuda or host, not '%s'\n", arg);
		return 2;
	}
	return 0;
}

/* A byte count (gf_parse_bytes: 512M, 8G, ...); 0 is refused (leave the flag out). */
static int parse_bytes(const char *opt, const char *text, uint64_t *out)
{
	if (gf_parse_bytes(text, out) < 0 || *out == 0) {
		fprintf(stderr, "gf-gmsd: %s: expected a positive size such as 1048576, 512M or 8G, got '%s'\n", opt, text);
		return 2;
	}
	return 0;
}

static int add_uid(const char *arg, struct gmsd_opts *o)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(arg, &end, 10);
	if (errno || !*arg || *end || v > UINT32_MAX || o->nuids == 64) {
		fprintf(stderr, "gf-gmsd: --allow-uid: bad uid '%s'\n", arg);
		return 2;
	}
	o->uids[o->nuids++] = (uint32_t)v;
	return 0;
}

/* Apply one flag: 0, an exit code, or EXIT_DONE. */
static int apply_option(int c, const char *arg, struct gmsd_opts *o)
{
	switch (c) {
	case 'l':
		o->listen_uri = arg;
		return 0;
	case 'd':
		o->device = arg;
		return 0;
	case 'b':
		return parse_backend(arg, &o->kind);
	case 'o':
		if (gf_parse_duration_ms(arg, &o->oom_ms) < 0) {
			fprintf(stderr, "gf-gmsd: --oom-retry: %s\n", gf_error_detail());
			return 2;
		}
		return 0;
	case 't':
		if (gf_parse_duration_ms(arg, &o->handshake_ms) < 0 || o->handshake_ms == 0 || o->handshake_ms > INT64_MAX) {
			fprintf(stderr, "gf-gmsd: --handshake-timeout: %s\n",
				o->handshake_ms == 0 ? "must be positive" : gf_error_detail());
			return 2;
		}
		return 0;
	case 'u':
		return add_uid(arg, o);
	case 'm':
		if (gf_parse_duration_ms(arg, &o->min_resident_ms) < 0 || o->min_resident_ms > INT64_MAX) {
			fprintf(stderr, "gf-gmsd: --min-resident: %s\n", gf_error_detail());
			return 2;
		}
		return 0;
	case 'p':
		o->pin = true;
		return 0;
	case 'F':
		return parse_bytes("--demote-below-free", arg, &o->demote_below_free);
	case 'L':
		o->lock_uri = arg;
		return 0;
	case 'M':
		o->metrics_addr = arg;
		return 0;
	case 'S':
		o->lock_secret_file = arg;
		return 0;
	case 'W':
	case 'C':
	case 'R':
		if (!*arg) {
			fprintf(stderr, "gf-gmsd: --%s needs a directory\n", c == 'W' ? "warm" : c == 'C' ? "cold" : "restore");
			return 2;
		}
		*(c == 'W' ? &o->warm : c == 'C' ? &o->cold : &o->restore) = arg;
		return 0;
	case 'h':
		usage(stdout);
		return EXIT_DONE;
	case 'V':
		printf("gf-gmsd (libgpufailover) %s\n", gf_version());
		return EXIT_DONE;
	default:
		usage(stderr);
		return 2;
	}
}

/* Parse argv into @o: 0, an exit code, or EXIT_DONE. */
static int parse_args(int argc, char **argv, struct gmsd_opts *o)
{
	static const struct option opts[] = {
		{"listen", required_argument, NULL, 'l'},  {"device", required_argument, NULL, 'd'},
		{"backend", required_argument, NULL, 'b'}, {"oom-retry", required_argument, NULL, 'o'},
		{"allow-uid", required_argument, NULL, 'u'}, {"handshake-timeout", required_argument, NULL, 't'},
		{"lock", required_argument, NULL, 'L'},    {"lock-secret-file", required_argument, NULL, 'S'},
		{"metrics", required_argument, NULL, 'M'},
		{"warm", required_argument, NULL, 'W'},    {"cold", required_argument, NULL, 'C'},
		{"restore", required_argument, NULL, 'R'}, {"min-resident", required_argument, NULL, 'm'},
		{"pin", no_argument, NULL, 'p'},           {"demote-below-free", required_argument, NULL, 'F'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},       {NULL, 0, NULL, 0},
	};
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		int rc = apply_option(c, optarg, o);
		if (rc)
			return rc;
	}
	if (optind < argc) {
		fprintf(stderr, "gf-gmsd: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (o->lock_secret_file && !o->lock_uri) {
		fprintf(stderr, "gf-gmsd: --lock-secret-file needs --lock\n");
		return 2;
	}
	if (o->demote_below_free && !o->warm && !o->cold) {
		fprintf(stderr, "gf-gmsd: --demote-below-free needs a tier to demote to (--warm or --cold)\n");
		return 2;
	}
	if (o->demote_below_free && o->pin) {
		fprintf(stderr, "gf-gmsd: --demote-below-free and --pin contradict each other\n");
		return 2;
	}
	if (!o->listen_uri) {
		fprintf(stderr, "gf-gmsd: --listen is required\n");
		usage(stderr);
		return 2;
	}
	return 0;
}

/* Signals arrive through a signalfd, so the loop never runs code in a handler. */
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
		fprintf(stderr, "gf-gmsd: signalfd: %s\n", strerror(errno));
	return sfd;
}

/* Fence by the lock server; the secret is wiped once the server holds its own copy. Exit code; frees @d on failure. */
static int configure_lock(gf_gmsd *d, const struct gmsd_opts *o)
{
	char *secret = NULL;
	size_t slen = 0;
	if (o->lock_secret_file && secret_file_read(o->lock_secret_file, &secret, &slen) < 0) {
		fprintf(stderr, "gf-gmsd: --lock-secret-file %s: %s\n", o->lock_secret_file,
			errno == EINVAL ? "empty secret" : strerror(errno));
		gf_gmsd_free(d);
		return 2;
	}
	int rc = gf_gmsd_set_lock(d, o->lock_uri, secret, slen);
	if (secret) {
		memset(secret, 0, slen);
		free(secret);
	}
	if (rc < 0) {
		gf_gmsd_free(d);
		return fail(rc, "--lock");
	}
	return 0;
}

/* Apply the options to @d: an exit code; frees @d on failure. */
static int configure(gf_gmsd *d, const struct gmsd_opts *o, int index)
{
	int rc;
	if ((rc = gf_gmsd_add_listen(d, o->listen_uri)) < 0 || (rc = gf_gmsd_set_device(d, index)) < 0 ||
	    (rc = gf_gmsd_set_backend(d, o->kind)) < 0 || (rc = gf_gmsd_set_oom_retry(d, (int64_t)o->oom_ms)) < 0 ||
	    (rc = gf_gmsd_set_handshake_timeout(d, (int64_t)o->handshake_ms)) < 0 ||
	    (rc = gf_gmsd_set_tiers(d, o->warm, o->cold)) < 0 ||
	    (rc = gf_gmsd_set_min_resident(d, (int64_t)o->min_resident_ms)) < 0 ||
	    (rc = gf_gmsd_set_pinned(d, o->pin)) < 0 ||
	    (rc = gf_gmsd_set_demote_below_free(d, o->demote_below_free)) < 0) {
		gf_gmsd_free(d);
		return fail(rc, "configuration");
	}
	for (size_t i = 0; i < o->nuids; i++)
		if ((rc = gf_gmsd_add_allow_uid(d, o->uids[i])) < 0) {
			gf_gmsd_free(d);
			return fail(rc, "--allow-uid");
		}
	return o->lock_uri ? configure_lock(d, o) : 0;
}

/* Before "ready": a restored layout is COMMITTED when clients are told to come. */
static void restore_tier(gf_gmsd *d, const struct gmsd_opts *o)
{
	if (!o->restore && !o->warm && !o->cold)
		return;
	int rc = gf_gmsd_restore(d, o->restore);
	if (rc < 0) {
		char line[512];
		snprintf(line, sizeof(line), "msg=\"%s\" error=%s detail=\"%s\"",
			 rc == GF_ERR_NOT_FOUND && !o->restore ? "no tier to restore from: waiting for the loader"
							       : "restore refused: staying EMPTY for the loader",
			 gf_error_name(rc), gf_error_detail());
		gf_log_stderr(rc == GF_ERR_NOT_FOUND && !o->restore ? GF_LOG_INFO : GF_LOG_WARN, "gms", line, (void *)prog);
	}
}

/* What gf-gmsd --metrics answers. */
static int http_metrics(void *d, char **text)
{
	return gf_gmsd_metrics(d, text);
}

static int http_status(void *d, char **json)
{
	return gf_gmsd_status_json(d, json);
}

static const struct sidecar_http_ops gmsd_http_ops = { http_metrics, http_status, NULL };

static void announce_ready(gf_gmsd *d, const struct gmsd_opts *o, int index, struct sidecar_http *http)
{
	char line[512], uuid[64] = "";
	if (http) {
		snprintf(line, sizeof(line), "msg=\"metrics listening\" address=%s port=%d", o->metrics_addr,
			 sidecar_http_port(http));
		gf_log_stderr(GF_LOG_INFO, "gms", line, (void *)prog);
	}
	gf_mem_device_uuid(gf_gmsd_mem(d), uuid, sizeof(uuid));
	snprintf(line, sizeof(line), "msg=\"ready\" listen=%s backend=%s device=%d uuid=%s pid=%d", o->listen_uri,
		 gf_mem_kind_name(gf_mem_kind(gf_gmsd_mem(d))), index, uuid, (int)getpid());
	gf_log_stderr(GF_LOG_INFO, "gms", line, (void *)prog);
#if GF_HAVE_SYSTEMD
	sd_notify(0, "READY=1");
#endif
}

/* Serve until a stop signal (0) or an error (negative gf error code). */
static int run_loop(gf_gmsd *d, int sfd, struct sidecar_http *http)
{
	struct pollfd p[3] = {{.fd = gf_gmsd_get_fd(d), .events = POLLIN}, {.fd = sfd, .events = POLLIN},
			      {.fd = http ? sidecar_http_fd(http) : -1, .events = POLLIN}};
	for (;;) {
		if (poll(p, 3, gf_gmsd_get_timeout_ms(d)) < 0 && errno != EINTR)
			return GF_ERR_IO;
		if (p[1].revents & POLLIN) {
			struct signalfd_siginfo si;
			if (read(sfd, &si, sizeof(si)) == sizeof(si)) {
				char line[512];
				snprintf(line, sizeof(line), "msg=\"stopping\" signal=%s", strsignal((int)si.ssi_signo));
				gf_log_stderr(GF_LOG_INFO, "gms", line, (void *)prog);
			}
			return 0;
		}
		int rc = gf_gmsd_process(d);
		if (rc < 0)
			return rc;
		if (http)
			sidecar_http_process(http);
	}
}

int main(int argc, char **argv)
{
	struct gmsd_opts o = { .device = "0", .kind = GF_MEM_AUTO, .handshake_ms = 3000, .min_resident_ms = 600000 };
	int rc = parse_args(argc, argv, &o);
	if (rc)
		return rc == EXIT_DONE ? 0 : rc;
	gf_set_log_fn(gf_log_stderr, (void *)prog);

	int index;
	int prc = gf_device_parse(o.kind, o.device, &index);
	if (prc < 0)
		return fail(prc, "--device");
	int sfd = block_stop_signals();
	if (sfd < 0)
		return 1;

	gf_gmsd *d;
	rc = gf_gmsd_new(&d);
	if (rc < 0)
		return fail(rc, "init");
	if ((rc = configure(d, &o, index)) != 0)
		return rc;
	if ((rc = gf_gmsd_start(d)) < 0) {
		gf_gmsd_free(d);
		return fail(rc, "start");
	}
	restore_tier(d, &o);
	struct sidecar_http *http = NULL;
	if (o.metrics_addr && sidecar_http_start(&http, prog, &gmsd_http_ops, d, o.metrics_addr) < 0) {
		gf_gmsd_free(d);
		return 2;
	}
	announce_ready(d, &o, index, http);
	rc = run_loop(d, sfd, http);
	sidecar_http_free(http);
#if GF_HAVE_SYSTEMD
	sd_notify(0, "STOPPING=1");
#endif
	gf_gmsd_free(d);
	close(sfd);
	if (rc < 0)
		return fail(rc, "serve");
	return 0;
}
