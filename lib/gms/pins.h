/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory a released sleeper still pins (docs/gms.md, "Memory a sleeper still
 * pins"): the dropped layouts the GMS freed but whose sleepers may still hold
 * them, and the look through /proc that tells. The server hands over a
 * layout and its released sleepers at a drop and asks for a look now and
 * then; this room reads /proc and reports through an event hook, and knows
 * nothing of sessions or the lock.
 */
#ifndef GF_GMS_PINS_H
#define GF_GMS_PINS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common.h"

#define GMS_PINS_RETIRED_MAX 16           /* dropped layouts whose released sleepers are watched */
#define GMS_PINS_SCAN_US 1000000          /* how often they are looked at */
#define GMS_PINS_SETTLE_US 1000000        /* a demotion's answer waits this long for them to let go */
#define GMS_PINS_SETTLE_STEP_US 20000

/*
 * A dropped layout that sleepers released by the drop may still hold
 * (docs/gms.md, "Memory a sleeper still pins"): the GMS freed its own
 * references, but a sleeper that is stopped or hung never lets go of its
 * imported handles. Host backend, exactly: each allocation is known by its
 * memfd's inode, and each released sleeper's /proc/PID/fd and
 * /proc/PID/maps say whether it still holds it. Other backends (cuda: the
 * driver does not say who holds an import), a lower bound: a sleeper none
 * of whose threads has run since its session was closed cannot have let go.
 */
struct gms_pin_holder {
	uint32_t pid;
	char peer[GF_ID_MAX];
	uint64_t bytes;     /* seen held at the last look */
	uint32_t allocs;
	bool reported;      /* its event=still_pinned was logged */
	uint64_t ran0;      /* not exact: its threads' context switches before the drop */
	int ran0_err;       /* ...or why they could not be read */
};

struct gms_retired {
	uint64_t generation;
	int64_t at_unix_ms;
	const char *reason;  /* static: "new_load", "demotion", "abort" */
	bool exact;          /* held allocations are seen (host), else inferred from activity */
	uint64_t bytes;      /* the layout's size and allocations */
	uint32_t allocs;
	dev_t dev;           /* exact: the memfds' file system */
	size_t n;
	struct gms_retired_alloc {
		uint64_t ino, size;
	} *ids;              /* sorted by inode */
	size_t nholders;
	struct gms_pin_holder *h;
};

/* The dropped layouts still held, oldest first, and when to look at them next. */
struct gms_pins {
	struct gms_retired *retired;
	size_t nretired;
	int64_t next_us;
	/* One line of the GMS's event ring ("event=still_pinned ..."). */
	void (*event)(void *ctx, const char *text);
	void *ctx;
};

/* Allocation @i of the layout being dropped: a borrowed fd (close it when @owned) and its size. */
typedef int (*gms_pins_fd_fn)(void *ctx, size_t i, int *fd, bool *owned, uint64_t *size);

/* The layout a drop frees, as the pin watcher remembers it. */
struct gms_pins_layout {
	uint64_t generation;
	const char *reason;  /* static: "new_load", "demotion", "abort" */
	bool exact;          /* allocations are files (host backend): /proc names their holders */
	uint64_t bytes;
	size_t nallocs;
	gms_pins_fd_fn fd_at;
	void *ctx;
};

void gms_pins_free(struct gms_pins *p);
/* Add the sleeper @pid/@peer to the holders a drop releases, before its session is closed (so any run after it shows). */
void gms_pins_note(struct gms_pin_holder **h, size_t *n, bool exact, uint32_t pid, const char *peer);
/* At a drop, before the layout is freed: watch @l's memory in the holders @h (taken over). */
void gms_pins_retire(struct gms_pins *p, const struct gms_pins_layout *l, struct gms_pin_holder *h, size_t nh);
/* Look at every released sleeper again: forget those that let go (or exited), report those that still hold. */
void gms_pins_scan(struct gms_pins *p);
/* Bytes the released sleepers were seen holding at the last look. */
uint64_t gms_pins_bytes(const struct gms_pins *p);

#endif
