/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gpufailover/base.h
 * @brief libgpufailover base: version, error model, logging hook. Every
 * component header includes it; applications include gpufailover.h.
 *
 * Conventions used by every public call of the library:
 * - functions return 0 (or a non-negative count) on success and a negative
 *   `GF_ERR_*` code on failure; nothing aborts or exits the process;
 * - out-parameters are written only on success;
 * - `gf_*_free(NULL)` is a no-op;
 * - after a failure, gf_error_detail() returns a human-readable explanation
 *   for the calling thread (errors are per call, never sticky globals).
 */
#ifndef GPUFAILOVER_BASE_H
#define GPUFAILOVER_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Marks a symbol as part of the public ABI (the rest is hidden). */
#if defined(__GNUC__)
#define GF_EXPORT __attribute__((visibility("default")))
#else
#define GF_EXPORT
#endif

/** @defgroup version Version
 *  @{ */
/* GF_VERSION_MAJOR, _MINOR, _PATCH and GF_VERSION_TEXT, generated from the project's version. */
#include "gpufailover/version.h"
/** Compile-time version as a single number: major*10000 + minor*100 + patch. */
#define GF_VERSION_NUMBER (GF_VERSION_MAJOR * 10000 + GF_VERSION_MINOR * 100 + GF_VERSION_PATCH)

/** Version of the library actually loaded, e.g. "0.1.0" (GF_VERSION_TEXT of its build). Static string, never freed. */
GF_EXPORT const char *gf_version(void);
/** Version of the library actually loaded as GF_VERSION_NUMBER would encode it. */
GF_EXPORT int gf_version_number(void);
/** @} */

/** @defgroup errors Errors
 *  Named error codes for the failure modes a caller must tell apart.
 *  @{ */
enum gf_error {
	GF_OK = 0,
	GF_ERR_INVALID_ARG = -1,     /**< an argument is out of range, NULL or malformed */
	GF_ERR_NOMEM = -2,           /**< host memory allocation failed */
	GF_ERR_TIMEOUT = -3,         /**< the deadline passed before the operation completed */
	GF_ERR_STALE_LAYOUT = -4,    /**< the GMS holds a different committed layout than expected */
	GF_ERR_LOCK_LOST = -5,       /**< the lock was held and is no longer (server lost, reconnect failed) */
	GF_ERR_GMS_LOST = -6,        /**< the GPU memory service went away while connected */
	GF_ERR_NOT_SUPPORTED = -7,   /**< feature/backend/device unavailable here (detail says why) */
	GF_ERR_PROTOCOL = -8,        /**< the peer sent something that violates the protocol */
	GF_ERR_PERMISSION = -9,      /**< refused: peer uid not allowed, bad shared secret, read-only */
	GF_ERR_OUT_OF_MEMORY = -10,  /**< device (or backend) memory exhausted */
	GF_ERR_IO = -11,             /**< a system call failed (detail carries errno text) */
	GF_ERR_UNREACHABLE = -12,    /**< could not connect to the server */
	GF_ERR_STATE = -13,          /**< call not valid in the object's current state */
	GF_ERR_NOT_FOUND = -14,      /**< unknown id, key or device */
	GF_ERR_VERSION = -15,        /**< peer speaks an unsupported protocol version */
	GF_ERR_CLOSED = -16,         /**< the peer closed the connection */
	GF_ERR_TOO_BIG = -17,        /**< a frame or value exceeds the enforced maximum */
	GF_ERR_INTERRUPTED = -18,    /**< a blocking call was interrupted on request */
	GF_ERR_DRIVER = -19,         /**< the GPU driver returned an error (detail names it) */
	GF_ERR_AGAIN = -20,          /**< would block; try again after the fd is ready */
	GF_ERR_BUSY = -21,           /**< resource busy (e.g. lock held, mapping in use) */
	GF_ERR_EVICTED = -22,        /**< a standby was evicted from the lock server's pool to keep a GPU's budget */
};

/** Static English description of @p err ("timed out", ...). Unknown codes give "unknown error". */
GF_EXPORT const char *gf_strerror(int err);
/** Symbolic name of @p err ("GF_ERR_TIMEOUT", ...); NULL for unknown codes. */
GF_EXPORT const char *gf_error_name(int err);
/**
 * Detail message of the last failure on the calling thread, e.g.
 * "connect unix:///run/gf/lock.sock: No such file or directory".
 * Valid until the next library call on this thread; never NULL (may be "").
 */
GF_EXPORT const char *gf_error_detail(void);
/** @} */

/** @defgroup logging Logging
 *  The library logs only through this hook. Without a hook it is silent,
 *  unless the environment variable GF_LOG is set to err|warn|info|debug
 *  (error and warning are the same; any other value means warn), in which
 *  case lines at that level or more severe go to stderr as
 *  gf_log_stderr() writes them. With a hook, GF_LOG sets the level until
 *  gf_set_log_level() is called.
 *  @{ */
enum gf_log_level {
	GF_LOG_ERR = 3,
	GF_LOG_WARN = 4,
	GF_LOG_INFO = 6,
	GF_LOG_DEBUG = 7,
};

/**
 * Log callback. @p component is a short static string ("lock", "gms", "mem",
 * "engine", "wire"); @p msg is a formatted line without trailing newline,
 * mostly logfmt `key=value` pairs: string values quoted where they need it,
 * `event=NAME` first (a line that says it in words has `msg="..."` too). Called from whichever thread logs; must be
 * thread-safe and must not call back into the library.
 */
typedef void (*gf_log_fn)(int level, const char *component, const char *msg, void *userdata);

/** Install (or with NULL, remove) the process-wide log hook. Thread-safe. */
GF_EXPORT void gf_set_log_fn(gf_log_fn fn, void *userdata);
/** Drop messages less severe than @p level before they reach the hook. Default with a hook: GF_LOG's level if set, else GF_LOG_INFO. */
GF_EXPORT void gf_set_log_level(int level);
/**
 * A ready-made hook writing structured lines to stderr:
 * `ts=2026-11-21T10:00:00.123Z mono_us=123456789 level=info component=lock event=released msg="released" id=a`
 * (mono_us is CLOCK_MONOTONIC in microseconds, comparable across processes).
 * When stderr is the journald stream named by JOURNAL_STREAM (a systemd
 * service), each line starts with `<N>`, its level as a syslog priority, so
 * journald records it at that priority.
 * @p userdata may be a program name (const char *) added as `prog=`, or NULL.
 */
GF_EXPORT void gf_log_stderr(int level, const char *component, const char *msg, void *userdata);
/**
 * When the line being delivered was logged: CLOCK_MONOTONIC and wall-clock
 * microseconds (either pointer may be NULL). The one call a gf_log_fn may
 * make into the library. An engine holds its info lines from the grant to
 * Active, so that writing them does not delay the first answer, and delivers
 * them together once Active (a warning or an error goes out at once, after
 * what was held): a hook that stamps lines should stamp this time, which is
 * what gf_log_stderr() does. Outside a delivery it is the current time.
 */
GF_EXPORT void gf_log_line_time(int64_t *mono_us, int64_t *wall_us);
/** @} */

/** @defgroup util Utilities
 *  @{ */
/**
 * Parse a duration written as the project writes them everywhere:
 * "250ms", "10s", "2m", "1h", "1500us" or a bare number of milliseconds.
 * Combined forms ("1m30s") are accepted. Returns GF_ERR_INVALID_ARG with a
 * detail message on anything else (negative, overflow, unknown unit).
 */
GF_EXPORT int gf_parse_duration_ms(const char *text, uint64_t *out_ms);
/**
 * Parse a byte count as the tools write them: digits with an optional
 * binary suffix, "B", "K"/"k"/"KiB", "M"/"MiB", "G"/"GiB" or "T"/"TiB"
 * ("512M" is 536870912). Returns GF_ERR_INVALID_ARG with a detail message on
 * anything else (empty, negative, overflow, unknown suffix).
 */
GF_EXPORT int gf_parse_bytes(const char *text, uint64_t *out);
/** @} */

#ifdef __cplusplus
}
#endif

#endif
