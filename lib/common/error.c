/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

/* Per-thread, so one failed call never poisons another thread's report
 * (docs/design.md, rule 1: no sticky global error). */
static _Thread_local char detail[512];

static const struct {
	int code;
	const char *name;
	const char *text;
} error_table[] = {
	{ GF_OK, "GF_OK", "success" },
	{ GF_ERR_INVALID_ARG, "GF_ERR_INVALID_ARG", "invalid argument" },
	{ GF_ERR_NOMEM, "GF_ERR_NOMEM", "out of host memory" },
	{ GF_ERR_TIMEOUT, "GF_ERR_TIMEOUT", "timed out" },
	{ GF_ERR_STALE_LAYOUT, "GF_ERR_STALE_LAYOUT", "stale memory layout" },
	{ GF_ERR_LOCK_LOST, "GF_ERR_LOCK_LOST", "lock lost" },
	{ GF_ERR_GMS_LOST, "GF_ERR_GMS_LOST", "GPU memory service lost" },
	{ GF_ERR_NOT_SUPPORTED, "GF_ERR_NOT_SUPPORTED", "not supported" },
	{ GF_ERR_PROTOCOL, "GF_ERR_PROTOCOL", "protocol error" },
	{ GF_ERR_PERMISSION, "GF_ERR_PERMISSION", "permission denied" },
	{ GF_ERR_OUT_OF_MEMORY, "GF_ERR_OUT_OF_MEMORY", "out of device memory" },
	{ GF_ERR_IO, "GF_ERR_IO", "I/O error" },
	{ GF_ERR_UNREACHABLE, "GF_ERR_UNREACHABLE", "server unreachable" },
	{ GF_ERR_STATE, "GF_ERR_STATE", "invalid state for this call" },
	{ GF_ERR_NOT_FOUND, "GF_ERR_NOT_FOUND", "not found" },
	{ GF_ERR_VERSION, "GF_ERR_VERSION", "unsupported protocol version" },
	{ GF_ERR_CLOSED, "GF_ERR_CLOSED", "connection closed by peer" },
	{ GF_ERR_TOO_BIG, "GF_ERR_TOO_BIG", "too big" },
	{ GF_ERR_INTERRUPTED, "GF_ERR_INTERRUPTED", "interrupted" },
	{ GF_ERR_DRIVER, "GF_ERR_DRIVER", "GPU driver error" },
	{ GF_ERR_AGAIN, "GF_ERR_AGAIN", "operation would block" },
	{ GF_ERR_BUSY, "GF_ERR_BUSY", "resource busy" },
	{ GF_ERR_EVICTED, "GF_ERR_EVICTED", "evicted from the standby pool" },
};

GF_EXPORT const char *gf_strerror(int err)
{
	for (size_t i = 0; i < GF_ARRAY_SIZE(error_table); i++)
		if (error_table[i].code == err)
			return error_table[i].text;
	return "unknown error";
}

GF_EXPORT const char *gf_error_name(int err)
{
	for (size_t i = 0; i < GF_ARRAY_SIZE(error_table); i++)
		if (error_table[i].code == err)
			return error_table[i].name;
	return NULL;
}

GF_EXPORT const char *gf_error_detail(void)
{
	return detail;
}

void gf_err_clear(void)
{
	detail[0] = '\0';
}

int gf_err(int err, const char *fmt, ...)
{
	/* Format aside first: callers may pass gf_error_detail() itself as an
	 * argument, to wrap the previous detail in a new one. */
	char buf[sizeof(detail)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	memcpy(detail, buf, sizeof(detail));
	return err;
}

int gf_err_errno(int err, int errnum, const char *fmt, ...)
{
	char buf[sizeof(detail) - 64], out[sizeof(detail)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	snprintf(out, sizeof(out), "%s: %s", buf, strerror(errnum));
	memcpy(detail, out, sizeof(detail));
	return err;
}

int gf_errno_to_err(int errnum)
{
	switch (errnum) {
	case ENOMEM:
		return GF_ERR_NOMEM;
	case ETIMEDOUT:
		return GF_ERR_TIMEOUT;
	case EACCES:
	case EPERM:
		return GF_ERR_PERMISSION;
	case ENOENT:
	case ECONNREFUSED:
	case EHOSTUNREACH:
	case ENETUNREACH:
		return GF_ERR_UNREACHABLE;
	case EPIPE:
	case ECONNRESET:
		return GF_ERR_CLOSED;
	case EINVAL:
		return GF_ERR_INVALID_ARG;
	case EAGAIN:
		return GF_ERR_AGAIN;
	case ENOSYS:
	case EOPNOTSUPP:
		return GF_ERR_NOT_SUPPORTED;
	case EINTR:
		return GF_ERR_INTERRUPTED;
	default:
		return GF_ERR_IO;
	}
}
