/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the library's safetensors reader (it reads files from
 * outside). Whatever parses must tile the data area inside the input, in
 * order, with sizes that match dtype and shape. */
#include <stdint.h>
#include <stdlib.h>

#include "gpufailover/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	gf_safetensors *st;
	if (gf_safetensors_parse(&st, data, size) != 0)
		return 0;
	uint64_t at = 0, base = gf_safetensors_data_offset(st);
	for (size_t i = 0; i < gf_safetensors_count(st); i++) {
		struct gf_safetensors_tensor t;
		if (gf_safetensors_at(st, i, &t) || t.begin != at || t.end < t.begin ||
		    (const uint8_t *)t.data != data + base + t.begin)
			abort();
		uint64_t count = 1;
		for (unsigned d = 0; d < t.ndim; d++)
			count *= t.shape[d];
		if (count * t.dtype_bits / 8 != t.end - t.begin)
			abort();
		at = t.end;
	}
	if (base + at != size)
		abort();
	gf_safetensors_free(st);
	return 0;
}
