/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the lock server's state-file parser. Whatever parses
 * must format and parse back to the same state. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "statefile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gf_lock_state st, back;
	if (gf_lock_state_parse((const char *)data, size, &st) < 0)
		return 0;
	char *text;
	if (gf_lock_state_format(&st, &text) < 0)
		return 0;
	if (gf_lock_state_parse(text, strlen(text), &back) < 0)
		abort();
	if (back.has_holder != st.has_holder || back.epoch != st.epoch ||
	    (st.has_holder && (strcmp(back.holder, st.holder) || memcmp(back.token, st.token, sizeof(st.token)) ||
			       back.pid != st.pid || back.granted_at_us != st.granted_at_us)))
		abort();
	free(text);
	return 0;
}
