/* SPDX-License-Identifier: Apache-2.0 */
/* gfctl lock: acquire (flock(1)-like), status, ping. */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gfctl.h"
#include "secret_file.h"
#include "gpufailover.h"

struct lock_opts {
	const char *uri, *id, *secret_file;
	int64_t timeout_ms, reconnect_ms, hb_ms, fence_ms;
	int json;
	uint64_t epoch;
	char *secret;
	size_t secret_len;
	/* the standby pool: what acquire declares, what ready asks */
	const char *gpus[9];
	size_t ngpus;
	uint64_t wake_bytes, asleep_bytes;
	int pinned;
	const char *model;
};

/* A byte count (gf_parse_bytes: 512M, 2G, ...). */
static int parse_size(const char *cmd, const char *opt, const char *text, uint64_t *out)
{
	if (gf_parse_bytes(text, out) < 0) {
		fprintf(stderr, "gfctl lock %s: %s: expected a size such as 1048576, 512M or 2G, got '%s'\n", cmd, opt,
			text);
		return -1;
	}
	return 0;
}

static int load_secret(struct lock_opts *o)
{
	if (!o->secret_file)
		return 0;
	if (secret_file_read(o->secret_file, &o->secret, &o->secret_len) < 0) {
		fprintf(stderr, "gfctl lock: --secret-file %s: %s\n", o->secret_file,
			errno == EINVAL ? "empty secret" : strerror(errno));
		return -1;
	}
	return 0;
}

/* The options of the lock commands (bits of the allowed masks below). */
enum { O_LOCK = 1, O_ID, O_TIMEOUT, O_RECONNECT, O_SECRET, O_HB, O_FENCE, O_JSON, O_EPOCH, O_GPU, O_WAKE, O_ASLEEP,
       O_PIN, O_MODEL };
#define BIT(o) (UINT32_C(1) << (o))
/* The least guard window gfctl runs a command under: a shorter one would
 * kill it whenever gfctl waits for a CPU on a busy machine. */
#define GUARD_MIN_WINDOW_MS 100

/* Parses the options @allowed of this command up to "--"; returns the index
 * of the first argument after it (or argc), -1 on error. */
static int parse_opts(int argc, char **argv, uint32_t allowed, struct lock_opts *o)
{
	static const struct option all[] = {
		{ "lock", required_argument, NULL, O_LOCK },
		{ "id", required_argument, NULL, O_ID },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "reconnect-timeout", required_argument, NULL, O_RECONNECT },
		{ "secret-file", required_argument, NULL, O_SECRET },
		{ "heartbeat", required_argument, NULL, O_HB },
		{ "fence", required_argument, NULL, O_FENCE },
		{ "json", no_argument, NULL, O_JSON },
		{ "epoch", required_argument, NULL, O_EPOCH },
		{ "gpu", required_argument, NULL, O_GPU },
		{ "wake-bytes", required_argument, NULL, O_WAKE },
		{ "asleep-bytes", required_argument, NULL, O_ASLEEP },
		{ "pin", no_argument, NULL, O_PIN },
		{ "model", required_argument, NULL, O_MODEL },
		{ 0 },
	};
	struct option opts[32];
	gfctl_options(all, allowed | BIT(O_LOCK), opts);
	int opt, rc = 0;
	optind = 1;
	opterr = 0; /* the message below names the command */
	while (rc == 0 && (opt = getopt_long(argc, argv, GFCTL_OPTSTRING, opts, NULL)) != -1) {
		switch (opt) {
		case O_LOCK:
			o->uri = optarg;
			break;
		case O_ID:
			o->id = optarg;
			break;
		case O_TIMEOUT:
			rc = gfctl_duration("lock", "--timeout", optarg, &o->timeout_ms);
			break;
		case O_RECONNECT:
			rc = gfctl_duration("lock", "--reconnect-timeout", optarg, &o->reconnect_ms);
			break;
		case O_SECRET:
			o->secret_file = optarg;
			break;
		case O_HB:
			rc = gfctl_duration("lock", "--heartbeat", optarg, &o->hb_ms);
			break;
		case O_FENCE:
			rc = gfctl_duration("lock", "--fence", optarg, &o->fence_ms);
			break;
		case O_JSON:
			o->json = 1;
			break;
		case O_EPOCH: {
			char *end;
			errno = 0;
			unsigned long long v = strtoull(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-' || v == 0 || v > INT64_MAX) {
				fprintf(stderr, "gfctl lock %s: --epoch: expected a grant's epoch (1..%lld), got '%s'\n",
					argv[0], (long long)INT64_MAX, optarg);
				return -1;
			}
			o->epoch = v;
			break;
		}
		case O_GPU:
			if (o->ngpus == 8) {
				fprintf(stderr, "gfctl lock %s: at most 8 --gpu\n", argv[0]);
				return -1;
			}
			o->gpus[o->ngpus++] = optarg;
			break;
		case O_WAKE:
			rc = parse_size(argv[0], "--wake-bytes", optarg, &o->wake_bytes);
			break;
		case O_ASLEEP:
			rc = parse_size(argv[0], "--asleep-bytes", optarg, &o->asleep_bytes);
			break;
		case O_PIN:
			o->pinned = 1;
			break;
		case O_MODEL:
			o->model = optarg;
			break;
		default:
			gfctl_bad_option("lock", argv, opt, opts);
			return -1;
		}
	}
	if (rc < 0)
		return -1;
	if (!o->uri) {
		fprintf(stderr, "gfctl lock %s: --lock URI is required\n", argv[0]);
		return -1;
	}
	if (load_secret(o) < 0)
		return -1;
	return optind;
}

static int fail(const char *what, int rc)
{
	return gfctl_fail("lock", what, rc);
}

static int exit_status(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return GFCTL_EXIT_FAILURE;
}

/* Step 1: a lock object configured from the options. */
static int new_lock(struct lock_opts *o, gf_lock **out)
{
	int rc = gf_lock_new(out, o->uri, o->id);
	if (rc < 0)
		return rc;
	if (o->reconnect_ms >= 0)
		gf_lock_set_reconnect_timeout(*out, o->reconnect_ms);
	if (o->secret)
		gf_lock_set_secret(*out, o->secret, o->secret_len);
	if (o->hb_ms > 0 || o->fence_ms > 0)
		rc = gf_lock_set_lease(*out, o->hb_ms > 0 ? o->hb_ms : 1000, o->fence_ms > 0 ? o->fence_ms : 3000);
	if (rc == 0)
		rc = gf_lock_set_resources(*out, o->gpus, o->ngpus, o->wake_bytes, o->asleep_bytes);
	if (rc == 0)
		rc = gf_lock_set_pinned(*out, o->pinned);
	if (rc == 0)
		rc = gf_lock_set_model(*out, o->model);
	if (rc < 0) {
		gf_lock_free(*out);
		*out = NULL;
	}
	return rc;
}

/* An interactive CMD needs the terminal: when group @from has it in the
 * foreground, hand it to group @to (else CMD would stop on SIGTTIN). */
static void take_terminal(pid_t to, pid_t from)
{
	if (!isatty(STDIN_FILENO) || tcgetpgrp(STDIN_FILENO) != from)
		return;
	void (*old)(int) = signal(SIGTTOU, SIG_IGN);
	tcsetpgrp(STDIN_FILENO, to);
	signal(SIGTTOU, old);
}

/*
 * In CMD's process, before exec: the lock's listeners as systemd passes
 * sockets (sd_listen_fds(3)): fds 3.. without close-on-exec, LISTEN_FDS,
 * LISTEN_FDNAMES and LISTEN_PID. Without listeners the variables are unset, so
 * CMD never takes someone else's for its own.
 */
static void export_listeners(const struct gf_lock_listener *ls, size_t n)
{
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	unsetenv("LISTEN_PID");
	if (n == 0)
		return;
	int tmp[64];
	char names[64 * 65] = "", num[32];
	/* First above the targets, so no dup2() below overwrites a source. */
	for (size_t i = 0; i < n; i++)
		tmp[i] = fcntl(ls[i].fd, F_DUPFD_CLOEXEC, 3 + (int)n);
	for (size_t i = 0; i < n; i++) {
		if (tmp[i] < 0 || dup2(tmp[i], 3 + (int)i) < 0) {
			fprintf(stderr, "gfctl lock acquire: passing listener %s: %s\n", ls[i].name, strerror(errno));
			_exit(GFCTL_EXIT_FAILURE);
		}
		close(tmp[i]);
		if (i)
			strcat(names, ":");
		strcat(names, ls[i].name);
	}
	snprintf(num, sizeof(num), "%zu", n);
	setenv("LISTEN_FDS", num, 1);
	setenv("LISTEN_FDNAMES", names, 1);
	snprintf(num, sizeof(num), "%d", (int)getpid());
	setenv("LISTEN_PID", num, 1);
}

/*
 * The guard: gfctl's child, leader of a new process group in which CMD runs.
 * It exists so CMD never outlives the lock: when gfctl dies, even by SIGKILL,
 * the kernel sends the guard SIGTERM (PR_SET_PDEATHSIG) and the guard kills
 * the whole group. Signals gfctl forwards to the group reach CMD, which
 * handles them as it likes; the guard ignores them while gfctl lives. The
 * guard exits with CMD's status (128+N when a signal N ended it).
 *
 * On a lease lock (tcp://, etcd://) gfctl can also stop without dying
 * (SIGSTOP, a frozen cgroup) while the lease runs out and the next holder is
 * granted. So gfctl writes a byte to the @beat pipe every time it runs holding the
 * lock, and the guard itself ends the group when none came for @window_ms:
 * it leaves the group first (joins gfctl's), kills it, and exits
 * GFCTL_EXIT_LOCK_LOST. @beat {-1, -1}: not a lease lock, no such deadline.
 */
static void run_guard(char **cmd, pid_t gfctl_pid, const sigset_t *old_mask, const struct gf_lock_listener *ls,
		      size_t nls, const int beat[2], int64_t window_ms)
{
	int beat_fd = beat[0];
	if (beat[1] >= 0) /* gfctl's end: EOF then means gfctl is gone */
		close(beat[1]);
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigaddset(&mask, SIGCHLD);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	if (getppid() != gfctl_pid) /* gfctl died before the line above */
		kill(0, SIGKILL);
	pid_t gfctl_group = getpgid(gfctl_pid);
	take_terminal(getpid(), gfctl_group);
	pid_t child = fork();
	if (child < 0)
		_exit(GFCTL_EXIT_FAILURE);
	if (child == 0) {
		sigprocmask(SIG_SETMASK, old_mask, NULL);
		signal(SIGPIPE, SIG_DFL);
		export_listeners(ls, nls);
		execvp(cmd[0], cmd);
		fprintf(stderr, "gfctl lock acquire: exec %s: %s\n", cmd[0], strerror(errno));
		_exit(127);
	}
	int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
	if (sfd < 0)
		kill(0, SIGKILL);
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000, deadline = now + window_ms;
	for (;;) {
		struct pollfd p[2] = { { .fd = sfd, .events = POLLIN }, { .fd = beat_fd, .events = POLLIN } };
		int wait = beat_fd < 0 ? -1 : (int)(deadline > now ? deadline - now : 0);
		int n = poll(p, 2, wait);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
		if (n < 0 && errno != EINTR)
			kill(0, SIGKILL);
		char buf[64];
		if (n > 0 && (p[1].revents & (POLLIN | POLLHUP))) {
			if (read(beat_fd, buf, sizeof(buf)) == 0) /* gfctl is gone */
				kill(0, SIGKILL);
			deadline = now + window_ms;
		}
		if (beat_fd >= 0 && now >= deadline) {
			fprintf(stderr,
				"gfctl lock acquire: no renewal from gfctl for %lldms (stopped?); ending the command before the lease can pass on\n",
				(long long)window_ms);
			if (setpgid(0, gfctl_group) < 0)
				kill(0, SIGKILL);
			kill(-getpid(), SIGKILL);
			waitpid(child, NULL, 0);
			_exit(GFCTL_EXIT_LOCK_LOST);
		}
		struct signalfd_siginfo si;
		if (n <= 0 || !(p[0].revents & POLLIN) || read(sfd, &si, sizeof(si)) != sizeof(si))
			continue;
		if (si.ssi_signo != SIGCHLD) {
			if (getppid() != gfctl_pid)
				kill(0, SIGKILL);
			continue;
		}
		int status;
		if (waitpid(child, &status, WNOHANG) == child)
			_exit(exit_status(status));
	}
}

/* Step 3: start the guard (and CMD under it); the group id, or -1. */
static pid_t start_command(char **cmd, const sigset_t *old_mask, const struct gf_lock_listener *ls, size_t nls,
			   const int beat[2], int64_t window_ms)
{
	pid_t self = getpid();
	pid_t guard = fork();
	if (guard < 0) {
		perror("gfctl lock acquire: fork");
		return -1;
	}
	if (guard == 0)
		run_guard(cmd, self, old_mask, ls, nls, beat, window_ms);
	setpgid(guard, guard); /* also here: no signal may find the group missing */
	take_terminal(guard, getpgrp());
	return guard;
}

/* Step 4: hold the lock until CMD ends (its status), a signal asks to stop
 * (without CMD), or the lock is lost (GFCTL_EXIT_LOCK_LOST). While held, a
 * beat to the guard at least every @beat_ms (@beat_fd >= 0). */
static int hold(gf_lock *lock, int sfd, pid_t group, int beat_fd, int beat_ms)
{
	for (;;) {
		if (beat_fd >= 0 && gf_lock_is_held(lock) && write(beat_fd, "b", 1) < 0 && errno != EAGAIN)
			beat_fd = -1; /* the guard is gone: its SIGCHLD tells the rest */
		struct pollfd p[2] = { { .fd = gf_lock_get_fd(lock), .events = (short)gf_lock_get_events(lock) },
				       { .fd = sfd, .events = POLLIN } };
		int wait = gf_lock_get_timeout_ms(lock);
		if (beat_fd >= 0 && (wait < 0 || wait > beat_ms))
			wait = beat_ms;
		int n = poll(p, 2, wait);
		if (n < 0 && errno != EINTR)
			return GFCTL_EXIT_FAILURE;
		struct signalfd_siginfo si;
		while (n > 0 && (p[1].revents & POLLIN) && read(sfd, &si, sizeof(si)) == sizeof(si)) {
			int status;
			if (si.ssi_signo == SIGCHLD && group > 0 && waitpid(group, &status, WNOHANG) == group)
				return exit_status(status);
			if (si.ssi_signo != SIGCHLD && group > 0)
				kill(-group, (int)si.ssi_signo);
			else if (si.ssi_signo != SIGCHLD)
				return GFCTL_OK;
		}
		if (gf_lock_process(lock) == GF_ERR_LOCK_LOST) {
			fprintf(stderr, "gfctl lock acquire: %s\n", gf_error_detail());
			if (group > 0) {
				kill(-group, SIGTERM);
				waitpid(group, NULL, 0);
			}
			return GFCTL_EXIT_LOCK_LOST;
		}
	}
}

/* tcp:// and etcd:// locks are leases: they pass on when the holder goes silent, alive or not. */
static bool is_lease(const char *uri)
{
	return !strncmp(uri, "tcp://", 6) || !strncmp(uri, "etcd://", 7) || !strncmp(uri, "etcds://", 8);
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
	int rc = new_lock(o, &lock);
	if (rc < 0)
		return fail("acquire", rc);
	/* Signals arrive through a signalfd once the lock is held; while
	 * waiting they keep their default action, so a killed waiter just dies. */
	sigset_t mask, old;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigaddset(&mask, SIGCHLD);
	sigprocmask(SIG_SETMASK, NULL, &old);
	signal(SIGPIPE, SIG_IGN);
	int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);

	/* Step 2: wait for the grant (--timeout 0: ask once). */
	struct gf_lock_grant g;
	rc = gf_lock_acquire(lock, o->timeout_ms, &g);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	if (rc < 0) {
		int code = fail("acquire", rc);
		gf_lock_free(lock);
		close(sfd);
		return code;
	}
	printf("granted id=%s epoch=%" PRIu64 "\n", o->id, g.epoch);
	fflush(stdout);

	/* A tcp:// lock carries no listeners (GF_ERR_NOT_SUPPORTED): CMD gets none. */
	const struct gf_lock_listener *ls = NULL;
	size_t nls = 0;
	if (gf_lock_listeners(lock, &ls, &nls) < 0)
		nls = 0;
	/* The guard's window: half of the lock's own T_fence (on etcd half the
	 * lease TTL unless --fence says less; --fence on tcp://), so CMD is gone
	 * well before the lease can pass on after gfctl last renewed it. */
	int beat[2] = { -1, -1 };
	int64_t fence_ms = gf_lock_fence_ms(lock);
	int64_t window_ms = fence_ms > 0 ? fence_ms / 2 : 0;
	if (cmd && cmd[0] && is_lease(o->uri)) {
		if (window_ms < GUARD_MIN_WINDOW_MS) {
			fprintf(stderr, "gfctl lock acquire: T_fence %" PRId64 " ms is too short for the guard (at least %d ms)\n",
				fence_ms, 2 * GUARD_MIN_WINDOW_MS);
			gf_lock_release(lock);
			gf_lock_free(lock);
			close(sfd);
			return GFCTL_EXIT_USAGE;
		}
		fprintf(stderr, "gfctl lock acquire: guard window %" PRId64 " ms (half of T_fence %" PRId64 " ms)\n",
			window_ms, fence_ms);
	}
	pid_t group = 0;
	if (cmd && cmd[0] && is_lease(o->uri) && pipe2(beat, O_CLOEXEC | O_NONBLOCK) < 0) {
		perror("gfctl lock acquire: pipe");
		group = -1;
	} else if (cmd && cmd[0]) {
		group = start_command(cmd, &old, ls, nls, beat, window_ms);
		if (beat[0] >= 0)
			close(beat[0]);
	}
	int code = group < 0 ? GFCTL_EXIT_FAILURE : hold(lock, sfd, group, beat[1], (int)(window_ms / 4));
	if (beat[1] >= 0)
		close(beat[1]);
	/* Whatever CMD left running in its group goes before the lock does. */
	if (group > 0) {
		kill(-group, SIGKILL);
		take_terminal(getpgrp(), group);
	}
	if (code != GFCTL_EXIT_LOCK_LOST)
		gf_lock_release(lock);
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
				       "reconnect_window_left_ms", "previous_holder", "holder_pids", "exit_wait",
				       "exit_wait_processes", "exit_wait_pids", "state_write_failing",
				       "state_write_failures", "uptime_ms", "connections",
				       "listeners", "listeners_pending", "step_down_requested",
				       "fd_limit", "accept_paused", "refused_no_pidfd", "refused_auth_rate", "waiters",
				       "holder_info", "pool" };
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

static int cmd_revoke(struct lock_opts *o, char **extra)
{
	(void)extra;
	if (!o->epoch) {
		fprintf(stderr, "gfctl lock revoke: --epoch N is required (the holder's epoch, from 'gfctl lock status')\n");
		return GFCTL_EXIT_USAGE;
	}
	int rc = gf_lock_revoke(o->uri, o->secret, o->secret_len, o->epoch, o->timeout_ms >= 0 ? o->timeout_ms : 5000);
	if (rc == GF_ERR_TIMEOUT || rc == GF_ERR_IO || rc == GF_ERR_CLOSED) {
		/* Sent, but no answer: the server may have revoked it all the same. */
		fprintf(stderr, "gfctl lock revoke: epoch %" PRIu64 " revoke not confirmed (it may have taken effect): %s\n",
			o->epoch, gf_error_detail());
		return gfctl_exit_code(rc);
	}
	if (rc < 0)
		return fail("revoke", rc);
	printf("revoked epoch=%" PRIu64 "\n", o->epoch);
	return GFCTL_OK;
}

static int cmd_evict(struct lock_opts *o, char **extra)
{
	(void)extra;
	if (!o->id) {
		fprintf(stderr, "gfctl lock evict: --id ID is required (a waiting standby, from 'gfctl lock status')\n");
		return GFCTL_EXIT_USAGE;
	}
	int rc = gf_lock_evict(o->uri, o->secret, o->secret_len, o->id, o->timeout_ms >= 0 ? o->timeout_ms : 5000);
	if (rc < 0)
		return fail("evict", rc);
	printf("evicted id=%s\n", o->id);
	return GFCTL_OK;
}

static int cmd_ready(struct lock_opts *o, char **extra)
{
	(void)extra;
	char *json;
	int rc = gf_lock_ready_for(o->uri, o->secret, o->secret_len, o->gpus, o->ngpus, o->model,
				   o->timeout_ms >= 0 ? o->timeout_ms : 5000, &json);
	if (rc < 0)
		return fail("ready", rc);
	printf("%s\n", json);
	free(json);
	return rc == 1 ? GFCTL_OK : GFCTL_EXIT_FAILURE;
}

static int cmd_switchover(struct lock_opts *o, char **extra)
{
	(void)extra;
	int rc = gf_lock_switchover(o->uri, o->secret, o->secret_len, o->epoch, o->timeout_ms >= 0 ? o->timeout_ms : 5000);
	if (rc < 0)
		return fail("switchover", rc);
	printf("switchover requested: the holder steps down, the first standby takes over\n");
	return GFCTL_OK;
}

static int run_lock_cmd(int argc, char **argv, uint32_t allowed, int (*cmd)(struct lock_opts *, char **),
			int takes_cmd)
{
	struct lock_opts o = { .timeout_ms = -1, .reconnect_ms = -1 };
	int rest = parse_opts(argc, argv, allowed, &o);
	int code = GFCTL_EXIT_USAGE;
	if (rest < 0)
		goto out;
	if (rest < argc && !takes_cmd) {
		fprintf(stderr, "gfctl lock %s: unexpected argument '%s'\n", argv[0], argv[rest]);
		goto out;
	}
	code = cmd(&o, rest < argc ? argv + rest : NULL);
out:
	free(o.secret);
	return code;
}

static int status_cmd(struct lock_opts *o, char **extra)
{
	(void)extra;
	return cmd_status(o);
}

static int ping_cmd(struct lock_opts *o, char **extra)
{
	(void)extra;
	return cmd_ping(o);
}

static int run_acquire(int argc, char **argv)
{
	return run_lock_cmd(argc, argv, BIT(O_ID) | BIT(O_TIMEOUT) | BIT(O_RECONNECT) | BIT(O_SECRET) | BIT(O_HB) | BIT(O_FENCE) | BIT(O_GPU) |
				    BIT(O_WAKE) | BIT(O_ASLEEP) | BIT(O_PIN) | BIT(O_MODEL),
			    cmd_acquire, 1);
}

static int run_status(int argc, char **argv)
{
	return run_lock_cmd(argc, argv, BIT(O_JSON) | BIT(O_TIMEOUT) | BIT(O_SECRET), status_cmd, 0);
}

static int run_ping(int argc, char **argv)
{
	return run_lock_cmd(argc, argv, BIT(O_TIMEOUT) | BIT(O_SECRET), ping_cmd, 0);
}

static int run_ready(int argc, char **argv)
{
	return run_lock_cmd(argc, argv, BIT(O_GPU) | BIT(O_MODEL) | BIT(O_TIMEOUT) | BIT(O_SECRET), cmd_ready, 0);
}

static int run_revoke(int argc, char **argv)
{
	return run_lock_cmd(argc, argv, BIT(O_EPOCH) | BIT(O_TIMEOUT) | BIT(O_SECRET), cmd_revoke, 0);
}

static int run_evict(int argc, char **argv)
{
	return run_lock_cmd(argc, argv, BIT(O_ID) | BIT(O_TIMEOUT) | BIT(O_SECRET), cmd_evict, 0);
}

static int run_switchover(int argc, char **argv)
{
	return run_lock_cmd(argc, argv, BIT(O_EPOCH) | BIT(O_TIMEOUT) | BIT(O_SECRET), cmd_switchover, 0);
}

#define LOCK_OPT                                                                                     \
	"  --lock URI             the lock: unix:///path or tcp://host:port (gf-lockd), or\n"                \
	"                         etcd://host:port[,...]/prefix/name or etcds://... (docs/lock.md)\n"
#define SECRET_OPT "  --secret-file PATH     the shared secret of a tcp:// server\n"

static const struct gfctl_cmd lock_cmds[] = {
	{ "acquire", "--lock URI --id ID [OPTIONS] [-- CMD [ARGS...]]",
	  "Take the lock and hold it, or run CMD while holding it.",
	  "Prints 'granted id=ID epoch=N' once held. Without CMD it holds the lock until\n"
	  "SIGTERM/SIGINT/SIGHUP. With CMD it exits with CMD's status (128+N when signal N\n"
	  "ended it). CMD never outlives the lock: it runs in its own process group, which is\n"
	  "killed when gfctl dies (even by SIGKILL) or loses the lock, and whatever CMD leaves\n"
	  "running there is killed before the lock is released. On a lease lock (tcp://,\n"
	  "etcd://) the group is also killed (exit 4) when gfctl itself stops running, alive\n"
	  "or not, for half of the lock's T_fence (tcp:// --fence, default 3 s; etcd:// half\n"
	  "the ttl unless --fence, so 500 ms at ttl=1), written to stderr at the grant; a\n"
	  "T_fence under 200 ms is refused (exit 2). Signals sent to gfctl are\n"
	  "passed to the group. The listening sockets the lock carries (gf-lockd --listener)\n"
	  "are passed to CMD as systemd does: fds from 3, LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID.",
	  LOCK_OPT "  --id ID                this holder's id (shown in status)\n"
		   "  --timeout DUR          give up after DUR (default: wait forever; 0: ask once)\n"
		   "  --reconnect-timeout DUR  how long to keep trying an unreachable server\n" SECRET_OPT
		   "  --heartbeat DUR --fence DUR  lease of a tcp:// connection\n"
		   "  --gpu UUID             a GPU this holder runs on (repeatable, at most 8), for the\n"
		   "                         server's standby pool (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)\n"
		   "  --wake-bytes N --asleep-bytes N  memory the wake needs / kept while asleep (512M, 2G)\n"
		   "  --pin                  never evicted to keep a GPU's standby budget\n"
		   "  --model NAME           the model served, for 'gfctl lock ready'\n",
	  ", 3 timeout, 4 lock lost, 5 unreachable, 6 refused, 73 evicted from the standby pool while waiting;\n"
	  "with CMD: CMD's status", run_acquire },
	{ "status", "--lock URI [--json] [--timeout DUR]", "Show the holder, epoch, waiters and reconnect window.", NULL,
	  LOCK_OPT "  --json                 the status as one JSON object\n"
		   "  --timeout DUR          how long to wait for the answer (default 5s)\n" SECRET_OPT,
	  ", 3 timeout, 5 unreachable, 6 refused", run_status },
	{ "ping", "--lock URI [--timeout DUR]", "Check that the lock server answers a handshake; print 'ok'.", NULL,
	  LOCK_OPT "  --timeout DUR          how long to wait for the answer (default 5s)\n" SECRET_OPT,
	  ", 3 timeout, 5 unreachable, 6 refused", run_ping },
	{ "ready", "--lock URI [--gpu UUID ...] [--model NAME] [--timeout DUR]",
	  "Is an engine Active for these GPUs and this model? Prints the answer as JSON.",
	  "Answered from the lock server's state: ready when the holder declared every --gpu\n"
	  "(none: any) and serves --model (none: any), and it serves: an engine says so when it\n"
	  "enters Active (\"serving\": \"no\" while it wakes); a holder that does not report\n"
	  "(gfctl, older clients) counts from its grant (\"serving\": \"unknown\").\n"
	  "gf-lockd --metrics serves the same at /ready.",
	  LOCK_OPT "  --gpu UUID             a GPU the engine must run on (repeatable, at most 8)\n"
		   "  --model NAME           the model it must serve\n"
		   "  --timeout DUR          how long to wait for the answer (default 5s)\n" SECRET_OPT,
	  ", 3 timeout, 5 unreachable, 6 refused; 1 when no engine is Active for them, 2 for a malformed UUID or model",
	  run_ready },
	{ "revoke", "--lock URI --epoch N [--timeout DUR]",
	  "Revoke the grant of epoch N: the next waiter is granted without waiting for the holder to exit.",
	  "For a holder that will not die (a process in uninterruptible sleep keeps its\n"
	  "socket). Only the current grant's epoch is revoked, so a late or repeated call\n"
	  "changes nothing. Allowed for root or the server's own uid (unix), or with the\n"
	  "shared secret (tcp). The revoked holder's later requests are refused.",
	  LOCK_OPT "  --epoch N              the grant to revoke (see 'gfctl lock status')\n"
		   "  --timeout DUR          how long to wait for the answer (default 5s)\n" SECRET_OPT,
	  ", 3 timeout, 5 unreachable, 6 refused (not an admin); 1 when N is not the current grant", run_revoke },
	{ "evict", "--lock URI --id ID [--timeout DUR]",
	  "Evict the waiting standby ID from the standby pool, as the per-GPU budget does.",
	  "Its acquire ends with GF_ERR_EVICTED (gfctl lock acquire and gf-c-engine exit 73)\n"
	  "and the server closes its connection; a pinned standby too. The holder is not a\n"
	  "standby (see 'revoke'). Allowed for root or the server's own uid (unix), or with the\n"
	  "shared secret (tcp).",
	  LOCK_OPT "  --id ID                the standby to evict (see 'gfctl lock status')\n"
		   "  --timeout DUR          how long to wait for the answer (default 5s)\n" SECRET_OPT,
	  ", 3 timeout, 5 unreachable, 6 refused (not an admin); 1 when no standby ID waits", run_evict },
	{ "switchover", "--lock URI [--epoch N] [--timeout DUR]",
	  "Planned switchover: the holder steps down, the first standby takes over (also 'gfctl switchover').",
	  "The server asks the holder to step down; an engine built on the library stops\n"
	  "accepting (with the lock's listener new connections wait in its backlog), lets\n"
	  "in-flight requests finish, releases the lock and exits with status 75, which\n"
	  "gf-supervise restarts at once without counting a retry. Returns once the holder\n"
	  "was asked. Refused when nobody holds the lock or no standby waits. Allowed for\n"
	  "root or the server's own uid (unix), or with the shared secret (tcp).",
	  LOCK_OPT "  --epoch N              only if the holder's grant is N (default: whoever holds it)\n"
		   "  --timeout DUR          how long to wait for the answer (default 5s)\n" SECRET_OPT,
	  ", 3 timeout, 5 unreachable, 6 refused (not an admin); 1 when nobody holds the lock or no standby waits",
	  run_switchover },
	{ 0 },
};

const struct gfctl_group gfctl_lock_group = {
	"lock", "The lock server (gf-lockd): take the lock, show and probe it.", lock_cmds,
};
