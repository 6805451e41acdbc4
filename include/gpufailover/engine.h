/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gpufailover/engine.h
 * @brief The engine side of failover: a one-way state machine, role-aware
 *        probe decisions, failover metrics and one loss policy hook.
 *
 * States (docs/engine.md has the full text):
 * ```text
 * Init -> Standby -> Waking -> Active -> Dead      (no way back)
 * ```
 * A shadow engine runs the linear loop
 * `init_weights() -> sleep() -> acquire() [blocks] -> wake_up() -> serve()`,
 * either as one call (gf_engine_run_shadow()) or step by step. A primary
 * runs the very same sequence: its acquire() simply returns at once.
 * The state becomes Active only after wake_up and serve both completed.
 * Any other order is refused with GF_ERR_STATE and changes nothing.
 *
 * Thread rules: the step calls are made from one thread (the engine's main
 * thread); gf_engine_state(), gf_engine_probe(), gf_engine_metrics(),
 * gf_engine_interrupt() and gf_engine_mark_dead() may be called from any
 * thread at any time (the probe server does so from its own thread).
 */
#ifndef GPUFAILOVER_ENGINE_H
#define GPUFAILOVER_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "gms.h"
#include "mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup engine Engine state machine
 *  @{ */

/**
 * Exit status of an engine that stepped down for a planned switchover
 * (gfctl switchover): it stopped accepting, drained, released the lock and
 * exited. EX_TEMPFAIL: a supervisor restarts it at once as a Standby and
 * counts no retry (gf-supervise does).
 */
#define GF_ENGINE_EXIT_SWITCHOVER 75

/** Engine states, in the only order they can be visited. */
enum gf_engine_state {
	GF_ENGINE_INIT = 0,    /**< loading weights, capturing graphs */
	GF_ENGINE_STANDBY = 1, /**< weights unmapped, waiting for the lock */
	GF_ENGINE_WAKING = 2,  /**< lock granted: remapping, allocating private memory, serving */
	GF_ENGINE_ACTIVE = 3,  /**< serving */
	GF_ENGINE_DEAD = 4,    /**< failed or lost; final */
};

/** Probe kinds, as Kubernetes names them. */
enum gf_probe {
	GF_PROBE_LIVE = 1,
	GF_PROBE_READY = 2,
	GF_PROBE_STARTUP = 3,
};

/** Weight-loading roles (docs/design.md, decision 5): the GMS's roles (enum gf_gms_role), one source. */
#define GF_ENGINE_LOADER GF_GMS_ROLE_LOADER     /**< connects RW_OR_RO: loads where nothing is committed yet */
#define GF_ENGINE_FOLLOWER GF_GMS_ROLE_FOLLOWER /**< connects RO only: waits for the loader's commit */
/** A follower's default init timeout (30 minutes): how long it waits for a loader's commit while no loader makes progress. */
#define GF_ENGINE_FOLLOWER_INIT_TIMEOUT_MS (30ll * 60 * 1000)

/**
 * Exit status of an engine process whose standby was evicted from the lock
 * server's pool (GF_ERR_EVICTED): a deliberate stop, not a crash; a
 * supervisor should not restart it (gf-supervise treats it as terminal).
 * 70 is the loss policy's and 75 a switchover's.
 */
#define GF_ENGINE_EXIT_EVICTED 73

typedef struct gf_engine gf_engine;

/**
 * Engine-owned health check for the Active state (/live and /ready).
 * Return 1 when healthy, 0 when not. Called from the probe server's thread
 * (or whichever thread calls gf_engine_probe()); must be thread-safe, quick,
 * and must not call step functions of the engine.
 */
typedef int (*gf_engine_health_fn)(gf_engine *engine, void *userdata);

/**
 * Loss policy: called once when the lock is lost for good (its reclaim
 * refused, or on tcp:// the lease ran out; @p err GF_ERR_LOCK_LOST) or a GMS connection
 * is lost while connected (@p err GF_ERR_GMS_LOST), or the startup deadline
 * passed in Init (@p err GF_ERR_TIMEOUT). The engine is already
 * Dead when it runs. Runs on the watcher thread that noticed the loss, so it
 * must return (gf_engine_free() joins that thread) and must not free the
 * engine itself.
 */
typedef void (*gf_engine_loss_fn)(gf_engine *engine, int err, const char *detail, void *userdata);

/**
 * Weight loader, called by gf_engine_init_weights() for every device whose
 * GMS granted this engine the writer role. It allocates, writes, puts
 * metadata and must end with gf_gms_commit(). Return 0 or a GF_ERR_* code.
 */
typedef int (*gf_engine_load_fn)(gf_engine *engine, int device, gf_gms *gms, void *userdata);

/** A step hook (serve_endpoint): return 0 or a negative GF_ERR_* code. */
typedef int (*gf_engine_step_fn)(gf_engine *engine, void *userdata);

/** Callbacks of gf_engine_run_shadow(). */
struct gf_engine_callbacks {
	gf_engine_load_fn load_weights;  /**< required for GF_ENGINE_LOADER */
	gf_engine_step_fn weights_ready; /**< optional: after every device is mapped, still in Init */
	gf_engine_step_fn serve;         /**< optional: serve_endpoint (start serving traffic) */
	void *userdata;                  /**< passed to every callback */
};

/** Failover figures, filled by gf_engine_metrics(). Durations in microseconds; -1 when not measured yet. */
struct gf_engine_metrics {
	int state;                  /**< enum gf_engine_state */
	int64_t time_in_state_us;   /**< since the last transition */
	uint64_t transitions;       /**< state changes so far */
	uint64_t failovers;         /**< Standby -> Active takeovers completed (0 or 1: a process is single-use) */
	uint64_t epoch;             /**< fencing epoch of the lock grant, 0 before */
	int64_t lock_wait_us;       /**< last acquire: call until grant */
	int64_t remap_us;           /**< last wake: GMS remap of every device */
	int64_t private_alloc_us;   /**< last wake: private (KV) memory, including OOM retries */
	int64_t serve_us;           /**< last serve step */
	int64_t wake_total_us;      /**< last grant until Active */
	uint64_t private_alloc_retries; /**< OOM retries during the last wake */
};

/**
 * New engine in state Init with defaults: role loader, backend GF_MEM_AUTO,
 * waking timeout 120s, remap timeout 30s, init timeout none, no startup
 * deadline, no private memory (so no memory gate), no probe server, loss
 * policy gf_engine_default_loss().
 * Caller frees with gf_engine_free().
 */
GF_EXPORT int gf_engine_new(gf_engine **out);
/**
 * Stop the probe server and watchers, unmap and release everything, close
 * the lock connection (releasing the lock) and free. NULL is a no-op.
 * Not while another thread is inside a step call.
 */
GF_EXPORT void gf_engine_free(gf_engine *engine);

/* ---- configuration (only in Init, before gf_engine_init_weights()) ---- */
/** Lock server URI and this engine's id (both copied; the id follows gf_lock_new()'s rule, GF_ERR_INVALID_ARG otherwise). Required before acquire. */
GF_EXPORT int gf_engine_set_lock(gf_engine *engine, const char *uri, const char *engine_id);
/**
 * Shared secret for the lock server (gf_lock_set_secret()): a tcp:// lock
 * server requires one (docs/lock.md, Access), for etcd it is the user's
 * password; a unix:// server does not ask for it. Only in Init before
 * gf_engine_init_weights(), like every setting; the lock client gets it when
 * it is made (the first gf_engine_acquire()). @p secret is copied (@p len
 * bytes, any content); the copy is wiped when it is replaced and by
 * gf_engine_free(). A wrong or missing secret fails gf_engine_acquire() with
 * GF_ERR_PERMISSION. Errors: GF_ERR_INVALID_ARG (NULL engine or secret,
 * @p len 0), GF_ERR_STATE (after init_weights; a rank engine, which holds no
 * lock), GF_ERR_NOMEM.
 */
GF_EXPORT int gf_engine_set_lock_secret(gf_engine *engine, const void *secret, size_t len);
/** The highest rank gf_engine_set_rank() takes. */
#define GF_ENGINE_MAX_RANK 4096

/**
 * Make this engine rank @p rank (1..GF_ENGINE_MAX_RANK) of the engine
 * @p engine_id (copied; gf_lock_new()'s id rule): one of the further
 * processes of an engine that spans several (tensor parallel workers),
 * whose rank 0 holds the lock. A rank engine has no lock of its own: it
 * runs the same states (Init, Standby, Waking, Active, Dead), the same
 * private region (reserved at Init, backed at the wake at the same address
 * with the out-of-memory retry bounded by the waking timeout), the same
 * memory gate and, from the wake on, the same watch on its GMS connections
 * (a loss goes to the loss policy), but it is woken by
 * gf_engine_wake_as_rank() with its holder's epoch instead of
 * gf_engine_acquire(). Its holder registers its pid with the lock
 * (gf_engine_add_holder_pid()), so the lock passes on only once this
 * process has exited. Errors: GF_ERR_INVALID_ARG, GF_ERR_STATE (after
 * init_weights, or a lock is configured: gf_engine_set_lock() then refuses
 * too), GF_ERR_NOMEM.
 */
GF_EXPORT int gf_engine_set_rank(gf_engine *engine, const char *engine_id, int rank);
/**
 * Register a further process of this engine (rank @p pid, e.g. a tensor
 * parallel worker running a rank engine) with the lock (gf_lock_add_pid()):
 * when this engine's lock connection goes away, the next holder is granted
 * only once that process has exited too. Any state but Dead, any thread:
 * before the lock client exists (it is made at the first
 * gf_engine_acquire()) the pid is kept and registered then, so a Standby
 * registers its ranks while it waits. Errors: GF_ERR_INVALID_ARG (NULL
 * engine, @p pid <= 0), GF_ERR_STATE (a rank engine, which holds no lock;
 * Dead), GF_ERR_NOT_FOUND (no such process), GF_ERR_TOO_BIG (more than
 * GF_LOCK_MAX_PIDS), GF_ERR_NOT_SUPPORTED (the lock is not a unix:// one;
 * docs/lock.md), and gf_lock_add_pid()'s errors.
 */
GF_EXPORT int gf_engine_add_holder_pid(gf_engine *engine, int pid);

/** Add the GMS of the next device (device index = number of GMS added before); copied. Up to 16. */
GF_EXPORT int gf_engine_add_gms(gf_engine *engine, const char *uri);
/** The highest ordinal gf_engine_set_first_device() takes. */
#define GF_ENGINE_MAX_FIRST_DEVICE 1023
/**
 * Device ordinal of the engine's device index 0: device index i (the GMS
 * added i-th, its memory backend and private region) is on the backend's
 * device @p ordinal + i. Default 0. A rank engine of rank N on device N (a
 * tensor-parallel worker that sees every GPU) sets N. Before
 * gf_engine_init_weights(). Errors: GF_ERR_INVALID_ARG (outside
 * 0..GF_ENGINE_MAX_FIRST_DEVICE), GF_ERR_STATE (after init_weights); a
 * device the backend does not have (the host backend has only device 0)
 * fails init_weights with gf_mem_open()'s GF_ERR_NOT_FOUND.
 */
GF_EXPORT int gf_engine_set_first_device(gf_engine *engine, int ordinal);
/** GF_ENGINE_LOADER or GF_ENGINE_FOLLOWER. */
GF_EXPORT int gf_engine_set_role(gf_engine *engine, int role);
/** Memory backend kind (enum gf_mem_kind). */
GF_EXPORT int gf_engine_set_backend(gf_engine *engine, int kind);
/** Waking timeout: /live turns 503 after this long in Waking; also bounds private-memory OOM retries. > 0. */
GF_EXPORT int gf_engine_set_waking_timeout(gf_engine *engine, int64_t ms);
/** Timeout of the GMS remap on wake (finite, > 0; docs/design.md, decision 6). */
GF_EXPORT int gf_engine_set_remap_timeout(gf_engine *engine, int64_t ms);
/** How long the lock client tries to reconnect after losing the server before the loss policy runs on tcp:// (< 0: the client's default); on unix:// past it the engine holds on and shows the server unreachable (docs/design.md, decision 31). */
GF_EXPORT int gf_engine_set_lock_reconnect_timeout(gf_engine *engine, int64_t ms);
/**
 * How long gf_engine_init_weights() waits for each GMS without progress (a
 * follower: for the loader's commit). The time counts only while no writer
 * makes progress in that GMS (gf_gms_connect() by progress): a loader that
 * keeps allocating, putting metadata or reporting bytes written
 * (gf_gms_report_progress()) keeps the follower waiting however long the
 * load takes. It fails with GF_ERR_TIMEOUT, naming the GMS, once no writer
 * has been connected for @p ms (detail "no writer connected for N s") or the
 * connected one has made no progress for @p ms ("writer connected but made
 * no progress for N s"). < 0: forever. Default: a follower
 * GF_ENGINE_FOLLOWER_INIT_TIMEOUT_MS (a fail-fast bound, so a follower whose
 * loader never comes exits and is seen restarting), a loader forever (it
 * loads itself).
 */
GF_EXPORT int gf_engine_set_init_timeout(gf_engine *engine, int64_t ms);
/** Private (KV cache) bytes allocated on every device at wake; 0: none. */
GF_EXPORT int gf_engine_set_private_bytes(gf_engine *engine, uint64_t bytes);
/**
 * Nonzero: back the private memory with the GMS's KV pool (docs/gms.md, "The
 * KV pool") instead of creating it at each wake. At the wake, after the
 * weights are remapped, each device's GMS is asked to map its pool with the
 * grant's fence proof (the GMS creates the pool of the private bytes at the
 * first holder's wake), and the pool's memory is mapped at the reserved
 * address: nothing is created or zeroed, so the content the previous holder
 * left is there. Needs private bytes, a lock of its own (not a rank engine)
 * and GMSs fenced by that lock (gf-gmsd --lock): otherwise the wake fails
 * (GF_ERR_NOT_SUPPORTED, GF_ERR_PERMISSION). 0 (default): the wake creates
 * the memory. The pool's directory of finished blocks is the framework's to
 * publish and read (gf_gms_kv_publish(), gf_gms_kv_directory() on
 * gf_engine_gms()); gf_engine_set_kv_layout() names the layout it is for.
 */
GF_EXPORT int gf_engine_set_kv_pool(gf_engine *engine, int on);
/**
 * The KV layout the pool's directory is for (gf_engine_set_kv_pool()):
 * @p block_bytes per block and a 16-byte hash of whatever shapes the cache
 * (the framework's choice). A directory of another layout is not adopted at
 * the wake. Unlike the configuration setters it may be called in Init and
 * in Standby (the framework knows its layout only after Init); the next wake
 * uses it. Default: one block of the whole region, an all-zero hash.
 * Thread-safe. Errors: GF_ERR_INVALID_ARG (NULL, block_bytes 0 or more than
 * the private bytes), GF_ERR_STATE (waking, active or dead).
 */
GF_EXPORT int gf_engine_set_kv_layout(gf_engine *engine, uint64_t block_bytes, const uint8_t layout_hash[16]);
/**
 * What the last wake's map of the KV pool on @p device found
 * (gf_gms_kv_map_info: the directory's previous owner, blocks adopted, how
 * it started). Errors: GF_ERR_INVALID_ARG (NULL, bad device), GF_ERR_STATE
 * (no pool mapped: not enabled, or no wake yet).
 */
GF_EXPORT int gf_engine_kv_pool_info(const gf_engine *engine, int device, struct gf_gms_kv_map_info *out);
/**
 * Wake priority: the thread that calls gf_engine_acquire() runs under
 * SCHED_FIFO at @p priority (1..99) from its wait on the lock until the
 * engine is Active (or the step fails), then under its old policy again,
 * so the grant wakes it ahead of ordinary work such as a dying engine's
 * teardown, and it is never left above that work while serving. Threads it
 * starts meanwhile do not inherit the priority. Where the platform does not
 * permit it (no CAP_SYS_NICE, no RLIMIT_RTPRIO), the wake runs at the
 * ordinary priority and a debug line says so: never an error. 0: off
 * (default). GF_ERR_INVALID_ARG outside 0..99.
 */
GF_EXPORT int gf_engine_set_wake_priority(gf_engine *engine, int priority);
/**
 * Settle later: with @p deferred 1, gf_engine_serve() (and so
 * gf_engine_run_shadow()) return at Active without the two steps that
 * otherwise follow it there: telling the lock server's readiness relay
 * that this holder serves, and writing the log lines the wake held since
 * the grant. The engine answers the connections that waited through the
 * failover first, then calls gf_engine_settle(). Until then the relay
 * counts the holder not ready, and the held lines come out with the
 * stepping thread's next warning or error, or its next line a second after
 * the grant. 0 (default): both at Active.
 */
GF_EXPORT int gf_engine_set_settle_deferred(gf_engine *engine, int deferred);
/**
 * Startup watchdog: if the engine is not in Standby @p ms after
 * gf_engine_new(), it becomes Dead (cause "startup_deadline") and the loss
 * policy runs with GF_ERR_TIMEOUT (the default policy ends the process, so
 * the platform restarts it instead of waiting forever). Watched from
 * gf_engine_init_weights() on, by a thread of the engine. <= 0: none
 * (default). GF_ERR_INVALID_ARG when too large to be a time.
 */
GF_EXPORT int gf_engine_set_startup_deadline(gf_engine *engine, int64_t ms);
/**
 * Memory gate: free bytes every device must have before the engine enters
 * Waking (cuda: cuMemGetInfo; host: MemAvailable). After the lock is granted
 * gf_engine_acquire() waits, up to the waking timeout, for that much to be
 * free; if it never is, the engine becomes Dead (cause "memory_gate") and
 * acquire returns GF_ERR_OUT_OF_MEMORY, instead of a wake that fails
 * half-way. Default: the private bytes (gf_engine_set_private_bytes()), or
 * 0 with the KV pool (gf_engine_set_kv_pool(): the wake maps memory that
 * exists); memory a framework allocates itself at wake belongs here too.
 * 0: no gate.
 */
GF_EXPORT int gf_engine_set_memory_need(gf_engine *engine, uint64_t bytes);
/**
 * Standby pool: the GPUs this engine runs on, declared to the lock server
 * with every acquire (UUIDs, "GPU-" or "MIG-" and 8-4-4-4-12 hex digits;
 * copied; at most 8; 0 clears). With the memory need
 * (gf_engine_set_memory_need()), the asleep bytes and the pin flag they
 * are what the server's per-GPU standby budget counts (docs/lock.md).
 * Default (none set): the UUIDs of the engine's devices as the driver
 * reports them (cuda); the host backend declares no GPU.
 * Errors: GF_ERR_INVALID_ARG (malformed or repeated UUID), GF_ERR_STATE.
 */
GF_EXPORT int gf_engine_set_gpus(gf_engine *engine, const char *const *gpus, size_t ngpus);
/** Standby pool: memory this engine keeps on its GPUs while asleep (bytes, reported per GPU by the lock server). */
GF_EXPORT int gf_engine_set_asleep_bytes(gf_engine *engine, uint64_t bytes);
/** Standby pool: @p pinned != 0 makes the lock server never evict this engine to keep a GPU's budget. */
GF_EXPORT int gf_engine_set_pinned(gf_engine *engine, int pinned);
/** The model this engine serves (copied; engine id rule; NULL clears), for readiness queries (gf_lock_ready_for()). */
GF_EXPORT int gf_engine_set_model(gf_engine *engine, const char *model);
/**
 * Built-in probe server address: @p address is a numeric IPv4 address
 * (NULL: 0.0.0.0), @p port 0 picks a free port, -1 disables (default).
 */
GF_EXPORT int gf_engine_set_probe_address(gf_engine *engine, const char *address, int port);
/** Health callback for the Active state (NULL: Active is healthy). Any state. */
GF_EXPORT int gf_engine_set_health_fn(gf_engine *engine, gf_engine_health_fn fn, void *userdata);
/**
 * Replace the loss policy (NULL restores gf_engine_default_loss()). Any state.
 * This is the one hook both lock loss and GMS loss go through.
 */
GF_EXPORT int gf_engine_set_loss_fn(gf_engine *engine, gf_engine_loss_fn fn, void *userdata);
/** Grace period of gf_engine_default_loss() between SIGTERM and _exit(70) (default 10s). */
GF_EXPORT int gf_engine_set_loss_grace(gf_engine *engine, int64_t ms);

/**
 * The default loss policy, and the one place the library ends a process:
 * logs at error level why (`event=engine_lost err=... detail=...`), sends
 * SIGTERM to its own process so the engine's normal shutdown path runs, and
 * if the process is still alive after the grace period calls _exit(70)
 * (from a detached timer thread, so this call returns at once and the
 * engine can shut down and gf_engine_free() normally meanwhile). Engines
 * that want another policy install their own with gf_engine_set_loss_fn();
 * theirs may call this one too.
 */
GF_EXPORT void gf_engine_default_loss(gf_engine *engine, int err, const char *detail, void *userdata);

/* ---- probe server ---- */
/**
 * Start the built-in probe server (libmicrohttpd, its own thread) on the
 * configured address: GET /live, /ready, /startup (status per the probe
 * table, small text body), /state (JSON), /metrics (Prometheus text).
 * No-op returning 0 when already running. Errors: GF_ERR_STATE (disabled,
 * port -1), GF_ERR_IO (cannot listen; detail says why).
 */
GF_EXPORT int gf_engine_start_probe_server(gf_engine *engine);
/** Port the probe server listens on, or -1 when not running. */
GF_EXPORT int gf_engine_probe_port(const gf_engine *engine);

/* ---- the steps ---- */
/**
 * Init: open the memory backend and connect to every GMS (loader:
 * RW_OR_RO, follower: RO; waiting while a writer makes progress, up to the
 * init timeout without any: gf_engine_set_init_timeout()). Where the writer
 * role is granted @p load is called and must commit; elsewhere the committed
 * weights are imported and mapped read-only. Stays in Init.
 * Errors: GF_ERR_STATE (not Init, or already done), GF_ERR_INVALID_ARG (no
 * GMS configured, loader without @p load), GF_ERR_TIMEOUT (the init timeout
 * passed without a writer's progress), GF_ERR_INTERRUPTED
 * (gf_engine_interrupt() during a GMS wait), whatever the GMS client or
 * @p load returned; on failure everything connected so far is closed again
 * and the call may be repeated.
 */
GF_EXPORT int gf_engine_init_weights(gf_engine *engine, gf_engine_load_fn load, void *userdata);
/** Sleep: unmap every GMS (addresses stay reserved) and enter Standby. Needs Init with weights. */
GF_EXPORT int gf_engine_sleep(gf_engine *engine);
/**
 * Block until the lock is granted (@p timeout_ms < 0: forever), wait at the
 * memory gate (gf_engine_set_memory_need()) and enter Waking; installs the
 * loss hook on the lock client. Its watcher starts at the engine's settling
 * (after the first answers, or at Active), or 5 ms after the grant if that
 * comes first.
 * Errors: GF_ERR_STATE (not Standby), GF_ERR_INVALID_ARG (no lock URI),
 * GF_ERR_INTERRUPTED (gf_engine_interrupt(); stays Standby), the lock
 * client's errors (stays Standby), GF_ERR_OUT_OF_MEMORY (the gate did not
 * open within the waking timeout; Dead, the caller exits and so releases
 * the lock), GF_ERR_EVICTED (the lock server evicted this standby to keep a
 * GPU's budget; Dead, cause "evicted": the caller exits with
 * GF_ENGINE_EXIT_EVICTED).
 */
GF_EXPORT int gf_engine_acquire(gf_engine *engine, int64_t timeout_ms);
/**
 * The rank engine's gf_engine_acquire() (gf_engine_set_rank()): its holder,
 * rank 0, was granted the lock at @p epoch (gf_engine_epoch() of rank 0,
 * passed on by the application), so this rank wakes too. Sends the GMS wake
 * requests, waits at the memory gate (up to the waking timeout; Dead and
 * GF_ERR_OUT_OF_MEMORY when it never opens) and enters Waking; then
 * gf_engine_wake_up() and gf_engine_serve() as for rank 0. Blocks only at
 * the gate. Errors: GF_ERR_INVALID_ARG (NULL, @p epoch 0), GF_ERR_STATE (not
 * a rank engine, or not Standby), GF_ERR_OUT_OF_MEMORY.
 */
GF_EXPORT int gf_engine_wake_as_rank(gf_engine *engine, uint64_t epoch);
/**
 * Wake: remap every GMS at the same addresses (remap timeout), then
 * allocate and map read-write the private memory of every device, retrying
 * on GF_ERR_OUT_OF_MEMORY until the waking timeout (the previous engine's
 * memory may still be draining), synchronize every device, then watch the
 * GMS connections (a loss from then on goes to the loss policy).
 * All-or-nothing: on failure whatever was mapped is unmapped again, the
 * engine becomes Dead and the error is returned (a failed wake is fatal,
 * docs/design.md, decision 6; the caller exits). Needs Waking.
 */
GF_EXPORT int gf_engine_wake_up(gf_engine *engine);
/**
 * serve_endpoint: call @p serve (may be NULL when the engine already serves)
 * and enter Active. Needs Waking after a successful wake_up. If @p serve
 * fails the engine becomes Dead and its error is returned.
 */
GF_EXPORT int gf_engine_serve(gf_engine *engine, gf_engine_step_fn serve, void *userdata);
/**
 * The lock-carried listening socket @p name (gf-lockd --listener NAME=URI),
 * for the serve step: *@p fd_out is a new close-on-exec duplicate the caller
 * owns (an HTTP server may close it when it stops). Only the holder has it,
 * so a Standby never accepts. Waking or Active (while the lock is held).
 * When the lock or a GMS is lost, the loss path first replaces each such
 * duplicate still open (the same fd number) with a datagram socket, before
 * the loss hook runs: accept() on it then fails with EOPNOTSUPP and poll()
 * reports nothing, while the listening socket the next holder serves from is
 * left alone. Do not close the duplicate on another thread while the lock
 * may be lost, or keep further dup()s of it (those are not replaced).
 * Errors: GF_ERR_STATE (not held), GF_ERR_NOT_FOUND (no such listener),
 * GF_ERR_NOT_SUPPORTED (a tcp:// lock carries none), GF_ERR_IO, GF_ERR_INVALID_ARG.
 */
GF_EXPORT int gf_engine_listener(gf_engine *engine, const char *name, int *fd_out);
/**
 * Is this engine's grant still current, as far as can be told without
 * blocking? 1 when it is Waking or Active, the lock is held and its server
 * connection is up and has not been closed by the server, or while the
 * server is down (a connect refused: nobody else can be granted then, docs/design.md,
 * decision 31); 0 otherwise (also while the client reconnects to a server that
 * is up, after a loss, and for NULL). Call it before
 * accept() from a lock-carried listener and leave the backlog alone while it
 * says 0: a holder revoked while stopped and then resumed finds the server's
 * hang-up here before its watcher thread has run the loss path, and during a
 * lock-server restart the grant is current again once the reclaim is
 * answered. Any thread; does not block.
 */
GF_EXPORT int gf_engine_may_accept(gf_engine *engine);

/**
 * Called when a planned switchover (gfctl switchover) asks this engine, the
 * lock's holder, to step down. The application stops accepting (with the
 * lock-carried listener nothing is refused: new connections wait in its
 * backlog for the next holder), lets in-flight requests finish, then calls
 * gf_engine_step_down() and exits with GF_ENGINE_EXIT_SWITCHOVER. Runs on
 * the lock's watcher thread: hand the work to another thread, return soon.
 */
typedef void (*gf_engine_step_down_fn)(gf_engine *engine, void *userdata);
/** Install the step-down hook (NULL: a switchover request is logged and ignored). Any time, any thread. */
GF_EXPORT int gf_engine_set_step_down_fn(gf_engine *engine, gf_engine_step_down_fn fn, void *userdata);
/**
 * Finish a planned switchover: release the lock explicitly (the server grants
 * the first waiter at once, without waiting for this process to exit) and
 * enter Dead with cause "switchover" (no loss policy runs). Then exit with
 * GF_ENGINE_EXIT_SWITCHOVER. Not from the step-down hook's thread (it joins
 * the lock watcher). Errors: GF_ERR_STATE (the lock is not held), GF_ERR_INVALID_ARG.
 */
GF_EXPORT int gf_engine_step_down(gf_engine *engine);
/** Enter Dead (from any state; no-op when already Dead). @p reason is logged. Any thread. */
GF_EXPORT int gf_engine_mark_dead(gf_engine *engine, const char *reason);
/**
 * The whole loop in one call: start the probe server if configured, then
 * init_weights -> weights_ready -> sleep -> acquire (blocks) -> wake_up ->
 * serve. Returns 0 once Active (the engine keeps serving from its own
 * threads) or the first step's error.
 */
GF_EXPORT int gf_engine_run_shadow(gf_engine *engine, const struct gf_engine_callbacks *callbacks);
/**
 * After an Active whose settling was deferred (gf_engine_set_settle_deferred()):
 * report serving to the lock server's readiness relay and write the log
 * lines the wake held. Any thread; once per wake (later calls, and calls
 * with nothing deferred, do nothing and return 0).
 */
GF_EXPORT int gf_engine_settle(gf_engine *engine);
/**
 * Make a blocking gf_engine_acquire() return GF_ERR_INTERRUPTED; in Init, the
 * wait of gf_engine_init_weights() in a GMS (now, or its next one: an
 * interrupt that no wait of Init took goes to the next acquire).
 * Async-signal-safe, any thread.
 */
GF_EXPORT void gf_engine_interrupt(gf_engine *engine);

/* ---- inspection (any thread) ---- */
/** Current state (enum gf_engine_state). */
GF_EXPORT int gf_engine_state(const gf_engine *engine);
/** "init", "standby", "waking", "active", "dead" (static; "unknown" otherwise). */
GF_EXPORT const char *gf_engine_state_name(int state);
/** HTTP status (200 or 503) of @p probe in the current state, per the probe table. -1 on a bad argument. */
GF_EXPORT int gf_engine_probe(gf_engine *engine, int probe);
/** Snapshot of the failover metrics. */
GF_EXPORT int gf_engine_metrics(const gf_engine *engine, struct gf_engine_metrics *out);
/** The metrics as Prometheus text exposition. *text is malloc'd; free() it. */
GF_EXPORT int gf_engine_metrics_text(const gf_engine *engine, char **text);
/**
 * The state as a JSON object (state, id, role, epoch, time in state, metrics,
 * dead_cause and dead_reason once Dead, memory gate, probe server figures).
 * *json is malloc'd; free() it.
 */
GF_EXPORT int gf_engine_state_json(const gf_engine *engine, char **json);
/** Fencing epoch of the grant (0 before acquire). */
GF_EXPORT uint64_t gf_engine_epoch(const gf_engine *engine);
/** Engine id given to gf_engine_set_lock() ("" before). Owned by the engine. */
GF_EXPORT const char *gf_engine_id(const gf_engine *engine);
/** Number of devices (GMS added). */
GF_EXPORT int gf_engine_device_count(const gf_engine *engine);
/** GMS client of @p device (NULL before init_weights or on a bad index). Owned by the engine. */
GF_EXPORT gf_gms *gf_engine_gms(gf_engine *engine, int device);
/** Memory backend of @p device (NULL before init_weights). Owned by the engine. */
GF_EXPORT gf_mem *gf_engine_mem(gf_engine *engine, int device);
/**
 * Address and size of the private (KV) memory of @p device, from
 * gf_engine_init_weights() on: the range is reserved there and stays at that
 * address for the engine's life; memory backs it only from the wake on
 * (gf_engine_private_backed()); before that any access faults. So what
 * points into it (CUDA graphs captured at Init) stays valid across the wake.
 * GF_ERR_STATE before init_weights or with no private bytes configured.
 */
GF_EXPORT int gf_engine_private_memory(const gf_engine *engine, int device, uint64_t *addr, uint64_t *size);
/** 1 while memory backs the private region of @p device (from the wake on), 0 when not, GF_ERR_INVALID_ARG on a bad index. */
GF_EXPORT int gf_engine_private_backed(const gf_engine *engine, int device);

/** @} */

#ifdef __cplusplus
}
#endif

#endif
