/* SPDX-License-Identifier: Apache-2.0 */
/* In-process GMS servers for tests: a gf_gmsd running in its own thread. */
#ifndef GF_GMSTEST_H
#define GF_GMSTEST_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpufailover.h"

struct gt_server {
	gf_gmsd *d;
	pthread_t th;
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
	int rc = gf_gmsd_new(&s->d);
	if (rc == 0)
		rc = gf_gmsd_set_listen(s->d, s->uri);
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

/* Stop: every connection closes, as if the process died. */
static inline void gt_stop(struct gt_server *s)
{
	if (!s->d)
		return;
	gf_gmsd_stop(s->d);
	pthread_join(s->th, NULL);
	gf_gmsd_free(s->d);
	s->d = NULL;
}

#endif
