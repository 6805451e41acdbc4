/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: arbitrary bytes as a metadata blob (lib/wire/metablob.c),
 * the GMS's list metadata a reader decodes. The count to expect is the one
 * in the header, so the fuzzer gets past it. Whatever decodes must be
 * NUL-terminated keys and values inside the input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "metablob.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct span {
	const uint8_t *lo, *hi;
	size_t n;
};

static int check(void *ud, const struct gf_lc_meta *e)
{
	struct span *s = ud;
	size_t k = strlen(e->key);
	if ((const uint8_t *)e->key < s->lo || (const uint8_t *)e->key + k >= s->hi || e->value < s->lo ||
	    e->value + e->value_len > s->hi)
		abort();
	s->n++;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* a copy of exactly @size bytes, so a read past the end is caught by the sanitizer */
	uint8_t *buf = malloc(size ? size : 1);
	if (!buf)
		return 0;
	memcpy(buf, data, size);
	uint32_t expect = 0;
	if (size >= 12)
		memcpy(&expect, buf + 8, 4);
	struct span s = {buf, buf + size, 0};
	if (gf_mb_decode(buf, size, expect, check, &s) == 0 && s.n != expect)
		abort();
	free(buf);
	return 0;
}
