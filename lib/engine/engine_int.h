/* SPDX-License-Identifier: Apache-2.0 */
/* Internals of the engine component. The engine reaches the lock client, the
 * GMS client and the memory backend only through this table, so unit tests
 * can drive every transition with fakes (and a fake clock) and the real
 * bindings live in one file (engine_ops.c). */
#ifndef GF_ENGINE_INT_H
#define GF_ENGINE_INT_H

#include <stdint.h>

#include "gpufailover.h"

struct gf_engine_ops {
	int64_t (*now_us)(void);
	/* Sleep up to @ms or until the engine is interrupted (OOM retry backoff). */
	void (*sleep_ms)(int64_t ms);

	int (*lock_new)(gf_lock **out, const char *uri, const char *engine_id);
	void (*lock_free)(gf_lock *lock);
	int (*lock_acquire)(gf_lock *lock, int64_t timeout_ms, struct gf_lock_grant *grant);
	int (*lock_set_reconnect_timeout)(gf_lock *lock, int64_t ms);
	void (*lock_set_lost_fn)(gf_lock *lock, gf_lock_lost_fn fn, void *userdata);
	int (*lock_start_watch)(gf_lock *lock);
	void (*lock_stop_watch)(gf_lock *lock);
	void (*lock_interrupt)(gf_lock *lock);

	int (*mem_open)(gf_mem **out, int kind, int device);
	void (*mem_free)(gf_mem *m);
	int (*mem_create)(gf_mem *m, size_t size, gf_mem_alloc **out);
	int (*mem_alloc_free)(gf_mem_alloc *a);
	size_t (*mem_alloc_size)(const gf_mem_alloc *a);
	int (*mem_reserve)(gf_mem *m, size_t size, size_t align, gf_mem_va **out);
	void (*mem_va_free)(gf_mem_va *va);
	uint64_t (*mem_va_addr)(const gf_mem_va *va);
	int (*mem_map)(gf_mem_va *va, size_t offset, gf_mem_alloc *a, int access);
	int (*mem_unmap_all)(gf_mem_va *va);
	int (*mem_synchronize)(gf_mem *m);

	int (*gms_connect)(gf_gms **out, const char *uri, gf_mem *mem, int mode, int64_t timeout_ms);
	void (*gms_free)(gf_gms *gms);
	int (*gms_granted_mode)(const gf_gms *gms);
	int (*gms_map_all)(gf_gms *gms);
	int (*gms_unmap)(gf_gms *gms);
	int (*gms_remap)(gf_gms *gms, int64_t timeout_ms);
	void (*gms_set_lost_fn)(gf_gms *gms, gf_gms_lost_fn fn, void *userdata);
	int (*gms_start_watch)(gf_gms *gms);
	void (*gms_stop_watch)(gf_gms *gms);
};

/* A new engine using @ops (copied). gf_engine_new() is this with the real
 * clients; tests pass fakes. */
int gf_engine_new_with_ops(gf_engine **out, const struct gf_engine_ops *ops);

/* The hooks the engine installs into the lock and GMS clients (exposed so
 * tests can check they reach the loss policy). */
void gf_engine_lock_lost_hook(gf_lock *lock, int err, const char *detail, void *userdata);
void gf_engine_gms_lost_hook(gf_gms *gms, int err, const char *detail, void *userdata);

/* Probe decision for a state, the pure table of DESIGN §7. @waking_expired
 * tells whether the waking timeout has passed; @healthy is the Active
 * health callback's answer. */
int gf_engine_probe_decision(int state, int probe, int waking_expired, int healthy);

/* Probe server (engine_http.c). */
struct gf_engine_http;
int gf_engine_http_start(gf_engine *e, const char *address, int port, struct gf_engine_http **out);
int gf_engine_http_port(const struct gf_engine_http *h);
void gf_engine_http_stop(struct gf_engine_http *h);

#endif
