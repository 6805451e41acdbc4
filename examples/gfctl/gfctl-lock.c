/* SPDX-License-Identifier: Apache-2.0 */
/* gfctl lock: acquire (flock(1)-like), status, ping. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gfctl.h"
#include "gpufailover.h"

static void lock_usage(FILE *f)
{
	fputs("usage: gfctl lock acquire --lock URI --id ID [--timeout DUR] [--reconnect-timeout DUR]\n"
	      "                          [--secret-file PATH] [--heartbeat DUR --fence DUR] [-- CMD ARGS...]\n"
	      "       gfctl lock status  --lock URI [--json] [--timeout DUR] [--secret-file PATH]\n"
	      "       gfctl lock ping    --lock URI [--timeout DUR] [--secret-file PATH]\n"
	      "\n"
	      "acquire prints 'granted id=ID epoch=N' once the lock is held, then holds it until\n"
	      "killed (SIGTERM/SIGINT release it cleanly), or runs CMD while holding it and exits\n"
	      "with CMD's status. Exit codes: 3 timeout, 4 lock lost, 5 unreachable, 6 refused.\n",
	      f);
}

struct lock_opts {
	const char *uri, *id, *secret_file;
	int64_t timeout_ms, reconnect_ms, hb_ms, fence_ms;
	int json;
	char *secret;
	size_t secret_len;
};

static int parse_dur(const char *opt, const char *text, int64_t *out)
{
	uint64_t ms;
	if (gf_parse_duration_ms(text, &ms) < 0) {
		fprintf(stderr, "gfctl lock: %s: %s\n", opt, gf_error_detail());
		return -1;
	}
	*out = (int64_t)ms;
	return 0;
}

static int load_secret(struct lock_opts *o)
{
	if (!o->secret_file)
		return 0;
	int fd = open(o->secret_file, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "gfctl lock: --secret-file %s: %s\n", o->secret_file, strerror(errno));
		return -1;
	}
	o->secret = malloc(4097);
	ssize_t n = o->secret ? read(fd, o->secret, 4096) : -1;
	close(fd);
	while (n > 0 && (o->secret[n - 1] == '\n' || o->secret[n - 1] == '\r'))
		n--;
	if (n <= 0) {
		fprintf(stderr, "gfctl lock: --secret-file %s: empty or unreadable\n", o->secret_file);
		return -1;
	}
	o->secret_len = (size_t)n;
	return 0;
}

/* Parses options up to "--"; returns the index of the first argument after it (or argc), -1 on error. */
static int parse_opts(int argc, char **argv, struct lock_opts *o)
{
	enum { O_LOCK = 1, O_ID, O_TIMEOUT, O_RECONNECT, O_SECRET, O_HB, O_FENCE, O_JSON, O_HELP };
	static const struct option opts[] = {
		{ "lock", required_argument, NULL, O_LOCK },
		{ "id", required_argument, NULL, O_ID },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "reconnect-timeout", required_argument, NULL, O_RECONNECT },
		{ "secret-file", required_argument, NULL, O_SECRET },
		{ "heartbeat", required_argument, NULL, O_HB },
		{ "fence", required_argument, NULL, O_FENCE },
		{ "json", no_argument, NULL, O_JSON },
		{ "help", no_argument, NULL, O_HELP },
		{ 0 },
	};
	int opt;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
		switch (opt) {
		case O_LOCK:
			o->uri = optarg;
			break;
		case O_ID:
			o->id = optarg;
			break;
		case O_TIMEOUT:
			if (parse_dur("--timeout", optarg, &o->timeout_ms) < 0)
				return -1;
			break;
		case O_RECONNECT:
			if (parse_dur("--reconnect-timeout", optarg, &o->reconnect_ms) < 0)
				return -1;
			break;
		case O_SECRET:
			o->secret_file = optarg;
			break;
		case O_HB:
			if (parse_dur("--heartbeat", optarg, &o->hb_ms) < 0)
				return -1;
			break;
		case O_FENCE:
			if (parse_dur("--fence", optarg, &o->fence_ms) < 0)
				return -1;
			break;
		case O_JSON:
			o->json = 1;
			break;
		case O_HELP:
			lock_usage(stdout);
			exit(0);
		default:
			lock_usage(stderr);
			return -1;
		}
	}
	if (!o->uri) {
		fprintf(stderr, "gfctl lock: --lock URI is required\n");
		return -1;
	}
	if (load_secret(o) < 0)
		return -1;
	return optind;
}

static int fail(const char *what, int rc)
{
	fprintf(stderr, "gfctl lock %s: %s (%s)\n", what, gf_error_detail(), gf_error_name(rc) ? gf_error_name(rc) : "?");
	return gfctl_exit_code(rc);
}

static int exit_status(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return GFCTL_EXIT_FAILURE;
}

static int cmd_acquire(struct lock_opts *o, char **cmd)
{
	if (!o->id) {
		fprintf(stderr, "gfctl lock acquire: --id ID is required\n");
		return GFCTL_EXIT_USAGE;
	}
	/* Reconnects and losses are worth seeing on stderr; routine lines are not. */
	gf_set_log_fn(gf_log_stderr, (void *)"gfctl");
	gf_set_log_level(GF_LOG_WARN);
	gf_lock *lock;
	int rc = gf_lock_new(&lock, o->uri, o->id);
	if (rc < 0)
		return fail("acquire", rc);
	if (o->reconnect_ms >= 0)
		gf_lock_set_reconnect_timeout(lock, o->reconnect_ms);
	if (o->secret)
		gf_lock_set_secret(lock, o->secret, o->secret_len);
	if (o->hb_ms > 0 || o->fence_ms > 0) {
		if ((rc = gf_lock_set_lease(lock, o->hb_ms > 0 ? o->hb_ms : 1000, o->fence_ms > 0 ? o->fence_ms : 3000)) < 0)
			return fail("acquire", rc);
	}
	/* Signals arrive through a signalfd; SIGTERM/SIGINT during the wait
	 * abandon it (the default action would too, but this also covers a
	 * handler-less parent that ignores them). */
	sigset_t mask, old;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGCHLD);
	sigprocmask(SIG_BLOCK, &mask, &old);
	signal(SIGPIPE, SIG_IGN);
	int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);

	struct gf_lock_grant g;
	/* Unblock termination while waiting so a killed waiter just dies. */
	sigprocmask(SIG_SETMASK, &old, NULL);
	rc = gf_lock_acquire(lock, o->timeout_ms, &g);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	if (rc < 0) {
		int code = fail("acquire", rc);
		gf_lock_free(lock);
		return code;
	}
	printf("granted id=%s epoch=%llu\n", o->id, (unsigned long long)g.epoch);
	fflush(stdout);

	pid_t child = -1;
	if (cmd && cmd[0]) {
		child = fork();
		if (child < 0) {
			perror("gfctl lock acquire: fork");
			gf_lock_release(lock);
			gf_lock_free(lock);
			return GFCTL_EXIT_FAILURE;
		}
		if (child == 0) {
			/* The lock's socket was closed in this child by the library's
			 * atfork handler; CMD never holds the lock itself. */
			sigprocmask(SIG_SETMASK, &old, NULL);
			signal(SIGPIPE, SIG_DFL);
			execvp(cmd[0], cmd);
			fprintf(stderr, "gfctl lock acquire: exec %s: %s\n", cmd[0], strerror(errno));
			_exit(127);
		}
	}
	int code = GFCTL_OK;
	for (;;) {
		struct pollfd p[2] = { { .fd = gf_lock_get_fd(lock), .events = (short)gf_lock_get_events(lock) },
				       { .fd = sfd, .events = POLLIN } };
		int n = poll(p, 2, gf_lock_get_timeout_ms(lock));
		if (n < 0 && errno != EINTR)
			break;
		if (n > 0 && (p[1].revents & POLLIN)) {
			struct signalfd_siginfo si;
			bool done = false;
			while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
				if (si.ssi_signo == SIGCHLD && child > 0) {
					int status;
					if (waitpid(child, &status, WNOHANG) == child) {
						code = exit_status(status);
						done = true;
					}
				} else if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
					if (child > 0)
						kill(child, (int)si.ssi_signo);
					else
						done = true;
				}
			}
			if (done) {
				gf_lock_release(lock);
				break;
			}
		}
		if (gf_lock_process(lock) == GF_ERR_LOCK_LOST) {
			fprintf(stderr, "gfctl lock acquire: %s\n", gf_error_detail());
			if (child > 0) {
				kill(child, SIGTERM);
				waitpid(child, NULL, 0);
			}
			code = GFCTL_EXIT_LOCK_LOST;
			break;
		}
	}
	gf_lock_free(lock);
	close(sfd);
	return code;
}

static int cmd_status(struct lock_opts *o)
{
	char *json;
	int rc = gf_lock_status_json(o->uri, o->secret, o->secret_len, o->timeout_ms >= 0 ? o->timeout_ms : 5000, &json);
	if (rc < 0)
		return fail("status", rc);
	if (o->json) {
		printf("%s\n", json);
	} else {
		/* The JSON is flat enough to show field by field. */
		const char *keys[] = { "holder", "epoch", "holder_pid", "waiter_count", "reconnect_window",
				       "reconnect_window_left_ms", "previous_holder", "exit_wait", "uptime_ms", "connections",
				       "fd_limit", "accept_paused", "refused_no_pidfd", "waiters" };
		for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
			char pat[64];
			snprintf(pat, sizeof(pat), "\"%s\":", keys[i]);
			const char *p = strstr(json, pat);
			if (!p)
				continue;
			p += strlen(pat);
			int depth = 0;
			const char *e = p;
			for (; *e; e++) {
				if (*e == '[' || *e == '{')
					depth++;
				else if (*e == ']' || *e == '}') {
					if (depth == 0)
						break;
					depth--;
				} else if (*e == ',' && depth == 0)
					break;
			}
			printf("%-26s %.*s\n", keys[i], (int)(e - p), p);
		}
	}
	free(json);
	return GFCTL_OK;
}

static int cmd_ping(struct lock_opts *o)
{
	int rc = gf_lock_ping(o->uri, o->secret, o->secret_len, o->timeout_ms >= 0 ? o->timeout_ms : 5000);
	if (rc < 0)
		return fail("ping", rc);
	printf("ok\n");
	return GFCTL_OK;
}

int gfctl_lock(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		lock_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? GFCTL_EXIT_USAGE : GFCTL_OK;
	}
	const char *sub = argv[1];
	struct lock_opts o = { .timeout_ms = -1, .reconnect_ms = -1 };
	int rest = parse_opts(argc - 1, argv + 1, &o);
	int code;
	if (rest < 0)
		return GFCTL_EXIT_USAGE;
	char **extra = argv + 1 + rest;
	int nextra = argc - 1 - rest;
	if (!strcmp(sub, "acquire")) {
		code = cmd_acquire(&o, nextra > 0 ? extra : NULL);
	} else if (nextra > 0) {
		fprintf(stderr, "gfctl lock %s: unexpected argument '%s'\n", sub, extra[0]);
		code = GFCTL_EXIT_USAGE;
	} else if (!strcmp(sub, "status")) {
		code = cmd_status(&o);
	} else if (!strcmp(sub, "ping")) {
		code = cmd_ping(&o);
	} else {
		fprintf(stderr, "gfctl lock: unknown command '%s'\n", sub);
		lock_usage(stderr);
		code = GFCTL_EXIT_USAGE;
	}
	free(o.secret);
	return code;
}
