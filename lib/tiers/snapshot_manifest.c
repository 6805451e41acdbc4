/* SPDX-License-Identifier: Apache-2.0 */
/* The snapshot manifest: versioned JSON (jansson), parsed strictly (snapshot.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common.h"
#include "layout.h"
#include "snapshot.h"

struct tiers_manifest *tiers_manifest_new(void)
{
	struct tiers_manifest *mf = calloc(1, sizeof(*mf));
	if (mf)
		mf->version = TIERS_SNAP_VERSION;
	return mf;
}

void tiers_manifest_free(struct tiers_manifest *mf)
{
	if (!mf)
		return;
	for (size_t i = 0; i < mf->nmeta; i++) {
		free(mf->meta[i].key);
		free(mf->meta[i].value);
	}
	free(mf->meta);
	free(mf->allocs);
	free(mf);
}

int tiers_manifest_layout_hash(const struct tiers_manifest *mf, uint8_t out[16])
{
	uint64_t *sizes = malloc((mf->nallocs ? mf->nallocs : 1) * sizeof(*sizes));
	struct gms_layout_meta *lm = malloc((mf->nmeta ? mf->nmeta : 1) * sizeof(*lm));
	int rc = 0;
	if (!sizes || !lm) {
		rc = gf_err(GF_ERR_NOMEM, "snapshot: layout hash: out of memory");
		goto out;
	}
	for (size_t i = 0; i < mf->nallocs; i++)
		sizes[i] = mf->allocs[i].size;
	for (size_t i = 0; i < mf->nmeta; i++)
		lm[i] = (struct gms_layout_meta){ .key = mf->meta[i].key,
						  .alloc_index = mf->meta[i].alloc_id - 1,
						  .offset = mf->meta[i].offset,
						  .value = mf->meta[i].value,
						  .value_len = mf->meta[i].value_len };
	if (gms_layout_hash(sizes, mf->nallocs, lm, mf->nmeta, out) < 0)
		rc = gf_err(GF_ERR_NOMEM, "snapshot: layout hash: out of memory");
out:
	free(sizes);
	free(lm);
	return rc;
}

/* ---------------------------------------------------------------- format */

static json_t *hex_string(const uint8_t *b, size_t n)
{
	char *s = malloc(2 * n + 1);
	if (!s)
		return NULL;
	gf_hex(b, n, s);
	s[2 * n] = 0;
	json_t *j = json_stringn(s, 2 * n);
	free(s);
	return j;
}

static json_t *u64_hex(uint64_t v)
{
	char s[17];
	snprintf(s, sizeof(s), "%016" PRIx64, v);
	return json_string(s);
}

/* Integers go out as JSON numbers only while jansson's json_int_t holds them
 * exactly; every field that can exceed that (checksums) is hex text. */
static int set_new(json_t *o, const char *k, json_t *v)
{
	return v ? json_object_set_new(o, k, v) : -1;
}

int tiers_manifest_format(const struct tiers_manifest *mf, char **text, size_t *len)
{
	json_t *root = json_object(), *allocs = json_array(), *meta = json_array();
	int bad = !root || !allocs || !meta;
	bad |= set_new(root, "format", json_string(TIERS_SNAP_FORMAT));
	bad |= set_new(root, "version", json_integer(mf->version));
	bad |= set_new(root, "backend", json_string(mf->backend));
	bad |= set_new(root, "device_uuid", json_string(mf->device_uuid));
	bad |= set_new(root, "granularity", json_integer((json_int_t)mf->granularity));
	bad |= set_new(root, "generation", json_integer((json_int_t)mf->generation));
	bad |= set_new(root, "layout_hash", hex_string(mf->layout_hash, 16));
	bad |= set_new(root, "created_unix_ms", json_integer(mf->created_unix_ms));
	bad |= set_new(root, "total_bytes", json_integer((json_int_t)mf->total_bytes));
	for (size_t i = 0; !bad && i < mf->nallocs; i++) {
		const struct tiers_snap_alloc *a = &mf->allocs[i];
		json_t *o = json_object();
		bad |= !o || json_array_append_new(allocs, o);
		bad |= set_new(o, "id", json_integer((json_int_t)a->id));
		bad |= set_new(o, "size", json_integer((json_int_t)a->size));
		bad |= set_new(o, "offset", json_integer((json_int_t)a->offset));
		bad |= set_new(o, "xxh3", u64_hex(a->xxh3));
		/* Tags and keys that are not UTF-8 cannot be JSON strings: those go as hex. */
		json_t *tag = json_stringn(a->tag, strnlen(a->tag, sizeof(a->tag)));
		bad |= tag ? json_object_set_new(o, "tag", tag)
			   : set_new(o, "tag_hex", hex_string((const uint8_t *)a->tag, strnlen(a->tag, sizeof(a->tag))));
	}
	for (size_t i = 0; !bad && i < mf->nmeta; i++) {
		const struct tiers_snap_meta *e = &mf->meta[i];
		json_t *o = json_object();
		bad |= !o || json_array_append_new(meta, o);
		json_t *key = json_string(e->key);
		bad |= key ? json_object_set_new(o, "key", key)
			   : set_new(o, "key_hex", hex_string((const uint8_t *)e->key, strlen(e->key)));
		bad |= set_new(o, "alloc_id", json_integer((json_int_t)e->alloc_id));
		bad |= set_new(o, "offset", json_integer((json_int_t)e->offset));
		bad |= set_new(o, "value_hex", hex_string(e->value, e->value_len));
	}
	if (!bad)
		bad |= json_object_set(root, "allocations", allocs) | json_object_set(root, "metadata", meta);
	char *s = bad ? NULL : json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
	json_decref(allocs);
	json_decref(meta);
	json_decref(root);
	if (!s)
		return gf_err(GF_ERR_NOMEM, "snapshot manifest: out of memory while formatting");
	*text = s;
	*len = strlen(s);
	return 0;
}

/* ---------------------------------------------------------------- parse */

static int bad_field(const char *where, const char *what)
{
	return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %s: %s", where, what);
}

static int get_u64(json_t *o, const char *k, const char *where, uint64_t *out)
{
	json_t *v = json_object_get(o, k);
	*out = 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %s: \"%s\" missing or not a non-negative integer", where, k);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

/* A hex string field of at most @max decoded bytes (exactly @max when @exact). */
static int get_hex(json_t *o, const char *k, const char *where, size_t max, bool exact, uint8_t *out, size_t *n)
{
	json_t *v = json_object_get(o, k);
	if (!json_is_string(v))
		return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %s: \"%s\" missing or not a string", where, k);
	size_t l = json_string_length(v);
	if (l % 2 || l / 2 > max || (exact && l / 2 != max) || gf_unhex(json_string_value(v), l / 2, out) < 0)
		return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %s: \"%s\" is not %s%zu bytes of hex", where, k,
			      exact ? "" : "at most ", max);
	if (n)
		*n = l / 2;
	return 0;
}

/* A text field or its hex form (for bytes that are not UTF-8): NUL-free, 1..@max bytes (0 allowed when @may_be_empty). */
static int get_text(json_t *o, const char *k, const char *where, size_t max, bool may_be_empty, char *out)
{
	char khex[32];
	snprintf(khex, sizeof(khex), "%s_hex", k);
	json_t *v = json_object_get(o, k);
	size_t n;
	if (json_is_string(v)) {
		n = json_string_length(v);
		if (n > max)
			return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %s: \"%s\" longer than %zu bytes", where, k, max);
		memcpy(out, json_string_value(v), n);
	} else if (json_object_get(o, khex)) {
		int rc = get_hex(o, khex, where, max, false, (uint8_t *)out, &n);
		if (rc < 0)
			return rc;
	} else {
		return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %s: \"%s\" missing or not a string", where, k);
	}
	out[n] = 0;
	if (strlen(out) != n || (!n && !may_be_empty))
		return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %s: \"%s\" is empty or contains a NUL byte", where, k);
	return 0;
}

static int parse_allocs(json_t *arr, struct tiers_manifest *mf)
{
	if (!json_is_array(arr))
		return bad_field("allocations", "missing or not an array");
	size_t n = json_array_size(arr);
	if (n > TIERS_SNAP_MAX_ALLOCS)
		return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %zu allocations, at most %d", n, TIERS_SNAP_MAX_ALLOCS);
	mf->allocs = calloc(n ? n : 1, sizeof(*mf->allocs));
	if (!mf->allocs)
		return gf_err(GF_ERR_NOMEM, "snapshot manifest: out of memory");
	uint64_t at = 0;
	for (size_t i = 0; i < n; i++) {
		json_t *o = json_array_get(arr, i);
		struct tiers_snap_alloc *a = &mf->allocs[i];
		char where[48];
		uint8_t x[8];
		snprintf(where, sizeof(where), "allocation %zu", i);
		if (!json_is_object(o))
			return bad_field(where, "not an object");
		int rc = get_u64(o, "id", where, &a->id);
		if (rc == 0)
			rc = get_u64(o, "size", where, &a->size);
		if (rc == 0)
			rc = get_u64(o, "offset", where, &a->offset);
		if (rc == 0)
			rc = get_hex(o, "xxh3", where, 8, true, x, NULL);
		if (rc == 0)
			rc = get_text(o, "tag", where, sizeof(a->tag) - 1, true, a->tag);
		if (rc < 0)
			return rc;
		for (int b = 0; b < 8; b++)
			a->xxh3 = a->xxh3 << 8 | x[b];
		mf->nallocs = i + 1;
		if (a->id != i + 1)
			return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %s: id %" PRIu64 ", expected %zu (ids are 1..n in order)",
				      where, a->id, i + 1);
		if (a->size == 0 || a->size % mf->granularity)
			return gf_err(GF_ERR_PROTOCOL,
				      "snapshot manifest: %s: size %" PRIu64 " is not a positive multiple of the granularity %" PRIu64,
				      where, a->size, mf->granularity);
		if (a->offset != at)
			return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %s: offset %" PRIu64 ", expected %" PRIu64
				      " (allocations are stored back to back)", where, a->offset, at);
		if (a->size > UINT64_MAX - at)
			return bad_field(where, "sizes overflow");
		at += a->size;
	}
	if (at != mf->total_bytes)
		return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: allocations add up to %" PRIu64 " bytes, total_bytes says %" PRIu64,
			      at, mf->total_bytes);
	return 0;
}

static int parse_meta(json_t *arr, struct tiers_manifest *mf)
{
	if (!json_is_array(arr))
		return bad_field("metadata", "missing or not an array");
	size_t n = json_array_size(arr);
	if (n > TIERS_SNAP_MAX_META)
		return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %zu metadata entries, at most %d", n, TIERS_SNAP_MAX_META);
	mf->meta = calloc(n ? n : 1, sizeof(*mf->meta));
	if (!mf->meta)
		return gf_err(GF_ERR_NOMEM, "snapshot manifest: out of memory");
	char key[TIERS_SNAP_MAX_KEY + 1];
	uint8_t value[TIERS_SNAP_MAX_VALUE];
	for (size_t i = 0; i < n; i++) {
		json_t *o = json_array_get(arr, i);
		struct tiers_snap_meta *e = &mf->meta[i];
		char where[48];
		size_t vlen = 0;
		snprintf(where, sizeof(where), "metadata entry %zu", i);
		if (!json_is_object(o))
			return bad_field(where, "not an object");
		int rc = get_text(o, "key", where, TIERS_SNAP_MAX_KEY, false, key);
		if (rc == 0)
			rc = get_u64(o, "alloc_id", where, &e->alloc_id);
		if (rc == 0)
			rc = get_u64(o, "offset", where, &e->offset);
		if (rc == 0)
			rc = get_hex(o, "value_hex", where, TIERS_SNAP_MAX_VALUE, false, value, &vlen);
		if (rc < 0)
			return rc;
		e->key = strdup(key);
		e->value = malloc(vlen ? vlen : 1);
		mf->nmeta = i + 1;
		if (!e->key || !e->value)
			return gf_err(GF_ERR_NOMEM, "snapshot manifest: out of memory");
		memcpy(e->value, value, vlen);
		e->value_len = vlen;
		if (e->alloc_id == 0 || e->alloc_id > mf->nallocs)
			return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %s: allocation %" PRIu64 " does not exist", where,
				      e->alloc_id);
		if (e->offset >= mf->allocs[e->alloc_id - 1].size)
			return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: %s: offset %" PRIu64 " outside allocation %" PRIu64,
				      where, e->offset, e->alloc_id);
		/* The server keeps keys unique and sorted; equal or unordered neighbours mean an edited file. */
		if (i > 0 && strcmp(mf->meta[i - 1].key, e->key) >= 0)
			return bad_field(where, "keys not strictly sorted (duplicate or reordered entry)");
	}
	return 0;
}

static int parse_root(json_t *root, struct tiers_manifest *mf)
{
	if (!json_is_object(root))
		return bad_field("top level", "not an object");
	json_t *fmt = json_object_get(root, "format");
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), TIERS_SNAP_FORMAT) != 0)
		return bad_field("format", "missing or not \"" TIERS_SNAP_FORMAT "\"");
	uint64_t v;
	int rc = get_u64(root, "version", "top level", &v);
	if (rc < 0)
		return rc;
	if (v != TIERS_SNAP_VERSION)
		return gf_err(GF_ERR_VERSION, "snapshot manifest: format version %" PRIu64 ", this library reads version %d",
			      v, TIERS_SNAP_VERSION);
	mf->version = (unsigned)v;
	uint64_t created;
	rc = get_text(root, "backend", "top level", sizeof(mf->backend) - 1, false, mf->backend);
	if (rc == 0)
		rc = get_text(root, "device_uuid", "top level", sizeof(mf->device_uuid) - 1, false, mf->device_uuid);
	if (rc == 0)
		rc = get_u64(root, "granularity", "top level", &mf->granularity);
	if (rc == 0)
		rc = get_u64(root, "generation", "top level", &mf->generation);
	if (rc == 0)
		rc = get_hex(root, "layout_hash", "top level", 16, true, mf->layout_hash, NULL);
	if (rc == 0)
		rc = get_u64(root, "created_unix_ms", "top level", &created);
	if (rc == 0)
		rc = get_u64(root, "total_bytes", "top level", &mf->total_bytes);
	if (rc < 0)
		return rc;
	mf->created_unix_ms = (int64_t)created;
	if (mf->granularity == 0 || (mf->granularity & (mf->granularity - 1)))
		return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: granularity %" PRIu64 " is not a power of two", mf->granularity);
	rc = parse_allocs(json_object_get(root, "allocations"), mf);
	if (rc == 0)
		rc = parse_meta(json_object_get(root, "metadata"), mf);
	if (rc < 0)
		return rc;
	uint8_t h[16];
	rc = tiers_manifest_layout_hash(mf, h);
	if (rc < 0)
		return rc;
	if (memcmp(h, mf->layout_hash, 16) != 0)
		return bad_field("layout_hash", "does not match the allocation table and metadata (edited or corrupt)");
	return 0;
}

/* The manifest from parsed JSON (@root, NULL when it did not parse: @jerr says why). */
static int from_json(json_t *root, const json_error_t *jerr, struct tiers_manifest **out)
{
	if (!root) {
		/* jansson quotes the text it stopped at ("... near 'root:$6$...'"): the
		 * file may be anything a caller pointed at, so say where, never what. */
		char why[sizeof(jerr->text)];
		snprintf(why, sizeof(why), "%s", jerr->text);
		char *near = strstr(why, " near ");
		if (near)
			*near = '\0';
		return gf_err(GF_ERR_PROTOCOL, "snapshot manifest: not JSON: line %d column %d: %s", jerr->line,
			      jerr->column, why);
	}
	struct tiers_manifest *mf = tiers_manifest_new();
	int rc = mf ? parse_root(root, mf) : gf_err(GF_ERR_NOMEM, "snapshot manifest: out of memory");
	json_decref(root);
	if (rc < 0) {
		tiers_manifest_free(mf);
		return rc;
	}
	*out = mf;
	return 0;
}

int tiers_manifest_parse(const char *text, size_t len, struct tiers_manifest **out)
{
	if (!text || !out)
		return gf_err(GF_ERR_INVALID_ARG, "snapshot manifest: NULL argument");
	json_error_t jerr;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	return from_json(root, &jerr, out);
}

struct fd_source {
	int fd;
	uint64_t left;
	int err; /* errno of a failed read (0: none) */
};

static size_t fd_source_read(void *buf, size_t n, void *ud)
{
	struct fd_source *src = ud;
	if (n > src->left)
		n = (size_t)src->left;
	for (;;) {
		ssize_t r = n ? read(src->fd, buf, n) : 0;
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			src->err = errno;
			return (size_t)-1;
		}
		src->left -= (uint64_t)r;
		return (size_t)r;
	}
}

int tiers_manifest_read(int fd, uint64_t len, struct tiers_manifest **out)
{
	if (fd < 0 || !out)
		return gf_err(GF_ERR_INVALID_ARG, "snapshot manifest: bad argument");
	struct fd_source src = { .fd = fd, .left = len };
	json_error_t jerr;
	json_t *root = json_load_callback(fd_source_read, &src, JSON_REJECT_DUPLICATES, &jerr);
	if (!root && src.err)
		return gf_err_errno(GF_ERR_IO, src.err, "snapshot manifest: read");
	return from_json(root, &jerr, out);
}
