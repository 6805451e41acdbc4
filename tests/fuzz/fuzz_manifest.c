/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the GMS snapshot manifest parser. Whatever parses must
 * format and parse back to the same layout. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tiers_manifest *mf, *back;
	if (tiers_manifest_parse((const char *)data, size, &mf) < 0)
		return 0;
	char *text;
	size_t len;
	if (tiers_manifest_format(mf, &text, &len) < 0)
		abort();
	if (tiers_manifest_parse(text, len, &back) < 0)
		abort();
	if (back->nallocs != mf->nallocs || back->nmeta != mf->nmeta || back->total_bytes != mf->total_bytes ||
	    back->generation != mf->generation || memcmp(back->layout_hash, mf->layout_hash, 16) ||
	    strcmp(back->backend, mf->backend) || strcmp(back->device_uuid, mf->device_uuid))
		abort();
	for (size_t i = 0; i < mf->nallocs; i++)
		if (back->allocs[i].xxh3 != mf->allocs[i].xxh3 || strcmp(back->allocs[i].tag, mf->allocs[i].tag))
			abort();
	free(text);
	tiers_manifest_free(back);
	tiers_manifest_free(mf);
	return 0;
}
