/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the example engine's safetensors reader (it reads files
 * from outside). Whatever parses must describe tensors inside the input. */
#include <stdint.h>
#include <stdlib.h>

#include "../../examples/c-engine/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_file f;
	char err[256];
	if (st_parse(data, size, &f, err, sizeof(err)) != 0)
		return 0;
	for (size_t i = 0; i < f.n; i++) {
		const struct st_tensor *t = &f.t[i];
		if (t->begin > t->end || t->end > f.data_len || t->data < data || t->data + (t->end - t->begin) > data + size)
			abort();
		if (i > 0 && t->begin < f.t[i - 1].begin)
			abort();
	}
	st_close(&f);
	return 0;
}
