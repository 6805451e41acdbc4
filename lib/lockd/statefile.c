/* SPDX-License-Identifier: Apache-2.0 */
/* The lock server's state file: parse, format, atomic store. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "statefile.h"

/* A state file is a few hundred bytes; anything much larger is not ours. */
#define STATE_MAX_SIZE (64 * 1024)

int gf_lock_state_parse(const char *buf, size_t len, struct gf_lock_state *out)
{
	struct gf_lock_state st;
	json_error_t jerr;
	int rc;
	memset(&st, 0, sizeof(st));
	if (!buf || len == 0)
		return gf_err(GF_ERR_PROTOCOL, "state file is empty (truncated?)");
	if (len > STATE_MAX_SIZE)
		return gf_err(GF_ERR_PROTOCOL, "state file is %zu bytes, more than a state file can be", len);
	json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return gf_err(GF_ERR_PROTOCOL, "state file is not valid JSON (line %d: %s)", jerr.line, jerr.text);
	if (!json_is_object(root)) {
		rc = gf_err(GF_ERR_PROTOCOL, "state file: top level is not an object");
		goto out;
	}
	json_t *v = json_object_get(root, "version");
	if (v && (!json_is_integer(v) || json_integer_value(v) != 1)) {
		rc = gf_err(GF_ERR_PROTOCOL, "state file: unsupported version");
		goto out;
	}
	v = json_object_get(root, "epoch");
	if (!json_is_integer(v) || json_integer_value(v) < 0) {
		rc = gf_err(GF_ERR_PROTOCOL, "state file: 'epoch' missing or not a non-negative integer");
		goto out;
	}
	st.epoch = (uint64_t)json_integer_value(v);
	v = json_object_get(root, "holder");
	if (!v) {
		rc = gf_err(GF_ERR_PROTOCOL, "state file: 'holder' missing");
		goto out;
	}
	if (json_is_string(v)) {
		size_t hl = json_string_length(v);
		const char *h = json_string_value(v);
		if (hl == 0 || hl >= sizeof(st.holder) || strlen(h) != hl) {
			rc = gf_err(GF_ERR_PROTOCOL, "state file: 'holder' empty, too long or with NUL bytes");
			goto out;
		}
		memcpy(st.holder, h, hl + 1);
		st.has_holder = true;
		if (st.epoch == 0) {
			rc = gf_err(GF_ERR_PROTOCOL, "state file: a holder with epoch 0");
			goto out;
		}
	} else if (!json_is_null(v)) {
		rc = gf_err(GF_ERR_PROTOCOL, "state file: 'holder' is neither a string nor null");
		goto out;
	}
	v = json_object_get(root, "session_token");
	if (st.has_holder || (v && !json_is_null(v))) {
		if (!json_is_string(v) || json_string_length(v) != 2 * GF_LOCK_TOKEN_LEN) {
			rc = gf_err(GF_ERR_PROTOCOL, "state file: 'session_token' is not %d hex digits",
				    2 * GF_LOCK_TOKEN_LEN);
			goto out;
		}
		if (gf_unhex(json_string_value(v), GF_LOCK_TOKEN_LEN, st.token) < 0) {
			rc = gf_err(GF_ERR_PROTOCOL, "state file: 'session_token' is not hex");
			goto out;
		}
	}
	v = json_object_get(root, "granted_at_us");
	if (v) {
		if (!json_is_integer(v)) {
			rc = gf_err(GF_ERR_PROTOCOL, "state file: 'granted_at_us' is not an integer");
			goto out;
		}
		st.granted_at_us = json_integer_value(v);
	}
	v = json_object_get(root, "pid");
	if (v && !json_is_null(v)) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX) {
			rc = gf_err(GF_ERR_PROTOCOL, "state file: 'pid' is not a pid");
			goto out;
		}
		st.pid = (uint32_t)json_integer_value(v);
	}
	*out = st;
	rc = 0;
out:
	json_decref(root);
	return rc;
}

static void format_time(int64_t wall_us, char *buf, size_t len)
{
	time_t t = (time_t)(wall_us / 1000000);
	struct tm tm;
	gmtime_r(&t, &tm);
	char base[32];
	strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, len, "%s.%06lldZ", base, (long long)(wall_us % 1000000));
}

/*
 * The same keys and order as always, and gf_lock_state_parse() reads it
 * back. A grant waits on this: a holder's id that keeps the id rule (no
 * quote, backslash or control byte) needs no JSON escaping, so the common
 * case is one snprintf; any other id is formatted by jansson.
 */
int gf_lock_state_format_buf(const struct gf_lock_state *st, char *buf, size_t cap)
{
	if (st->has_holder && gf_id_valid(st->holder)) {
		char tok[2 * GF_LOCK_TOKEN_LEN + 1], when[64];
		gf_hex(st->token, GF_LOCK_TOKEN_LEN, tok);
		format_time(st->granted_at_us, when, sizeof(when));
		int n = snprintf(buf, cap,
				 "{\"version\":1,\"holder\":\"%s\",\"epoch\":%llu,\"session_token\":\"%s\",\"granted_at\":\"%s\","
				 "\"granted_at_us\":%lld,\"pid\":%u}",
				 st->holder, (unsigned long long)st->epoch, tok, when, (long long)st->granted_at_us,
				 (unsigned)st->pid);
		if (n < 0 || (size_t)n >= cap)
			return gf_err(GF_ERR_INVALID_ARG, "state file: formatted state does not fit in %zu bytes", cap);
		return n;
	}
	json_t *j;
	if (st->has_holder) {
		char tok[2 * GF_LOCK_TOKEN_LEN + 1], when[64];
		gf_hex(st->token, GF_LOCK_TOKEN_LEN, tok);
		format_time(st->granted_at_us, when, sizeof(when));
		j = json_pack("{s:i,s:s,s:I,s:s,s:s,s:I,s:I}", "version", 1, "holder", st->holder, "epoch",
			      (json_int_t)st->epoch, "session_token", tok, "granted_at", when, "granted_at_us",
			      (json_int_t)st->granted_at_us, "pid", (json_int_t)st->pid);
	} else {
		j = json_pack("{s:i,s:n,s:I,s:n}", "version", 1, "holder", "epoch", (json_int_t)st->epoch,
			      "session_token");
	}
	if (!j)
		return gf_err(GF_ERR_NOMEM, "state file: cannot build the JSON document");
	size_t n = json_dumpb(j, buf, cap, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(j);
	if (n == 0 || n >= cap)
		return gf_err(GF_ERR_INVALID_ARG, "state file: formatted state does not fit in %zu bytes", cap);
	buf[n] = '\0';
	return (int)n;
}

int gf_lock_state_format(const struct gf_lock_state *st, char **out)
{
	char buf[GF_LOCK_STATE_TEXT_MAX];
	int n = gf_lock_state_format_buf(st, buf, sizeof(buf));
	if (n < 0)
		return n;
	char *text = malloc((size_t)n + 1);
	if (!text)
		return gf_err(GF_ERR_NOMEM, "state file: out of memory");
	memcpy(text, buf, (size_t)n + 1);
	*out = text;
	return 0;
}

int gf_lock_state_load(const char *path, struct gf_lock_state *out)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gf_err_errno(errno == ENOENT ? GF_ERR_NOT_FOUND : GF_ERR_IO, errno, "open %s", path);
	char *buf = malloc(STATE_MAX_SIZE + 1);
	size_t got = 0;
	int rc = 0;
	if (!buf) {
		gf_close(fd);
		return gf_err(GF_ERR_NOMEM, "state file: out of memory");
	}
	for (;;) {
		ssize_t n = read(fd, buf + got, STATE_MAX_SIZE + 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = gf_err_errno(GF_ERR_IO, errno, "read %s", path);
			break;
		}
		if (n == 0 || (got += (size_t)n) > STATE_MAX_SIZE)
			break;
	}
	gf_close(fd);
	if (rc == 0)
		rc = gf_lock_state_parse(buf, got, out);
	free(buf);
	return rc;
}

static int write_all(int fd, const char *p, size_t len)
{
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int gf_lock_state_prepare(int dirfd, const char *tmpname)
{
	int fd = openat(dirfd, tmpname, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return gf_err_errno(GF_ERR_IO, errno, "state file: create %s", tmpname);
	/* The block (a page on tmpfs) the state will take, allocated now and
	 * not by the write a grant waits on; a hint, the size stays 0. */
	(void)fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, GF_LOCK_STATE_TEXT_MAX);
	return fd;
}

int gf_lock_state_store_at(int dirfd, const char *name, const char *tmpname, const struct gf_lock_state *st)
{
	return gf_lock_state_store_prepared(dirfd, name, tmpname, -1, st);
}

int gf_lock_state_store_prepared(int dirfd, const char *name, const char *tmpname, int fd,
				 const struct gf_lock_state *st)
{
	char text[GF_LOCK_STATE_TEXT_MAX + 1];
	int len = gf_lock_state_format_buf(st, text, sizeof(text) - 1);
	if (len < 0) {
		gf_close(fd);
		return len;
	}
	text[len++] = '\n';
	int rc;
	if (fd < 0 && (fd = gf_lock_state_prepare(dirfd, tmpname)) < 0)
		return fd;
	/* fdatasync: the temp file is new, so its size (the only metadata
	 * needed to read the data back) is flushed with the data. */
	if (write_all(fd, text, (size_t)len) < 0 || fdatasync(fd) < 0) {
		rc = gf_err_errno(GF_ERR_IO, errno, "state file: write %s", tmpname);
		gf_close(fd);
		unlinkat(dirfd, tmpname, 0);
		return rc;
	}
	gf_close(fd);
	/* Swap the names where the filesystem can: atomic like a rename, and the
	 * old state's file is not torn down now but emptied by the next
	 * prepare, after the grant. A first store (nothing to swap) renames. */
	if (renameat2(dirfd, tmpname, dirfd, name, RENAME_EXCHANGE) == 0)
		goto renamed;
	if (renameat(dirfd, tmpname, dirfd, name) < 0) {
		rc = gf_err_errno(GF_ERR_IO, errno, "state file: rename %s to %s", tmpname, name);
		unlinkat(dirfd, tmpname, 0);
		return rc;
	}
renamed:
	/* The rename is durable only once the directory is. */
	if (fsync(dirfd) < 0)
		return gf_err_errno(GF_ERR_IO, errno, "state file: fsync directory of %s", name);
	return 0;
}

int gf_lock_state_open_dir(const char *path, int *dirfd, char **name, char **tmpname)
{
	char dir[4096], base[4096];
	if (snprintf(dir, sizeof(dir), "%s", path) >= (int)sizeof(dir))
		return gf_err(GF_ERR_INVALID_ARG, "state file path too long");
	snprintf(base, sizeof(base), "%s", path);
	const char *b = basename(base);
	char *n = strdup(b), *t = malloc(strlen(b) + 5);
	if (!n || !t) {
		free(n);
		free(t);
		return gf_err(GF_ERR_NOMEM, "state file: out of memory");
	}
	sprintf(t, "%s.tmp", b);
	int fd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		free(n);
		free(t);
		return gf_err_errno(GF_ERR_IO, errno, "state file: open directory of %s", path);
	}
	*dirfd = fd;
	*name = n;
	*tmpname = t;
	return 0;
}

int gf_lock_state_store(const char *path, const struct gf_lock_state *st)
{
	int dirfd;
	char *name, *tmpname;
	int rc = gf_lock_state_open_dir(path, &dirfd, &name, &tmpname);
	if (rc < 0)
		return rc;
	rc = gf_lock_state_store_at(dirfd, name, tmpname, st);
	gf_close(dirfd);
	free(name);
	free(tmpname);
	return rc;
}
