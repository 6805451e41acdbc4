/* SPDX-License-Identifier: Apache-2.0 */
/* GMS servers for tests: a gf_gmsd running in a thread of the test, or a real gf-gmsd process. */
#ifndef GF_GMSTEST_H
#define GF_GMSTEST_H

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpufailover.h"

struct gt_server {
	gf_gmsd *d;     /* in-process */
	pthread_t th;
	pid_t pid;      /* a gf-gmsd process */
	char uri[300];
};

static void *gt_run(void *arg)
{
	gf_gmsd_run(((struct gt_server *)arg)->d);
	return NULL;
}

/* Start a host-backend GMS on @dir/@name.sock. Returns 0 or an error. */
static inline int gt_start(struct gt_server *s, const char *dir, const char *name, int64_t oom_retry_ms)
{
	snprintf(s->uri, sizeof(s->uri), "unix://%s/%s.sock", dir, name);
	s->pid = 0;
	int rc = gf_gmsd_new(&s->d);
	if (rc == 0)
		rc = gf_gmsd_add_listen(s->d, s->uri);
	if (rc == 0)
		rc = gf_gmsd_set_backend(s->d, GF_MEM_HOST);
	if (rc == 0)
		rc = gf_gmsd_set_oom_retry(s->d, oom_retry_ms);
	if (rc == 0)
		rc = gf_gmsd_start(s->d);
	if (rc == 0 && pthread_create(&s->th, NULL, gt_run, s))
		rc = GF_ERR_IO;
	if (rc < 0) {
		gf_gmsd_free(s->d);
		s->d = NULL;
	}
	return rc;
}

/* Start the gf-gmsd program @bin (host backend) and wait until it answers a ping. */
static inline int gt_start_proc(struct gt_server *s, const char *dir, const char *name, const char *bin)
{
	snprintf(s->uri, sizeof(s->uri), "unix://%s/%s.sock", dir, name);
	s->d = NULL;
	s->pid = fork();
	if (s->pid < 0)
		return GF_ERR_IO;
	if (s->pid == 0) {
		int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
		dup2(null, 2);
		execl(bin, bin, "--listen", s->uri, "--backend", "host", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 5000; i++) {
		if (gf_gms_ping(s->uri, 100, NULL) == 0)
			return 0;
		usleep(1000);
	}
	kill(s->pid, SIGKILL);
	waitpid(s->pid, NULL, 0);
	s->pid = 0;
	return GF_ERR_TIMEOUT;
}

/* Stop: every connection closes, as if the process died (a process is SIGKILLed). */
static inline void gt_stop(struct gt_server *s)
{
	if (s->pid > 0) {
		kill(s->pid, SIGKILL);
		waitpid(s->pid, NULL, 0);
		s->pid = 0;
	}
	if (!s->d)
		return;
	gf_gmsd_stop(s->d);
	pthread_join(s->th, NULL);
	gf_gmsd_free(s->d);
	s->d = NULL;
}

/* Remove a test's private directory (sockets of SIGKILLed servers stay behind otherwise). */
static inline void gt_rmtree(const char *dir)
{
	char cmd[512];
	if (!dir || strncmp(dir, "/", 1) || strstr(dir, "gf-test-") == NULL)
		return; /* only what tu_tmpdir() made */
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

#endif
