/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The wire schema's field limits, named once. lib/proto/gpufailover.options
 * is the source; every limit below is tied by a static assert to the size
 * nanopb generated from it, so changing one without the other fails the
 * build. Code that restates a limit (client checks, server tables, the
 * hand-written list-chunk encoder, the engine) uses these names.
 */
#ifndef GF_WIRE_SCHEMA_LIMITS_H
#define GF_WIRE_SCHEMA_LIMITS_H

#include "common.h"
#include "gpufailover.pb.h"

/* String limits are buffer sizes including the NUL: at most LIMIT-1 bytes of text. */
#define GF_LIMIT_ID GF_ID_MAX           /* Hello.peer_id, LockAcquire.engine_id, LockStatus.holder, ... */
#define GF_LIMIT_SERVER_ID 128          /* Welcome.server_id */
#define GF_LIMIT_CHALLENGE 32           /* Welcome.challenge, Auth.mac */
#define GF_LIMIT_ERROR_DETAIL 512       /* Error.detail */
#define GF_LIMIT_TOKEN 32               /* session tokens (bytes) */
#define GF_LIMIT_LOCK_WAITERS 32        /* LockStatus.waiters listed */
#define GF_LIMIT_HASH 16                /* layout hashes (bytes) */
#define GF_LIMIT_BACKEND 16             /* backend names */
#define GF_LIMIT_UUID 64                /* device UUIDs */
#define GF_LIMIT_TAG 64                 /* allocation tags */
#define GF_LIMIT_META_KEY 256           /* metadata keys */
#define GF_LIMIT_META_VALUE 1024        /* metadata values (bytes, no NUL) */
#define GF_LIMIT_CHUNK_ALLOCS 240       /* GmsListChunk.allocations (at most 253 fds per message) */
#define GF_LIMIT_CHUNK_ALLOCS_WITH_META 64 /* ... in a chunk that also carries metadata (fits 64 KiB) */
#define GF_LIMIT_CHUNK_META 32          /* GmsListChunk.metadata */
#define GF_LIMIT_EVENTS 32              /* GmsStatus.events */
#define GF_LIMIT_EVENT_TEXT 160         /* GmsEvent.what */
#define GF_LIMIT_LISTENERS 16           /* LockGranted.listeners, LockAcquire.listeners, LockStatus.listeners */
#define GF_LIMIT_LISTENER_NAME 64       /* listener names */
#define GF_LIMIT_LISTENER_STATUS 400    /* LockStatus.listeners entries: "name=uri" */
#define GF_LIMIT_EXIT_WAIT_PIDS 16      /* LockStatus.exit_wait_pids listed */
#define GF_LIMIT_KV_HASH 48             /* GmsKvBlock.hash (bytes) */
#define GF_LIMIT_KV_BATCH 256           /* GmsKvPublish.add and .remove, GmsKvDir.blocks */

#define GF_FIELD_SIZE(type, field) sizeof(((type *)0)->field)
#define GF_FIELD_COUNT(type, field) (sizeof(((type *)0)->field) / sizeof(((type *)0)->field[0]))
#define GF_BYTES_SIZE(type, field) sizeof(((type *)0)->field.bytes)

_Static_assert(GF_FIELD_SIZE(gf_Hello, peer_id) == GF_LIMIT_ID, "gf.Hello.peer_id");
_Static_assert(GF_FIELD_SIZE(gf_LockAcquire, engine_id) == GF_LIMIT_ID, "gf.LockAcquire.engine_id");
_Static_assert(GF_FIELD_SIZE(gf_LockWaiter, engine_id) == GF_LIMIT_ID, "gf.LockWaiter.engine_id");
_Static_assert(GF_FIELD_SIZE(gf_LockStatus, holder) == GF_LIMIT_ID, "gf.LockStatus.holder");
_Static_assert(GF_FIELD_SIZE(gf_LockStatus, previous_holder) == GF_LIMIT_ID, "gf.LockStatus.previous_holder");
_Static_assert(GF_FIELD_SIZE(gf_Welcome, server_id) == GF_LIMIT_SERVER_ID, "gf.Welcome.server_id");
_Static_assert(GF_BYTES_SIZE(gf_Welcome, challenge) == GF_LIMIT_CHALLENGE, "gf.Welcome.challenge");
_Static_assert(GF_BYTES_SIZE(gf_Auth, mac) == GF_LIMIT_CHALLENGE, "gf.Auth.mac");
_Static_assert(GF_BYTES_SIZE(gf_Hello, challenge) == GF_LIMIT_CHALLENGE, "gf.Hello.challenge");
_Static_assert(GF_BYTES_SIZE(gf_Welcome, proof) == GF_LIMIT_CHALLENGE, "gf.Welcome.proof");
_Static_assert(GF_FIELD_SIZE(gf_Error, detail) == GF_LIMIT_ERROR_DETAIL, "gf.Error.detail");
_Static_assert(GF_BYTES_SIZE(gf_LockAcquire, session_token) == GF_LIMIT_TOKEN, "gf.LockAcquire.session_token");
_Static_assert(GF_BYTES_SIZE(gf_LockGranted, session_token) == GF_LIMIT_TOKEN, "gf.LockGranted.session_token");
_Static_assert(GF_BYTES_SIZE(gf_LockStatusRequest, proof) == GF_LIMIT_TOKEN, "gf.LockStatusRequest.proof");
_Static_assert(GF_BYTES_SIZE(gf_GmsConnect, lock_proof) == GF_LIMIT_TOKEN, "gf.GmsConnect.lock_proof");
_Static_assert(GF_FIELD_COUNT(gf_LockStatus, waiters) == GF_LIMIT_LOCK_WAITERS, "gf.LockStatus.waiters");
_Static_assert(GF_BYTES_SIZE(gf_GmsConnected, layout_hash) == GF_LIMIT_HASH, "gf.GmsConnected.layout_hash");
_Static_assert(GF_BYTES_SIZE(gf_GmsCommitted, layout_hash) == GF_LIMIT_HASH, "gf.GmsCommitted.layout_hash");
_Static_assert(GF_BYTES_SIZE(gf_GmsListChunk, layout_hash) == GF_LIMIT_HASH, "gf.GmsListChunk.layout_hash");
_Static_assert(GF_BYTES_SIZE(gf_GmsStatus, layout_hash) == GF_LIMIT_HASH, "gf.GmsStatus.layout_hash");
_Static_assert(GF_FIELD_SIZE(gf_GmsConnected, backend) == GF_LIMIT_BACKEND, "gf.GmsConnected.backend");
_Static_assert(GF_FIELD_SIZE(gf_GmsStatus, backend) == GF_LIMIT_BACKEND, "gf.GmsStatus.backend");
_Static_assert(GF_FIELD_SIZE(gf_GmsConnected, device_uuid) == GF_LIMIT_UUID, "gf.GmsConnected.device_uuid");
_Static_assert(GF_FIELD_SIZE(gf_GmsStatus, device_uuid) == GF_LIMIT_UUID, "gf.GmsStatus.device_uuid");
_Static_assert(GF_FIELD_SIZE(gf_GmsAllocate, tag) == GF_LIMIT_TAG, "gf.GmsAllocate.tag");
_Static_assert(GF_FIELD_SIZE(gf_GmsAllocation, tag) == GF_LIMIT_TAG, "gf.GmsAllocation.tag");
_Static_assert(GF_FIELD_SIZE(gf_GmsMetaPut, key) == GF_LIMIT_META_KEY, "gf.GmsMetaPut.key");
_Static_assert(GF_FIELD_SIZE(gf_GmsMetaEntry, key) == GF_LIMIT_META_KEY, "gf.GmsMetaEntry.key");
_Static_assert(GF_BYTES_SIZE(gf_GmsMetaPut, value) == GF_LIMIT_META_VALUE, "gf.GmsMetaPut.value");
_Static_assert(GF_BYTES_SIZE(gf_GmsMetaEntry, value) == GF_LIMIT_META_VALUE, "gf.GmsMetaEntry.value");
_Static_assert(GF_FIELD_COUNT(gf_GmsListChunk, allocations) == GF_LIMIT_CHUNK_ALLOCS, "gf.GmsListChunk.allocations");
_Static_assert(GF_FIELD_COUNT(gf_GmsListChunk, metadata) == GF_LIMIT_CHUNK_META, "gf.GmsListChunk.metadata");
_Static_assert(GF_FIELD_COUNT(gf_GmsStatus, events) == GF_LIMIT_EVENTS, "gf.GmsStatus.events");
_Static_assert(GF_FIELD_SIZE(gf_GmsEvent, what) == GF_LIMIT_EVENT_TEXT, "gf.GmsEvent.what");
_Static_assert(GF_FIELD_COUNT(gf_LockGranted, listeners) == GF_LIMIT_LISTENERS, "gf.LockGranted.listeners");
_Static_assert(GF_FIELD_SIZE(gf_LockGranted, listeners[0]) == GF_LIMIT_LISTENER_NAME, "gf.LockGranted.listeners");
_Static_assert(GF_FIELD_COUNT(gf_LockAcquire, listeners) == GF_LIMIT_LISTENERS, "gf.LockAcquire.listeners");
_Static_assert(GF_FIELD_SIZE(gf_LockAcquire, listeners[0]) == GF_LIMIT_LISTENER_NAME, "gf.LockAcquire.listeners");
_Static_assert(GF_FIELD_COUNT(gf_LockStatus, listeners) == GF_LIMIT_LISTENERS, "gf.LockStatus.listeners");
_Static_assert(GF_FIELD_COUNT(gf_LockStatus, exit_wait_pids) == GF_LIMIT_EXIT_WAIT_PIDS, "gf.LockStatus.exit_wait_pids");
_Static_assert(GF_FIELD_SIZE(gf_LockStatus, listeners[0]) == GF_LIMIT_LISTENER_STATUS, "gf.LockStatus.listeners");
_Static_assert(GF_BYTES_SIZE(gf_GmsKvBlock, hash) == GF_LIMIT_KV_HASH, "gf.GmsKvBlock.hash");
_Static_assert(GF_FIELD_COUNT(gf_GmsKvPublish, add) == GF_LIMIT_KV_BATCH, "gf.GmsKvPublish.add");
_Static_assert(GF_FIELD_COUNT(gf_GmsKvPublish, remove) == GF_LIMIT_KV_BATCH, "gf.GmsKvPublish.remove");
_Static_assert(GF_FIELD_COUNT(gf_GmsKvDir, blocks) == GF_LIMIT_KV_BATCH, "gf.GmsKvDir.blocks");
_Static_assert(GF_BYTES_SIZE(gf_GmsKvMap, layout_hash) == GF_LIMIT_HASH, "gf.GmsKvMap.layout_hash");
_Static_assert(GF_BYTES_SIZE(gf_GmsKvMap, lock_proof) == GF_LIMIT_TOKEN, "gf.GmsKvMap.lock_proof");

#endif
