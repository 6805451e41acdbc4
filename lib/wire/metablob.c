/* SPDX-License-Identifier: Apache-2.0 */
/* The metadata blob (metablob.h). */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "metablob.h"
#include "schema_limits.h"

#define ENTRY_FIXED 20 /* id, offset, key length, value length */
#define SEALS (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK)

static uint8_t *put_u16(uint8_t *p, uint16_t v)
{
	v = htole16(v);
	memcpy(p, &v, 2);
	return p + 2;
}

static uint8_t *put_u32(uint8_t *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
	return p + 4;
}

static uint8_t *put_u64(uint8_t *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
	return p + 8;
}

static uint16_t get_u16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return le16toh(v);
}

static uint32_t get_u32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return le32toh(v);
}

static uint64_t get_u64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

int gf_mb_make_memfd(const struct gf_lc_meta *m, size_t n, int *fd, uint64_t *size)
{
	if (n > UINT32_MAX)
		return gf_err(GF_ERR_INVALID_ARG, "metadata blob: %zu entries", n);
	size_t total = GF_MB_HEADER;
	for (size_t i = 0; i < n; i++) {
		size_t k = strlen(m[i].key);
		if (k == 0 || k >= GF_LIMIT_META_KEY || m[i].value_len > GF_LIMIT_META_VALUE)
			return gf_err(GF_ERR_INVALID_ARG, "metadata blob: key of %zu or value of %zu bytes", k, m[i].value_len);
		total += ENTRY_FIXED + k + 1 + m[i].value_len;
	}
	uint8_t *buf = malloc(total);
	if (!buf)
		return gf_err(GF_ERR_NOMEM, "metadata blob: out of memory for %zu bytes", total);
	uint8_t *p = buf;
	memcpy(p, "GFMB", 4);
	p = put_u32(put_u32(put_u32(p + 4, GF_MB_VERSION), (uint32_t)n), 0);
	for (size_t i = 0; i < n; i++) {
		size_t k = strlen(m[i].key);
		p = put_u64(put_u64(p, m[i].alloc_id), m[i].offset);
		p = put_u16(put_u16(p, (uint16_t)k), (uint16_t)m[i].value_len);
		memcpy(p, m[i].key, k + 1);
		p += k + 1;
		if (m[i].value_len)
			memcpy(p, m[i].value, m[i].value_len);
		p += m[i].value_len;
	}
	int rc = 0, f = memfd_create("gf-gms-metadata", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (f < 0)
		rc = gf_err_errno(errno == ENOMEM || errno == EMFILE || errno == ENFILE ? GF_ERR_NOMEM : GF_ERR_IO, errno,
				  "metadata blob: memfd_create");
	for (size_t at = 0; rc == 0 && at < total;) {
		ssize_t w = write(f, buf + at, total - at);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			rc = gf_err_errno(GF_ERR_NOMEM, w < 0 ? errno : ENOSPC, "metadata blob: write");
		else
			at += (size_t)w;
	}
	free(buf);
	if (rc == 0 && fcntl(f, F_ADD_SEALS, SEALS | F_SEAL_SEAL) < 0)
		rc = gf_err_errno(GF_ERR_IO, errno, "metadata blob: seal");
	if (rc < 0) {
		gf_close(f);
		return rc;
	}
	*fd = f;
	*size = total;
	return 0;
}

int gf_mb_read_fd(int fd, uint64_t size, uint8_t **buf)
{
	struct stat st;
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || (seals & SEALS) != SEALS)
		return gf_err(GF_ERR_PROTOCOL, "metadata blob: not a memfd sealed against writes and resizing");
	if (fstat(fd, &st) < 0)
		return gf_err_errno(GF_ERR_IO, errno, "metadata blob: fstat");
	if (size < GF_MB_HEADER || size > GF_MB_MAX_BYTES || (uint64_t)st.st_size != size)
		return gf_err(GF_ERR_PROTOCOL, "metadata blob: %lld bytes, announced %llu", (long long)st.st_size,
			      (unsigned long long)size);
	uint8_t *b = malloc((size_t)size);
	if (!b)
		return gf_err(GF_ERR_NOMEM, "metadata blob: out of memory for %llu bytes", (unsigned long long)size);
	for (size_t at = 0; at < size;) {
		ssize_t r = pread(fd, b + at, (size_t)size - at, (off_t)at);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			free(b);
			return r < 0 ? gf_err_errno(GF_ERR_IO, errno, "metadata blob: read")
				     : gf_err(GF_ERR_PROTOCOL, "metadata blob: ends at byte %zu", at);
		}
		at += (size_t)r;
	}
	*buf = b;
	return 0;
}

int gf_mb_decode(const uint8_t *buf, size_t len, uint32_t expect, gf_mb_fn fn, void *ud)
{
	if (len < GF_MB_HEADER || memcmp(buf, "GFMB", 4))
		return gf_err(GF_ERR_PROTOCOL, "metadata blob: no header");
	if (get_u32(buf + 4) != GF_MB_VERSION)
		return gf_err(GF_ERR_PROTOCOL, "metadata blob: version %u, this client reads %d", get_u32(buf + 4),
			      GF_MB_VERSION);
	uint32_t n = get_u32(buf + 8);
	if (n != expect || get_u32(buf + 12) != 0)
		return gf_err(GF_ERR_PROTOCOL, "metadata blob: %u entries, %u announced", n, expect);
	size_t at = GF_MB_HEADER;
	const char *prev = NULL;
	for (uint32_t i = 0; i < n; i++) {
		if (len - at < ENTRY_FIXED)
			return gf_err(GF_ERR_PROTOCOL, "metadata blob: entry %u truncated", i);
		struct gf_lc_meta e = {.alloc_id = get_u64(buf + at), .offset = get_u64(buf + at + 8)};
		size_t k = get_u16(buf + at + 16);
		e.value_len = get_u16(buf + at + 18);
		at += ENTRY_FIXED;
		if (k == 0 || k >= GF_LIMIT_META_KEY || e.value_len > GF_LIMIT_META_VALUE)
			return gf_err(GF_ERR_PROTOCOL, "metadata blob: entry %u: key of %zu or value of %zu bytes", i, k,
				      e.value_len);
		if (len - at < k + 1 + e.value_len)
			return gf_err(GF_ERR_PROTOCOL, "metadata blob: entry %u truncated", i);
		e.key = (const char *)buf + at;
		if (buf[at + k] != 0 || memchr(e.key, 0, k))
			return gf_err(GF_ERR_PROTOCOL, "metadata blob: entry %u: key not one NUL-terminated string", i);
		if (prev && strcmp(prev, e.key) >= 0)
			return gf_err(GF_ERR_PROTOCOL, "metadata blob: entry %u: keys not strictly ascending", i);
		e.value = buf + at + k + 1;
		at += k + 1 + e.value_len;
		prev = e.key;
		int rc = fn(ud, &e);
		if (rc < 0)
			return rc;
	}
	if (at != len)
		return gf_err(GF_ERR_PROTOCOL, "metadata blob: %zu bytes after the last entry", len - at);
	return 0;
}
