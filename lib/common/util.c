/* SPDX-License-Identifier: Apache-2.0 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

GF_EXPORT const char *gf_version(void)
{
	return GF_VERSION_TEXT;
}

GF_EXPORT int gf_version_number(void)
{
	return GF_VERSION_NUMBER;
}

int64_t gf_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t gf_wall_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t gf_deadline_from_ms(int64_t timeout_ms)
{
	if (timeout_ms < 0 || timeout_ms > INT64_MAX / 2000)
		return INT64_MAX;
	return gf_now_us() + timeout_ms * 1000;
}

int gf_poll_timeout_ms(int64_t deadline_us)
{
	if (deadline_us == INT64_MAX)
		return -1;
	int64_t left = deadline_us - gf_now_us();
	if (left <= 0)
		return 0;
	/* Round up so a poll never wakes just before the deadline and spins. */
	int64_t ms = (left + 999) / 1000;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

int gf_random_bytes(void *buf, size_t len)
{
	uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return gf_err_errno(GF_ERR_IO, errno, "getrandom");
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

void gf_hex(const uint8_t *in, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < len; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * len] = '\0';
}

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int gf_unhex(const char *in, size_t len, uint8_t *out)
{
	for (size_t i = 0; i < len; i++) {
		int hi = hex_digit(in[2 * i]), lo = hi < 0 ? -1 : hex_digit(in[2 * i + 1]);
		if (lo < 0)
			return -1;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

void gf_close(int fd)
{
	if (fd >= 0) {
		int saved = errno;
		close(fd);
		errno = saved;
	}
}

void gf_close_fds(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		gf_close(fds[i]);
		fds[i] = -1;
	}
}

GF_EXPORT int gf_parse_duration_ms(const char *text, uint64_t *out_ms)
{
	static const struct {
		const char *unit;
		uint64_t num, den; /* value_ms = n * num / den */
	} units[] = {
		{ "us", 1, 1000 }, { "ms", 1, 1 }, { "s", 1000, 1 },
		{ "m", 60000, 1 }, { "h", 3600000, 1 },
	};
	uint64_t total_us = 0;
	const char *p = text;

	if (!text || !out_ms)
		return gf_err(GF_ERR_INVALID_ARG, "duration: NULL argument");
	if (!*p)
		return gf_err(GF_ERR_INVALID_ARG, "duration: empty string");
	while (*p) {
		uint64_t n = 0;
		const char *start = p;
		while (*p >= '0' && *p <= '9') {
			if (n > (UINT64_MAX - 9) / 10)
				return gf_err(GF_ERR_INVALID_ARG, "duration '%s': too large", text);
			n = n * 10 + (uint64_t)(*p - '0');
			p++;
		}
		if (p == start)
			return gf_err(GF_ERR_INVALID_ARG,
				      "duration '%s': expected a number such as 250ms, 10s or 2m", text);
		const char *u = p;
		while ((*p >= 'a' && *p <= 'z'))
			p++;
		size_t ulen = (size_t)(p - u);
		uint64_t us;
		if (ulen == 0) {
			if (start != text || *p)
				return gf_err(GF_ERR_INVALID_ARG, "duration '%s': missing unit", text);
			us = n; /* bare number: milliseconds */
			if (us > UINT64_MAX / 1000)
				return gf_err(GF_ERR_INVALID_ARG, "duration '%s': too large", text);
			us *= 1000;
		} else {
			size_t k;
			for (k = 0; k < GF_ARRAY_SIZE(units); k++)
				if (strlen(units[k].unit) == ulen && !strncmp(units[k].unit, u, ulen))
					break;
			if (k == GF_ARRAY_SIZE(units))
				return gf_err(GF_ERR_INVALID_ARG,
					      "duration '%s': unknown unit '%.*s' (use us, ms, s, m, h)", text,
					      (int)ulen, u);
			uint64_t mult_us = units[k].num * 1000 / units[k].den;
			if (mult_us && n > UINT64_MAX / mult_us)
				return gf_err(GF_ERR_INVALID_ARG, "duration '%s': too large", text);
			us = n * mult_us;
		}
		if (total_us > UINT64_MAX - us)
			return gf_err(GF_ERR_INVALID_ARG, "duration '%s': too large", text);
		total_us += us;
	}
	*out_ms = total_us / 1000;
	return 0;
}

bool gf_id_valid(const char *id)
{
	if (!id || !*id)
		return false;
	size_t n = 0;
	for (const unsigned char *p = (const unsigned char *)id; *p; p++, n++)
		if (*p <= ' ' || *p == '"' || *p == '\\' || *p == '=' || *p >= 0x7f || n + 1 >= GF_ID_MAX)
			return false;
	return true;
}

int gf_id_check(const char *id, const char *who)
{
	if (gf_id_valid(id))
		return 0;
	return gf_err(GF_ERR_INVALID_ARG,
		      "%s: engine id must be 1..%d bytes of printable ASCII without spaces, quotes, '\\' or '='", who,
		      GF_ID_MAX - 1);
}

bool gf_pool_uuid_parse(const char *s, char out[GF_POOL_UUID_MAX])
{
	static const int groups[] = { 8, 4, 4, 4, 12 };
	if (!s || (strncmp(s, "GPU-", 4) != 0 && strncmp(s, "MIG-", 4) != 0))
		return false;
	char buf[GF_POOL_UUID_MAX];
	memcpy(buf, s, 4);
	size_t o = 4;
	const char *p = s + 4;
	for (size_t g = 0; g < GF_ARRAY_SIZE(groups); g++) {
		if (g > 0) {
			if (*p != '-')
				return false;
			buf[o++] = *p++;
		}
		for (int i = 0; i < groups[g]; i++, p++) {
			if (!isxdigit((unsigned char)*p))
				return false;
			buf[o++] = (char)tolower((unsigned char)*p);
		}
	}
	if (*p)
		return false;
	buf[o] = '\0';
	memcpy(out, buf, o + 1);
	return true;
}

GF_EXPORT int gf_parse_bytes(const char *text, uint64_t *out)
{
	if (!text || !out)
		return gf_err(GF_ERR_INVALID_ARG, "size: NULL argument");
	static const struct {
		const char *suffix;
		unsigned shift;
	} units[] = {{"", 0}, {"B", 0}, {"K", 10}, {"k", 10}, {"KiB", 10}, {"M", 20}, {"MiB", 20},
		     {"G", 30}, {"GiB", 30}, {"T", 40}, {"TiB", 40}};
	char *end;
	errno = 0;
	unsigned long long v = text[0] >= '0' && text[0] <= '9' ? strtoull(text, &end, 10) : 0;
	if (text[0] < '0' || text[0] > '9' || errno)
		return gf_err(GF_ERR_INVALID_ARG, "size \"%.64s\": expected digits with an optional K, M, G or T", text);
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(end, units[i].suffix) != 0)
			continue;
		if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
			return gf_err(GF_ERR_INVALID_ARG, "size \"%.64s\" is too large", text);
		*out = (uint64_t)v << units[i].shift;
		return 0;
	}
	return gf_err(GF_ERR_INVALID_ARG, "size \"%.64s\": unknown suffix (use K, M, G or T)", text);
}
