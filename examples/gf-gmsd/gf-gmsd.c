/* SPDX-License-Identifier: Apache-2.0 */
/* gf-gmsd: the GPU memory service sidecar, one process per device. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>
#include <poll.h>

#include "gf-config.h"
#include "gpufailover.h"
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
	      "                        lock's current holder (recommended; docs/gms.md)\n"
	      "  --lock-secret-file PATH  the shared secret of a tcp:// lock server\n"
	      "  --metrics ADDR:PORT   serve /metrics (Prometheus) and /status (JSON) over HTTP\n"
	      "  --warm DIR            keep a WARM tier: every committed layout is snapshotted\n"
	      "                        to DIR (a tmpfs directory such as /dev/shm/gf-warm)\n"
	      "  --cold DIR            keep a COLD tier: ... and then to DIR on disk\n"
	      "  --restore DIR         at start, restore the snapshot in DIR (without it, with\n"
	      "                        --warm/--cold: from the best tier present, WARM before\n"
	      "                        COLD); a refused snapshot is logged and the GMS stays\n"
	      "                        EMPTY for the loader (docs/tiers.md)\n"
	      "  --help, --version\n"
	      "\n"
	      "Logs key=value lines on stderr; prints msg=\"ready\" (and sd_notify READY=1)\n"
	      "once the socket accepts connections; SIGTERM/SIGINT stop it cleanly.\n",
	      f);
}

static const char *prog = "gf-gmsd";

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

static int fail(int rc, const char *what)
{
	fprintf(stderr, "gf-gmsd: %s: %s (%s)\n", what, gf_strerror(rc), gf_error_detail());
	return 1;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"listen", required_argument, NULL, 'l'},  {"device", required_argument, NULL, 'd'},
		{"backend", required_argument, NULL, 'b'}, {"oom-retry", required_argument, NULL, 'o'},
		{"allow-uid", required_argument, NULL, 'u'}, {"handshake-timeout", required_argument, NULL, 't'},
		{"lock", required_argument, NULL, 'L'},    {"lock-secret-file", required_argument, NULL, 'S'},
		{"metrics", required_argument, NULL, 'M'},
		{"warm", required_argument, NULL, 'W'},    {"cold", required_argument, NULL, 'C'},
		{"restore", required_argument, NULL, 'R'}, {"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},       {NULL, 0, NULL, 0},
	};
	const char *listen_uri = NULL, *device = "0", *lock_uri = NULL, *lock_secret_file = NULL;
	const char *warm = NULL, *cold = NULL, *restore = NULL, *metrics_addr = NULL;
	int kind = GF_MEM_AUTO;
	uint64_t oom_ms = 0, handshake_ms = 3000;
	uint32_t uids[64];
	size_t nuids = 0;
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			listen_uri = optarg;
			break;
		case 'd':
			device = optarg;
			break;
		case 'b':
			if (!strcmp(optarg, "auto"))
				kind = GF_MEM_AUTO;
			else if (!strcmp(optarg, "cuda"))
				kind = GF_MEM_CUDA;
			else if (!strcmp(optarg, "host"))
				kind = GF_MEM_HOST;
			else {
				fprintf(stderr, "gf-gmsd: --backend must be auto, cuda or host, not '%s'\n", optarg);
				return 2;
			}
			break;
		case 'o':
			if (gf_parse_duration_ms(optarg, &oom_ms) < 0) {
				fprintf(stderr, "gf-gmsd: --oom-retry: %s\n", gf_error_detail());
				return 2;
			}
			break;
		case 't':
			if (gf_parse_duration_ms(optarg, &handshake_ms) < 0 || handshake_ms == 0 || handshake_ms > INT64_MAX) {
				fprintf(stderr, "gf-gmsd: --handshake-timeout: %s\n",
					handshake_ms == 0 ? "must be positive" : gf_error_detail());
				return 2;
			}
			break;
		case 'u': {
			char *end;
			errno = 0;
			unsigned long v = strtoul(optarg, &end, 10);
			if (errno || !*optarg || *end || v > UINT32_MAX || nuids == 64) {
				fprintf(stderr, "gf-gmsd: --allow-uid: bad uid '%s'\n", optarg);
				return 2;
			}
			uids[nuids++] = (uint32_t)v;
			break;
		}
		case 'L':
			lock_uri = optarg;
			break;
		case 'M':
			metrics_addr = optarg;
			break;
		case 'S':
			lock_secret_file = optarg;
			break;
		case 'W':
		case 'C':
		case 'R':
			if (!*optarg) {
				fprintf(stderr, "gf-gmsd: --%s needs a directory\n", c == 'W' ? "warm" : c == 'C' ? "cold" : "restore");
				return 2;
			}
			*(c == 'W' ? &warm : c == 'C' ? &cold : &restore) = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("gf-gmsd (libgpufailover) %s\n", gf_version());
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "gf-gmsd: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (lock_secret_file && !lock_uri) {
		fprintf(stderr, "gf-gmsd: --lock-secret-file needs --lock\n");
		return 2;
	}
	if (!listen_uri) {
		fprintf(stderr, "gf-gmsd: --listen is required\n");
		usage(stderr);
		return 2;
	}
	gf_set_log_fn(gf_log_stderr, (void *)prog);

	int index;
	int prc = gf_device_parse(kind, device, &index);
	if (prc < 0)
		return fail(prc, "--device");

	/* Signals arrive through a signalfd, so the loop never runs code in a handler. */
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0) {
		fprintf(stderr, "gf-gmsd: signalfd: %s\n", strerror(errno));
		return 1;
	}

	gf_gmsd *d;
	int rc = gf_gmsd_new(&d);
	if (rc < 0)
		return fail(rc, "init");
	if ((rc = gf_gmsd_add_listen(d, listen_uri)) < 0 || (rc = gf_gmsd_set_device(d, index)) < 0 ||
	    (rc = gf_gmsd_set_backend(d, kind)) < 0 || (rc = gf_gmsd_set_oom_retry(d, (int64_t)oom_ms)) < 0 ||
	    (rc = gf_gmsd_set_handshake_timeout(d, (int64_t)handshake_ms)) < 0 ||
	    (rc = gf_gmsd_set_tiers(d, warm, cold)) < 0) {
		gf_gmsd_free(d);
		return fail(rc, "configuration");
	}
	for (size_t i = 0; i < nuids; i++)
		if ((rc = gf_gmsd_add_allow_uid(d, uids[i])) < 0) {
			gf_gmsd_free(d);
			return fail(rc, "--allow-uid");
		}
	if (lock_uri) {
		char secret[4097];
		size_t slen = 0;
		if (lock_secret_file) {
			FILE *f = fopen(lock_secret_file, "re");
			slen = f ? fread(secret, 1, sizeof(secret) - 1, f) : 0;
			if (f)
				fclose(f);
			while (slen && (secret[slen - 1] == '\n' || secret[slen - 1] == '\r'))
				slen--;
			if (!slen) {
				fprintf(stderr, "gf-gmsd: --lock-secret-file %s: empty or unreadable\n", lock_secret_file);
				gf_gmsd_free(d);
				return 2;
			}
		}
		rc = gf_gmsd_set_lock(d, lock_uri, slen ? secret : NULL, slen);
		memset(secret, 0, sizeof(secret));
		if (rc < 0) {
			gf_gmsd_free(d);
			return fail(rc, "--lock");
		}
	}
	if ((rc = gf_gmsd_start(d)) < 0) {
		gf_gmsd_free(d);
		return fail(rc, "start");
	}
	char line[512];
	/* Before "ready": a restored layout is COMMITTED when clients are told to come. */
	if (restore || warm || cold) {
		rc = gf_gmsd_restore(d, restore);
		if (rc < 0) {
			snprintf(line, sizeof(line), "msg=\"%s\" error=%s detail=\"%s\"",
				 rc == GF_ERR_NOT_FOUND && !restore ? "no tier to restore from: waiting for the loader"
								    : "restore refused: staying EMPTY for the loader",
				 gf_error_name(rc), gf_error_detail());
			gf_log_stderr(rc == GF_ERR_NOT_FOUND && !restore ? GF_LOG_INFO : GF_LOG_WARN, "gms", line, (void *)prog);
		}
	}
	struct sidecar_http *http = NULL;
	if (metrics_addr && sidecar_http_start(&http, prog, &gmsd_http_ops, d, metrics_addr) < 0) {
		gf_gmsd_free(d);
		return 2;
	}
	if (http) {
		snprintf(line, sizeof(line), "msg=\"metrics listening\" address=%s port=%d", metrics_addr,
			 sidecar_http_port(http));
		gf_log_stderr(GF_LOG_INFO, "gms", line, (void *)prog);
	}
	char uuid[64] = "";
	gf_mem_device_uuid(gf_gmsd_mem(d), uuid, sizeof(uuid));
	snprintf(line, sizeof(line), "msg=\"ready\" listen=%s backend=%s device=%d uuid=%s pid=%d", listen_uri,
		 gf_mem_kind_name(gf_mem_kind(gf_gmsd_mem(d))), index, uuid, (int)getpid());
	gf_log_stderr(GF_LOG_INFO, "gms", line, (void *)prog);
#if GF_HAVE_SYSTEMD
	sd_notify(0, "READY=1");
#endif
	struct pollfd p[3] = {{.fd = gf_gmsd_get_fd(d), .events = POLLIN}, {.fd = sfd, .events = POLLIN},
			      {.fd = http ? sidecar_http_fd(http) : -1, .events = POLLIN}};
	for (;;) {
		int timeout = gf_gmsd_get_timeout_ms(d);
		if (http) {
			int ht = sidecar_http_timeout_ms(http);
			if (ht >= 0 && (timeout < 0 || ht < timeout))
				timeout = ht;
		}
		if (poll(p, 3, timeout) < 0 && errno != EINTR) {
			rc = GF_ERR_IO;
			break;
		}
		if (p[1].revents & POLLIN) {
			struct signalfd_siginfo si;
			if (read(sfd, &si, sizeof(si)) == sizeof(si)) {
				snprintf(line, sizeof(line), "msg=\"stopping\" signal=%s", strsignal((int)si.ssi_signo));
				gf_log_stderr(GF_LOG_INFO, "gms", line, (void *)prog);
			}
			rc = 0;
			break;
		}
		if ((rc = gf_gmsd_process(d)) < 0)
			break;
		rc = 0;
		if (http)
			sidecar_http_process(http);
	}
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
