/* SPDX-License-Identifier: Apache-2.0 */
/* Writes seed inputs for fuzz_frame: one valid frame per message kind. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static void put(const char *dir, const char *name, const gf_Msg *m)
{
	uint8_t *body, hdr[GF_FRAME_HEADER_SIZE] = { 'G', 'F', GF_FRAME_WIRE_VERSION, 0 };
	size_t len;
	char path[512];
	if (gf_msg_encode(m, &body, &len) < 0)
		exit(1);
	for (int i = 0; i < 4; i++)
		hdr[8 + i] = (uint8_t)(len >> (8 * i));
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	fwrite(hdr, 1, sizeof(hdr), f);
	fwrite(body, 1, len, f);
	fclose(f);
	free(body);
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : ".";
	gf_Msg *m = gf_msg_new();
	m->which_body = gf_Msg_hello_tag;
	m->body.hello.version = GF_PROTOCOL_VERSION;
	m->body.hello.component = gf_Component_COMPONENT_LOCK;
	strcpy(m->body.hello.peer_id, "engine-a");
	put(dir, "hello", m);
	memset(m, 0, sizeof(*m));
	m->which_body = gf_Msg_lock_acquire_tag;
	strcpy(m->body.lock_acquire.engine_id, "engine-b");
	m->body.lock_acquire.timeout_ms = 1000;
	m->body.lock_acquire.session_token.size = 32;
	put(dir, "lock_acquire", m);
	memset(m, 0, sizeof(*m));
	m->which_body = gf_Msg_lock_status_tag;
	strcpy(m->body.lock_status.holder, "a");
	m->body.lock_status.waiters_count = 2;
	strcpy(m->body.lock_status.waiters[0].engine_id, "b");
	strcpy(m->body.lock_status.waiters[1].engine_id, "c");
	put(dir, "lock_status", m);
	memset(m, 0, sizeof(*m));
	m->which_body = gf_Msg_gms_list_chunk_tag;
	m->body.gms_list_chunk.allocations_count = 2;
	m->body.gms_list_chunk.allocations[0].id = 1;
	m->body.gms_list_chunk.allocations[0].size = 2 << 20;
	m->body.gms_list_chunk.metadata_count = 1;
	strcpy(m->body.gms_list_chunk.metadata[0].key, "layer.0.weight");
	m->body.gms_list_chunk.metadata[0].value.size = 8;
	m->body.gms_list_chunk.last = true;
	put(dir, "gms_list_chunk", m);
	memset(m, 0, sizeof(*m));
	gf_msg_set_error(m, GF_ERR_STALE_LAYOUT, "layout changed");
	put(dir, "error", m);
	gf_msg_free(m);
	return 0;
}
