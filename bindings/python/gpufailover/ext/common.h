/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Declarations shared by the files of the CPython C-API extension over
 * libgpufailover, one file per Python type. The thin Python package
 * (gpufailover/__init__.py) re-exports what is defined here.
 *
 * Rules kept throughout: every blocking library call runs with the GIL
 * released; arguments are checked before anything happens (TypeError /
 * ValueError, never a crash); library errors become exceptions of the
 * GpuFailoverError hierarchy carrying the library's detail text.
 */
#ifndef GFPY_COMMON_H
#define GFPY_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "gpufailover.h"
#include "../dlpack_abi.h"

typedef struct {
	PyObject_HEAD
	gf_mem *mem;
} MemoryObject;

typedef struct {
	PyObject_HEAD
	gf_gms *gms;
	gf_mem *mem;
	PyObject *owner_ref; /* the Memory (own clients) or Engine (borrowed clients) kept alive */
	int borrowed;        /* the gf_gms belongs to an Engine: never freed here */
	int device;          /* with borrowed: the Engine's device index */
	Py_ssize_t exports;  /* live buffers / DLPack capsules over the mappings */
	Py_ssize_t busy;     /* calls running with the GIL released */
	PyObject *on_lost;
} GMSObject;

/* Dimensions of a Mapping: as many as a safetensors tensor may have in the C engine. */
#define GFPY_MAX_DIMS 16

typedef struct {
	PyObject_HEAD
	GMSObject *owner;
	uint64_t addr;
	Py_ssize_t size;
	int readonly;
	int device_type, device_id;
	gf_DLDataType dtype;
	int ndim;
	int64_t shape[GFPY_MAX_DIMS];
	char format[4];
	Py_ssize_t itemsize;
	Py_ssize_t pyshape[GFPY_MAX_DIMS];
} MappingObject;

/*
 * In-use counts. A method that uses an object's library handle with the GIL
 * released counts itself in obj->busy (changed only with the GIL held), so
 * close() on another thread never frees the handle under it: close()
 * interrupts a blocked wait and waits for it, or raises StateError.
 */
#define BLOCKING_COUNT(busy, stmt)     \
	do {                           \
		(*(busy))++;           \
		Py_BEGIN_ALLOW_THREADS \
		stmt;                  \
		Py_END_ALLOW_THREADS   \
		(*(busy))--;           \
	} while (0)
#define BLOCKING(obj, stmt) BLOCKING_COUNT(&(obj)->busy, stmt)
/* Raise StateError naming what cannot be done while busy > 0; 0 if idle. */
int gfpy_refuse_busy(Py_ssize_t busy, const char *type, const char *what);
/* Release the GIL until *busy drops to 0. */
void gfpy_wait_idle(const Py_ssize_t *busy);

/* exceptions (errors.c) */
extern PyObject *gfpy_GpuFailoverError, *gfpy_LockLostError, *gfpy_GMSLostError, *gfpy_StaleLayoutError,
	*gfpy_TimeoutError, *gfpy_ProtocolError, *gfpy_PermissionError, *gfpy_UnreachableError, *gfpy_NotSupportedError,
	*gfpy_OutOfMemoryError, *gfpy_StateError, *gfpy_NotFoundError, *gfpy_InterruptedError;
PyObject *gfpy_raise_gf(int err);
/* gfpy_raise_gf() with a detail text read on another thread (NULL or "": the error's name). */
PyObject *gfpy_raise_gf_detail(int err, const char *detail);
int gfpy_errors_add(PyObject *m);

/* helpers (common.c) */
int gfpy_timeout_arg(PyObject *obj, int64_t *ms, int allow_none);
/* PyArg "O&" converter to uint64_t: OverflowError outside 0 .. 2**64-1
 * (never wrapped, as the "K" format would), TypeError for non-integers. */
int gfpy_u64_arg(PyObject *obj, void *out);
/* PyArg "O&" converter of secret=: None leaves the Py_buffer at @out empty (no
 * secret), a bytes-like object fills it (release it with PyBuffer_Release); a
 * str or another type is a TypeError. */
int gfpy_secret_arg(PyObject *obj, void *out);
PyObject *gfpy_json_loads(const char *text);
void gfpy_run_hook(PyObject *const *slot, int err, const char *detail);
PyObject *gfpy_hook_get(PyObject *slot);
int gfpy_hook_set(PyObject **slot, PyObject *v, const char *what);
extern unsigned long gfpy_main_thread_ident;
/* 1 on the thread that runs Python's signal handlers. */
int gfpy_in_main_thread(void);
/* CLOCK_MONOTONIC in milliseconds. */
int64_t gfpy_now_ms(void);
/* gfpy_wait_interruptible(): a Python exception is set (a signal handler raised). */
#define GFPY_PYERR 1
/* gfpy_wait_interruptible(): a signal handler closed the object (its handle is NULL). */
#define GFPY_CLOSED 2
/*
 * Run call(ctx, ms) with the GIL released, counted in *busy, until it returns
 * something other than GF_ERR_INTERRUPTED; a signal with a Python handler
 * runs intr(handle(obj)) (async-signal-safe) to wake it, then the handlers run
 * and the wait goes on with the time that remains. An interrupted call whose
 * *stop is set (close() on another thread) is not resumed: GF_ERR_INTERRUPTED
 * is returned. Returns call()'s result, GFPY_PYERR or GFPY_CLOSED.
 */
int gfpy_wait_interruptible(int (*call)(void *ctx, int64_t ms), void *ctx, void (*intr)(void *),
		       void *(*handle)(PyObject *obj), PyObject *obj, Py_ssize_t *busy, const int *stop, int64_t ms);

/*
 * Run fn(arg, json), a one-shot request to the server at uri bounded by
 * timeout_ms (-1: none), on a thread of its own and wait for it with the GIL
 * released, interruptible by signal handlers (a raising handler ends the
 * wait; the request then finishes on its own). free_arg(arg) runs when both
 * sides are done, also on failure here. Returns fn's result (>= 0) as an int
 * object, or NULL with an exception (fn's error with its detail, naming
 * what). *json (if json is not NULL) receives fn's malloc'd text on
 * success: the caller frees it.
 */
PyObject *gfpy_oneshot_run(const char *what, const char *uri, int64_t timeout_ms, int (*fn)(void *arg, char **json),
			   void *arg, void (*free_arg)(void *arg), char **json);
/* A sequence of str (not a str itself) as a NULL-terminated malloc'd array of
 * UTF-8 copies, at most max entries; *n its length. Frees with gfpy_strv_free(). */
int gfpy_strv_arg(PyObject *obj, const char *what, size_t max, char ***out, size_t *n);
void gfpy_strv_free(char **v);
/* pinned=: a bool, TypeError for anything else (1 or "yes" would be a mistake). */
int gfpy_bool_arg(PyObject *obj, void *out);

/* the types, each in its own file */
extern PyTypeObject gfpy_MemoryType, gfpy_LockType, gfpy_GMSType, gfpy_MappingType, gfpy_EngineType;
int gfpy_backend_arg(PyObject *obj, int *kind);
int gfpy_memory_ready(MemoryObject *self);
int gfpy_lock_add_grant(PyObject *m);
int gfpy_gms_ready(GMSObject *self);
int gfpy_no_exports(GMSObject *self, const char *what);
void gfpy_engine_forget_view(PyObject *engine, GMSObject *view);
PyObject *gfpy_install_fault_reporter(PyObject *self, PyObject *arg);
PyObject *gfpy_kill_group_on_exit(PyObject *self, PyObject *args);
PyObject *gfpy_group_watches_off(PyObject *self, PyObject *unused);
PyObject *gfpy_remove_fault_reporter(PyObject *self, PyObject *args);
PyObject *gfpy_lock_status(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_gms_status(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_ready_for(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_lock_revoke(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_lock_switchover(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_lock_ping(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_set_log_sink(PyObject *self, PyObject *args);
PyObject *gfpy_drain_log(PyObject *self, PyObject *unused);
PyObject *gfpy_lock_evict(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_gms_ping(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_gms_wait_committed(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_gms_demote(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_device_list(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_device_find_by_uuid(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_gms_snapshot(PyObject *self, PyObject *args, PyObject *kw);
PyObject *gfpy_gms_restore(PyObject *self, PyObject *args, PyObject *kw);

#endif
