/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The server core shared by every daemon (gf-lockd, gf-gmsd): one epoll
 * loop, a stop eventfd, listeners, accept with SO_PEERCRED and the uid allow
 * list, a non-blocking frame reader per peer, the handshake (Hello, Welcome,
 * the TCP challenge), replies with a send deadline, per-frame and handshake
 * deadlines, deferred peer free and the component's timers.
 *
 * A component (the lock, the GMS) keeps only its policy, behind a small
 * handler table:
 *
 *   on_ready       a peer finished the handshake (optional)
 *   on_message     a message from a ready peer
 *   on_close       a peer is going away: forget it, do not grant here
 *   next_deadline  the component's earliest deadline (monotonic us)
 *   on_timer       run every round after the events; handle what is due
 *   settle         run once after each event (and after on_timer): grants,
 *                  re-evaluation of waiters. Closes during an event only
 *                  record what changed; settle acts on it, so no close ever
 *                  re-enters the grant logic.
 *   on_writable    a peer that asked with gf_srv_want_write() has room
 *
 * A closed peer stays allocated until the end of the round (events for it
 * may still be pending), its socket stays open until after settle (so
 * tearing it down is not on the hand-off path), and then both go.
 *
 * Bounds that protect the loop from one peer: at most GF_SRV_MSGS_PER_ROUND
 * messages are read from one peer per round (its readers read ahead: what
 * is left of a read goes in the next round, whose timeout is then 0); a reply waits at most
 * GF_SRV_SEND_DEADLINE_US for a peer's full socket buffer, then the peer is
 * dropped; a frame begun must be complete within the handshake timeout; at
 * the fd limit the listeners are paused (GF_SRV_ACCEPT_PAUSE_US) instead of
 * spinning, and the log line is rate-limited; a TCP source that sent 5 wrong
 * secrets gets one more guess per second, its other connections are closed
 * at accept, and so are those beyond GF_SRV_PREAUTH_PER_SOURCE of one source
 * still in the handshake (each refusal and handshake-timeout log line is
 * rate-limited). TCP handshakes are mutual: the server proves the secret with
 * Welcome.proof when the client's Hello carries a challenge.
 *
 * One thread drives a server; gf_srv_stop() may be called from any thread or
 * a signal handler.
 */
#ifndef GF_WIRE_SERVER_H
#define GF_WIRE_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define GF_SRV_MAX_LISTEN 16
#define GF_SRV_MAX_ALLOW_UID 64
/* How long a reply may wait for a peer's full receive buffer before the peer is dropped. */
#define GF_SRV_SEND_DEADLINE_US 50000
/* Messages read from one peer before the loop serves the others. */
#define GF_SRV_MSGS_PER_ROUND 16
/* Listeners rest this long after accept failed for want of fds. */
#define GF_SRV_ACCEPT_PAUSE_US 100000
/* At most one "accept failed" log line per this interval. */
#define GF_SRV_LOG_EVERY_US 10000000
#define GF_SRV_DEFAULT_HANDSHAKE_MS 3000
/* TCP connections one source address may have open before their handshake
 * is done; more are closed at accept, so silent connections from one source
 * cannot use up the fds the authenticated clients need. */
#define GF_SRV_PREAUTH_PER_SOURCE 32

struct gf_srv;

/* One connection. Fields above `priv` are read-only for components, except id and data. */
struct gf_srv_peer {
	int fd;             /* -1 once closed */
	bool tcp;
	bool ready;         /* handshake done */
	uint32_t uid, pid;  /* SO_PEERCRED (unix peers) */
	/* The peer's process (unix peers, when the server wants pidfds); a
	 * component may take it by setting it to -1. */
	int pidfd;
	/* Peer id from its Hello, sanitised ("?" when unusable); a component may
	 * replace it with a better-known id that passes gf_id_valid(). */
	char id[GF_ID_MAX];
	int64_t last_heard; /* monotonic us of its last message */
	/* The component's per-connection state (cfg.peer_data_size bytes, zeroed);
	 * valid until the end of the round in which the peer closed. */
	void *data;
	struct gf_srv_peer_priv *priv;
};

/* An extra fd in the loop (the lock watches pidfds); embed it, set fn. */
struct gf_srv_watch {
	int kind_; /* set by gf_srv_watch_add() */
	void (*fn)(void *ctx, struct gf_srv_watch *w);
};

struct gf_srv_handlers {
	void (*on_ready)(void *ctx, struct gf_srv_peer *p);
	/* @m is scratch space owned by the core; fds arrive only when max_fds > 0
	 * and are then owned by the handler (*fds malloc'd). */
	void (*on_message)(void *ctx, struct gf_srv_peer *p, gf_Msg *m, int *fds, size_t nfds);
	void (*on_close)(void *ctx, struct gf_srv_peer *p, const char *why);
	int64_t (*next_deadline)(void *ctx);
	void (*on_timer)(void *ctx, int64_t now);
	void (*settle)(void *ctx);
	void (*on_writable)(void *ctx, struct gf_srv_peer *p);
};

struct gf_srv_config {
	const char *name;           /* "lockd", "gmsd": log component and error prefix */
	gf_Component component;     /* what the Hello must ask for */
	bool want_pidfd;            /* unix peers need a pidfd; refused without one */
	size_t max_body;            /* largest frame body accepted from a peer */
	size_t max_fds;             /* fds a peer may send (0: none) */
	int backlog;
	size_t peer_data_size;      /* zeroed per-peer state for the component (peer->data) */
};

/* A new core for one component. @ctx is passed to every handler. */
int gf_srv_new(struct gf_srv **out, const struct gf_srv_config *cfg, const struct gf_srv_handlers *h,
	       void *ctx);
/* Closes every peer (on_close runs), the listeners (unix socket files are removed) and the loop. */
void gf_srv_free(struct gf_srv *s);

/* ---- configuration (before gf_srv_start; GF_ERR_STATE after) ---- */
/* @unix_only: refuse tcp:// URIs (the GMS passes fds, which cannot cross hosts). */
int gf_srv_add_listen(struct gf_srv *s, const char *uri, bool unix_only);
/*
 * The allow list for unix peers. Empty (the default): the server's own uid
 * and root. Otherwise: exactly the listed uids.
 */
int gf_srv_add_allow_uid(struct gf_srv *s, uint32_t uid);
int gf_srv_set_handshake_timeout(struct gf_srv *s, int64_t ms);
/* TCP peers must answer a challenge with HMAC-SHA256(secret, challenge). */
int gf_srv_set_secret(struct gf_srv *s, const void *secret, size_t len);
/* Text of Welcome.server_id. */
void gf_srv_set_server_id(struct gf_srv *s, const char *id);
/* Kernel keepalive and user timeout for TCP peers, in ms (0: leave the defaults). */
void gf_srv_set_tcp_timeout(struct gf_srv *s, int64_t ms);
bool gf_srv_has_tcp(const struct gf_srv *s);
bool gf_srv_started(const struct gf_srv *s);

/* Listen; raises the soft RLIMIT_NOFILE to the hard limit (a server's peers are fds). */
int gf_srv_start(struct gf_srv *s);
int gf_srv_get_fd(const struct gf_srv *s);
/* Milliseconds until gf_srv_process() must run without events (-1: none). */
int gf_srv_get_timeout_ms(const struct gf_srv *s);
/* One round, waiting up to @timeout_ms for events. 1 once stopped, 0, or a negative error. */
int gf_srv_process(struct gf_srv *s, int timeout_ms);
/* Rounds until gf_srv_stop(). */
int gf_srv_run(struct gf_srv *s);
void gf_srv_stop(struct gf_srv *s);

/* ---- peers ---- */
/* Send @m (and fds, which stay the caller's) within the send deadline; on failure the peer is closed. */
int gf_srv_send(struct gf_srv *s, struct gf_srv_peer *p, const gf_Msg *m, const int *fds, size_t nfds);
/* Same for an already encoded body. */
int gf_srv_send_raw(struct gf_srv *s, struct gf_srv_peer *p, const void *body, size_t len, const int *fds,
		    size_t nfds);
/* An Error reply echoing @seq; closes the peer afterwards when @close_after. */
int gf_srv_send_error(struct gf_srv *s, struct gf_srv_peer *p, uint32_t seq, int code, const char *detail,
		      bool close_after);
/* Close @p now: on_close runs at once; settle runs after the current event. Idempotent. */
void gf_srv_close(struct gf_srv *s, struct gf_srv_peer *p, const char *why);
/* Ask for on_writable while @on. */
void gf_srv_want_write(struct gf_srv *s, struct gf_srv_peer *p, bool on);
/* Iterate over open peers: first with NULL. */
struct gf_srv_peer *gf_srv_next_peer(struct gf_srv *s, struct gf_srv_peer *prev);

/* Extra fds in the loop: @w->fn runs when @fd is readable. */
int gf_srv_watch_add(struct gf_srv *s, int fd, struct gf_srv_watch *w);
/* Point an fd already in the loop at another watch. */
int gf_srv_watch_mod(struct gf_srv *s, int fd, struct gf_srv_watch *w);
void gf_srv_watch_del(struct gf_srv *s, int fd);

/* What the fd limit allows, for status: the soft RLIMIT_NOFILE and open peers. */
struct gf_srv_stats {
	uint64_t fd_limit;
	uint32_t connections;
	uint64_t accept_paused; /* times the listeners were paused at the fd limit */
	uint64_t refused_no_pidfd;
	uint64_t refused_auth_rate; /* TCP connections refused: their source sent too many wrong secrets */
};
void gf_srv_stats(const struct gf_srv *s, struct gf_srv_stats *out);


#endif
