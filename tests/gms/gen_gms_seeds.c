/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Writes the seed corpus of the 'gms' fuzz target: client sessions as raw
 * frame bytes. usage: gen-gms-seeds DIR (tests/fuzz/corpus/gms).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wire.h"

static int sv[2];

static void put(gf_Msg *m)
{
	if (gf_msg_send(sv[0], m, NULL, 0, INT64_MAX) < 0)
		exit(1);
	memset(m, 0, sizeof(*m));
}

static void hello(gf_Msg *m)
{
	m->which_body = gf_Msg_hello_tag;
	m->body.hello.version = GF_PROTOCOL_VERSION;
	m->body.hello.component = gf_Component_COMPONENT_GMS;
	snprintf(m->body.hello.peer_id, sizeof(m->body.hello.peer_id), "seed");
	put(m);
}

static void gms_connect(gf_Msg *m, int mode)
{
	m->which_body = gf_Msg_gms_connect_tag;
	m->body.gms_connect.mode = mode;
	m->body.gms_connect.timeout_ms = 0;
	put(m);
}

static void flush_to(const char *dir, const char *name)
{
	char path[4096], buf[65536];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f)
		exit(1);
	for (;;) {
		ssize_t n = recv(sv[1], buf, sizeof(buf), MSG_DONTWAIT);
		if (n <= 0)
			break;
		fwrite(buf, 1, (size_t)n, f);
	}
	fclose(f);
}

int main(int argc, char **argv)
{
	if (argc != 2 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
		return 2;
	gf_Msg *m = gf_msg_new();
	/* a writer session: allocate, metadata, commit, list, status */
	hello(m);
	gms_connect(m, gf_GmsMode_GMS_MODE_RW_OR_RO);
	for (int i = 0; i < 2; i++) {
		m->which_body = gf_Msg_gms_allocate_tag;
		m->body.gms_allocate.size = 4096 << i;
		snprintf(m->body.gms_allocate.tag, sizeof(m->body.gms_allocate.tag), "w%d", i);
		put(m);
	}
	m->which_body = gf_Msg_gms_meta_put_tag;
	snprintf(m->body.gms_meta_put.key, sizeof(m->body.gms_meta_put.key), "layer.0");
	m->body.gms_meta_put.allocation_id = 2;
	m->body.gms_meta_put.offset = 16;
	m->body.gms_meta_put.value.size = 3;
	memcpy(m->body.gms_meta_put.value.bytes, "abc", 3);
	put(m);
	m->which_body = gf_Msg_gms_commit_tag;
	put(m);
	m->which_body = gf_Msg_gms_list_tag;
	m->body.gms_list.with_fds = true;
	put(m);
	m->which_body = gf_Msg_gms_status_request_tag;
	put(m);
	flush_to(argv[1], "writer-session");
	/* a reader session */
	hello(m);
	gms_connect(m, gf_GmsMode_GMS_MODE_RO);
	m->which_body = gf_Msg_gms_list_tag;
	m->body.gms_list.without_metadata = true;
	put(m);
	flush_to(argv[1], "reader-session");
	/* wrong-mode calls and a status */
	hello(m);
	m->which_body = gf_Msg_gms_allocate_tag;
	m->body.gms_allocate.size = 1;
	put(m);
	m->which_body = gf_Msg_gms_status_request_tag;
	put(m);
	flush_to(argv[1], "wrong-mode");
	/* demotion requests: an unknown tier, a named one, the policy's choice, then a reader */
	hello(m);
	const char *tos[] = { "lukewarm", "warm", "" };
	for (size_t i = 0; i < sizeof(tos) / sizeof(tos[0]); i++) {
		m->which_body = gf_Msg_gms_demote_tag;
		snprintf(m->body.gms_demote.to, sizeof(m->body.gms_demote.to), "%s", tos[i]);
		put(m);
	}
	gms_connect(m, gf_GmsMode_GMS_MODE_RO);
	flush_to(argv[1], "demote");
	/* a writer reporting progress (a report without RW first), then a reader waiting by progress */
	hello(m);
	m->which_body = gf_Msg_gms_progress_tag;
	m->body.gms_progress.done_bytes = 1;
	put(m);
	gms_connect(m, gf_GmsMode_GMS_MODE_RW);
	m->which_body = gf_Msg_gms_progress_tag;
	m->body.gms_progress.done_bytes = 4096;
	m->body.gms_progress.total_bytes = 8192;
	put(m);
	gms_connect(m, gf_GmsMode_GMS_MODE_RO);
	m->body.gms_connect.by_progress = true;
	m->body.gms_connect.timeout_ms = 10;
	put(m);
	flush_to(argv[1], "progress");
	/* the KV pool: its directory read, a publish without a map, a map without a grant, a map with one the GMS cannot check */
	hello(m);
	m->which_body = gf_Msg_gms_kv_dir_request_tag;
	put(m);
	m->which_body = gf_Msg_gms_kv_publish_tag;
	m->body.gms_kv_publish.epoch = 1;
	m->body.gms_kv_publish.add_count = 1;
	m->body.gms_kv_publish.add[0].index = 3;
	m->body.gms_kv_publish.add[0].hash.size = 4;
	m->body.gms_kv_publish.remove_count = 1;
	m->body.gms_kv_publish.remove[0] = 7;
	put(m);
	m->which_body = gf_Msg_gms_kv_map_tag;
	m->body.gms_kv_map.size = 1 << 20;
	m->body.gms_kv_map.block_bytes = 4096;
	m->body.gms_kv_map.layout_hash.size = 16;
	put(m);
	m->which_body = gf_Msg_gms_kv_map_tag;
	m->body.gms_kv_map.size = 1 << 20;
	m->body.gms_kv_map.block_bytes = 4096;
	m->body.gms_kv_map.layout_hash.size = 16;
	m->body.gms_kv_map.lock_epoch = 5;
	m->body.gms_kv_map.lock_proof.size = 32;
	put(m);
	gms_connect(m, gf_GmsMode_GMS_MODE_RO);
	flush_to(argv[1], "kv-pool");
	gf_msg_free(m);
	return 0;
}
