/* SPDX-License-Identifier: Apache-2.0 */
/* The engine bound to the real lock client, GMS client and memory backend. */
#include <errno.h>
#include <time.h>

#include "common.h"
#include "engine_int.h"

static void real_sleep_ms(int64_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static const struct gf_engine_ops real_ops = {
	.now_us = gf_now_us,
	.sleep_ms = real_sleep_ms,
	.lock_new = gf_lock_new,
	.lock_free = gf_lock_free,
	.lock_acquire = gf_lock_acquire,
	.lock_set_reconnect_timeout = gf_lock_set_reconnect_timeout,
	.lock_set_lost_fn = gf_lock_set_lost_fn,
	.lock_start_watch = gf_lock_start_watch,
	.lock_stop_watch = gf_lock_stop_watch,
	.lock_interrupt = gf_lock_interrupt,
	.mem_open = gf_mem_open,
	.mem_free = gf_mem_free,
	.mem_create = gf_mem_create,
	.mem_alloc_free = gf_mem_alloc_free,
	.mem_alloc_size = gf_mem_alloc_size,
	.mem_reserve = gf_mem_reserve,
	.mem_va_free = gf_mem_va_free,
	.mem_va_addr = gf_mem_va_addr,
	.mem_map = gf_mem_map,
	.mem_unmap_all = gf_mem_unmap_all,
	.mem_synchronize = gf_mem_synchronize,
	.gms_connect = gf_gms_connect,
	.gms_free = gf_gms_free,
	.gms_granted_mode = gf_gms_granted_mode,
	.gms_map_all = gf_gms_map_all,
	.gms_unmap = gf_gms_unmap,
	.gms_remap = gf_gms_remap,
	.gms_set_lost_fn = gf_gms_set_lost_fn,
	.gms_start_watch = gf_gms_start_watch,
	.gms_stop_watch = gf_gms_stop_watch,
};

GF_EXPORT int gf_engine_new(gf_engine **out)
{
	return gf_engine_new_with_ops(out, &real_ops);
}
