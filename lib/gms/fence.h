/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The weight fence of one GMS connection as a pure module (no sockets, no
 * lock client), as fsm.c is for the lock and client_fsm.c for the client.
 * A GMS fenced by a lock (gf_gmsd_set_lock()) lets an RW drop its committed
 * layout, and a writer commit, only while the lock server says the
 * connection's grant is the current one; server.c asks the lock server
 * (off its loop) and tells this module what happened. See docs/gms.md.
 *
 *   NONE --ask admission (a waiting RW on a committed layout)--> ADMITTING
 *   ADMITTING --yes--> ADMITTED (holds new readers back)
 *   NONE / ADMITTED --ask at the grant--> ASKING / ADMITTED_ASKING
 *   ASKING / ADMITTED_ASKING --yes--> PASSED / ADMITTED_PASSED (may drop once)
 *   NONE --ask at commit (a writer with a grant)--> COMMITTING --answer--> NONE
 *   any --no, a failed ask, granted, a new connect--> NONE
 */
#ifndef GF_GMS_FENCE_H
#define GF_GMS_FENCE_H

#include <stdbool.h>

enum gms_fence {
	GMS_FENCE_NONE = 0,          /* nothing asked, nothing known */
	GMS_FENCE_ADMITTING,         /* a waiting RW: whether it may wait ahead of readers is asked */
	GMS_FENCE_ADMITTED,          /* it may: it holds new readers back */
	GMS_FENCE_ASKING,            /* at its grant: whether it may drop the layout is asked */
	GMS_FENCE_ADMITTED_ASKING,   /* the same, admitted before */
	GMS_FENCE_PASSED,            /* it may drop the layout: the grant goes ahead once */
	GMS_FENCE_ADMITTED_PASSED,   /* the same, admitted before */
	GMS_FENCE_COMMITTING,        /* a writer's commit waits for the answer */
};

enum gms_fence_event {
	GMS_FENCE_ASK_ADMISSION, /* the lock server is asked about a waiting RW */
	GMS_FENCE_ASK_GRANT,     /* ... about an RW about to drop the layout */
	GMS_FENCE_ASK_COMMIT,    /* ... about a writer's commit */
	GMS_FENCE_YES,           /* the answer names this connection's grant, with a valid proof */
	GMS_FENCE_NO,            /* the answer names another grant, or none came: refused */
	GMS_FENCE_RESET,         /* granted, a new connect, or the connection's end */
};

/* The state after @ev in @s; GMS_FENCE_NONE for an event that does not apply (server.c never sends one). */
enum gms_fence gms_fence_next(enum gms_fence s, enum gms_fence_event ev);

/* The lock server's answer is awaited (a query is in flight). */
bool gms_fence_asking(enum gms_fence s);
/* A waiting RW that holds new readers back on a fenced, committed GMS (writer priority, proven writers only). */
bool gms_fence_admitted(enum gms_fence s);
/* The grant may drop the layout now. */
bool gms_fence_passed(enum gms_fence s);

#endif
