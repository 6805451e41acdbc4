/* SPDX-License-Identifier: Apache-2.0 */
/* Internal helpers shared by every component: errors, logging, time. */
#ifndef GF_COMMON_H
#define GF_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpufailover/base.h"

#define GF_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Record a detail message for the calling thread and return @err, so error
 * paths read `return gf_err(GF_ERR_TIMEOUT, "acquire %s", id);`. */
int gf_err(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same, appending ": strerror(errnum)". */
int gf_err_errno(int err, int errnum, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Map an errno value to the closest GF_ERR_* code. */
int gf_errno_to_err(int errnum);
/* Clear the calling thread's detail message. */
void gf_err_clear(void);

void gf_log(int level, const char *component, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool gf_log_enabled(int level);
/* The text of a log line from a printf format (lib/common/logfmt.c): string
 * values after `key=` quoted as logfmt needs, those in `key=\"%s\"` escaped,
 * and `event=` put in front of a `msg="..."` line. Always NUL-terminated. */
void gf_log_vformat(char *buf, size_t cap, const char *fmt, va_list ap);
/* "event=... " for a line that describes its event (`msg="..."`) and names
 * none, else "": for lines made elsewhere (the daemons' own). Returns its length. */
size_t gf_log_event_prefix(char *buf, size_t cap, const char *text);
/*
 * Hold this thread's info and debug lines, stamped with the time they were
 * logged, instead of delivering each (a write per line) while an engine wakes:
 * gf_log_release(), from any thread, delivers them in order, together
 * (gf_log_stderr() then writes them with one write). One hold per process;
 * while another thread holds, gf_log_hold() does nothing. The owner's
 * warning or error, a full hold (24 lines) or one older than a second
 * releases at the owner's next line, that line after what was held.
 */
void gf_log_hold(void);
void gf_log_release(void);
/* The hold's buffers, allocated and touched now (before a wait), not at the hold. */
void gf_log_hold_prepare(void);

/* The longest duration a setting or a peer may ask for (a year): its
 * microseconds stay far from overflowing 64 bits when added to a clock. */
#define GF_MAX_DURATION_MS (366LL * 86400 * 1000)

/* GPUs one engine may declare to the lock's standby pool, and a UUID's
 * buffer size ("GPU-" or "MIG-" and 36 characters, plus the NUL), from
 * lib/proto/gpufailover.options (the lock static-asserts them). */
#define GF_POOL_MAX_GPUS 8
#define GF_POOL_UUID_MAX 48
/* Canonical GPU UUID: "GPU-" or "MIG-" then 8-4-4-4-12 hex digits. On success
 * writes the lowercase form to @out (GF_POOL_UUID_MAX bytes) and returns true.
 * One rule for the engine's configuration and the lock server's input. */
bool gf_pool_uuid_parse(const char *s, char out[GF_POOL_UUID_MAX]);

/* CLOCK_MONOTONIC in microseconds. */
int64_t gf_now_us(void);
/* CLOCK_REALTIME in microseconds. */
int64_t gf_wall_us(void);
/* Deadline helpers: timeout_ms < 0 means "no deadline" (returns INT64_MAX). */
int64_t gf_deadline_from_ms(int64_t timeout_ms);
/* Milliseconds left until @deadline_us for poll(): -1 for none, 0 if passed. */
int gf_poll_timeout_ms(int64_t deadline_us);

/* Fill @buf with @len bytes from getrandom(2). */
int gf_random_bytes(void *buf, size_t len);
/* Lower-case hex of @len bytes into @out (2*len+1 bytes). */
void gf_hex(const uint8_t *in, size_t len, char *out);
/* @len bytes from the 2*@len hex digits (either case) at @in into @out: 0, or
 * -1 at the first character that is no hex digit (@out then partly written). */
int gf_unhex(const char *in, size_t len, uint8_t *out);

/* Engine and peer ids: buffer size including the NUL (the schema's limit). */
#define GF_ID_MAX 128
/*
 * The one id rule (engine ids, peer ids): 1..GF_ID_MAX-1 bytes of printable
 * ASCII without spaces, quotes, '\\' or '=', since ids end up in key=value
 * log lines and JSON.
 */
bool gf_id_valid(const char *id);
/* 0 when gf_id_valid(@id), else GF_ERR_INVALID_ARG with a detail prefixed by @who (the id itself is not echoed: it may hold control bytes). */
int gf_id_check(const char *id, const char *who);

/* Close @fd if >= 0, preserving errno. */
void gf_close(int fd);
void gf_close_fds(int *fds, size_t n);

#endif
