/* SPDX-License-Identifier: Apache-2.0 */
/* gf-supervise: runs engine processes under the supervisor's restart policy,
 * a thin main() around gf_supervisor_*. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <microhttpd.h>

#include "gf-config.h"
#include "gpufailover.h"
#if GF_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

static gf_supervisor *g_sv;

static void usage(FILE *f)
{
	fputs("usage: gf-supervise --config FILE [options]\n"
	      "\n"
	      "Starts the engines of FILE (JSON, see docs/supervisor.md), watches their\n"
	      "processes and /live probes, restarts them per the policy, and forces a\n"
	      "failover when a primary hangs (SIGTERM, SIGKILL, then lock revocation).\n"
	      "\n"
	      "  --config FILE        the engines and periods (required)\n"
	      "  --check-config       validate FILE, print the effective periods, exit\n"
	      "  --http ADDR:PORT     serve /status (JSON) and /metrics (Prometheus) here\n"
	      "  --help, --version\n"
	      "\n"
	      "Exit codes: 0 stopped by SIGTERM/SIGINT; 2 bad command line or config;\n"
	      "1 the supervisor itself failed. Logs: key=value lines on stderr.\n",
	      f);
}

static void on_signal(int sig)
{
	(void)sig;
	gf_supervisor_request_stop(g_sv);
}

static enum MHD_Result serve(void *cls, struct MHD_Connection *c, const char *url, const char *method,
			     const char *version, const char *upload, size_t *upload_len, void **ctx)
{
	(void)cls;
	(void)version;
	(void)upload;
	(void)upload_len;
	(void)ctx;
	char *body = NULL;
	const char *type = "text/plain; charset=utf-8";
	unsigned code = MHD_HTTP_OK;
	if (strcmp(method, "GET") != 0) {
		code = MHD_HTTP_METHOD_NOT_ALLOWED;
		body = strdup("GET only\n");
	} else if (strcmp(url, "/status") == 0 && gf_supervisor_status_json(g_sv, &body) == 0) {
		type = "application/json";
	} else if (strcmp(url, "/metrics") == 0 && gf_supervisor_metrics(g_sv, &body) == 0) {
		type = "text/plain; version=0.0.4; charset=utf-8";
	} else {
		code = MHD_HTTP_NOT_FOUND;
		body = strdup("not found: /status, /metrics\n");
	}
	if (!body)
		return MHD_NO;
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	MHD_add_response_header(r, "Content-Type", type);
	enum MHD_Result ret = MHD_queue_response(c, code, r);
	MHD_destroy_response(r);
	return ret;
}

static struct MHD_Daemon *start_http(const char *spec)
{
	char host[64];
	const char *colon = strrchr(spec, ':');
	char *end;
	long port = colon ? strtol(colon + 1, &end, 10) : -1;
	if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host) || *end || port < 0 || port > 65535) {
		fprintf(stderr, "gf-supervise: --http: expected ADDR:PORT, got \"%s\"\n", spec);
		exit(2);
	}
	memcpy(host, spec, (size_t)(colon - spec));
	host[colon - spec] = '\0';
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		fprintf(stderr, "gf-supervise: --http: \"%s\" is not an IPv4 address\n", host);
		exit(2);
	}
	/* Slow clients cost a connection each, never the supervisor's loop. */
	struct MHD_Daemon *d = MHD_start_daemon(
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, serve, NULL, MHD_OPTION_SOCK_ADDR,
		(struct sockaddr *)&sa, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)5, MHD_OPTION_CONNECTION_LIMIT,
		(unsigned)64, MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)16, MHD_OPTION_END);
	if (!d) {
		fprintf(stderr, "gf-supervise: --http %s: cannot listen: %s\n", spec, strerror(errno));
		exit(2);
	}
	return d;
}

int main(int argc, char **argv)
{
	enum { O_CONFIG = 1, O_CHECK, O_HTTP, O_HELP, O_VERSION };
	static const struct option opts[] = {
		{ "config", required_argument, NULL, O_CONFIG }, { "check-config", no_argument, NULL, O_CHECK },
		{ "http", required_argument, NULL, O_HTTP },     { "help", no_argument, NULL, O_HELP },
		{ "version", no_argument, NULL, O_VERSION },     { 0 },
	};
	const char *config = NULL, *http = NULL;
	int check = 0, opt;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case O_CONFIG: config = optarg; break;
		case O_CHECK: check = 1; break;
		case O_HTTP: http = optarg; break;
		case 'h':
		case O_HELP: usage(stdout); return 0;
		case O_VERSION: printf("gf-supervise %s\n", gf_version()); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "gf-supervise: unexpected argument \"%s\"\n", argv[optind]);
		return 2;
	}
	if (!config) {
		fprintf(stderr, "gf-supervise: --config FILE is required\n");
		return 2;
	}
	gf_set_log_fn(gf_log_stderr, (void *)"gf-supervise");
	if (gf_supervisor_new(&g_sv) < 0 || gf_supervisor_load_config(g_sv, config, NULL) < 0) {
		fprintf(stderr, "gf-supervise: %s\n", gf_error_detail());
		gf_supervisor_free(g_sv);
		return 2;
	}
	if (check) {
		printf("gf-supervise: %s: ok\n", config);
		gf_supervisor_free(g_sv);
		return 0;
	}
	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	struct MHD_Daemon *d = http ? start_http(http) : NULL;
	if (gf_supervisor_start(g_sv) < 0) {
		fprintf(stderr, "gf-supervise: %s\n", gf_error_detail());
		if (d)
			MHD_stop_daemon(d);
		gf_supervisor_free(g_sv);
		return 1;
	}
	fprintf(stderr, "gf-supervise: ready\n");
#if GF_HAVE_SYSTEMD
	sd_notify(0, "READY=1");
#endif
	int rc = gf_supervisor_run(g_sv);
#if GF_HAVE_SYSTEMD
	sd_notify(0, "STOPPING=1");
#endif
	if (rc < 0)
		fprintf(stderr, "gf-supervise: %s\n", gf_error_detail());
	if (d)
		MHD_stop_daemon(d);
	gf_supervisor_free(g_sv);
	return rc < 0 ? 1 : 0;
}
