/* SPDX-License-Identifier: Apache-2.0 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "wire.h"

static const char *component_name(gf_Component c)
{
	switch (c) {
	case gf_Component_COMPONENT_LOCK:
		return "lock server";
	case gf_Component_COMPONENT_GMS:
		return "GPU memory service";
	default:
		return "unknown component";
	}
}

/*
 * One keyless HMAC-SHA256 context per process, duplicated for each MAC.
 * OpenSSL's one-shot HMAC() looks the MAC and the digest up by name every
 * time; with cold caches, as for a standby's first MAC after a long wait (its
 * grant's fence proof, on the failover path), that lookup cost about as much
 * again as the MAC itself. Without the template (OpenSSL refused it) every MAC
 * goes through HMAC().
 */
static EVP_MAC_CTX *hmac_template;
static pthread_once_t hmac_once = PTHREAD_ONCE_INIT;

static void hmac_template_make(void)
{
	EVP_MAC *alg = EVP_MAC_fetch(NULL, "HMAC", NULL);
	EVP_MAC_CTX *c = alg ? EVP_MAC_CTX_new(alg) : NULL;
	EVP_MAC_free(alg); /* the context holds its own reference */
	OSSL_PARAM p[] = { OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
			   OSSL_PARAM_construct_end() };
	if (c && EVP_MAC_CTX_set_params(c, p) != 1) {
		EVP_MAC_CTX_free(c);
		c = NULL;
	}
	hmac_template = c;
}

int gf_auth_mac(const uint8_t *secret, size_t secret_len, const uint8_t *challenge,
		size_t challenge_len, uint8_t mac[32])
{
	pthread_once(&hmac_once, hmac_template_make);
	/* An empty key means "keep the previous one" to EVP_MAC_init(): HMAC() it is. */
	if (hmac_template && secret_len > 0) {
		EVP_MAC_CTX *c = EVP_MAC_CTX_dup(hmac_template);
		size_t n = 0;
		bool ok = c && EVP_MAC_init(c, secret, secret_len, NULL) == 1 &&
			  EVP_MAC_update(c, challenge, challenge_len) == 1 && EVP_MAC_final(c, mac, &n, 32) == 1 && n == 32;
		EVP_MAC_CTX_free(c);
		if (!ok)
			return gf_err(GF_ERR_IO, "HMAC-SHA256 failed");
		return 0;
	}
	unsigned int len = 32;
	if (!HMAC(EVP_sha256(), secret, (int)secret_len, challenge, challenge_len, mac, &len) || len != 32)
		return gf_err(GF_ERR_IO, "HMAC-SHA256 failed");
	return 0;
}

int gf_auth_server_proof(const uint8_t *secret, size_t secret_len, const uint8_t *challenge, size_t challenge_len,
			 uint8_t proof[32])
{
	/* A different message from the client's MAC, so neither side's answer can be replayed as the other's. */
	static const char label[] = "gf-server-proof:";
	uint8_t buf[sizeof(label) - 1 + 64];
	if (challenge_len > 64)
		return gf_err(GF_ERR_INVALID_ARG, "server proof: challenge longer than 64 bytes");
	memcpy(buf, label, sizeof(label) - 1);
	memcpy(buf + sizeof(label) - 1, challenge, challenge_len);
	return gf_auth_mac(secret, secret_len, buf, sizeof(label) - 1 + challenge_len, proof);
}

static bool is_tcp_socket(int fd)
{
	int domain = 0;
	socklen_t len = sizeof(domain);
	return getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && (domain == AF_INET || domain == AF_INET6);
}

bool gf_auth_verify(const uint8_t *secret, size_t secret_len, const uint8_t *challenge,
		    size_t challenge_len, const uint8_t *mac, size_t mac_len)
{
	uint8_t want[32];
	if (mac_len != 32 || gf_auth_mac(secret, secret_len, challenge, challenge_len, want) < 0)
		return false;
	return CRYPTO_memcmp(want, mac, 32) == 0;
}

int gf_handshake_check_hello(const gf_Msg *m, gf_Component component)
{
	if (m->which_body != gf_Msg_hello_tag)
		return gf_err(GF_ERR_PROTOCOL, "handshake: expected hello, got %s", gf_msg_name(m));
	if (m->body.hello.version != GF_PROTOCOL_VERSION)
		return gf_err(GF_ERR_VERSION,
			      "handshake: peer speaks protocol version %u, this server speaks %u",
			      m->body.hello.version, GF_PROTOCOL_VERSION);
	if (m->body.hello.component != component)
		return gf_err(GF_ERR_PROTOCOL, "handshake: peer wants the %s, this is the %s",
			      component_name(m->body.hello.component), component_name(component));
	return 0;
}

/* Receive one message and insist on its kind; an Error reply becomes its code. */
static int recv_expect(int fd, struct gf_frame_reader *r, gf_Msg *m, pb_size_t tag, const char *name,
		       int64_t deadline_us)
{
	int rc = gf_msg_recv(r, fd, m, NULL, NULL, deadline_us);
	if (rc < 0)
		return rc;
	if ((rc = gf_msg_error_code(m)) < 0)
		return rc;
	if (m->which_body != tag)
		return gf_err(GF_ERR_PROTOCOL, "handshake: expected %s, got %s", name, gf_msg_name(m));
	return 0;
}

int gf_handshake_client(int fd, struct gf_frame_reader *r, gf_Component component,
			const char *peer_id, const uint8_t *secret, size_t secret_len,
			int64_t deadline_us, gf_Welcome *welcome_out)
{
	gf_Msg *m = gf_msg_new();
	int rc;
	if (!m)
		return gf_err(GF_ERR_NOMEM, "handshake: out of memory");
	m->which_body = gf_Msg_hello_tag;
	m->body.hello.version = GF_PROTOCOL_VERSION;
	m->body.hello.component = component;
	m->body.hello.pid = (uint32_t)getpid();
	snprintf(m->body.hello.peer_id, sizeof(m->body.hello.peer_id), "%s", peer_id ? peer_id : "");
	/* Over TCP, a secret is only worth something if the server proves it knows it too. */
	bool want_proof = secret && secret_len > 0 && is_tcp_socket(fd);
	uint8_t nonce[32];
	if (want_proof) {
		if ((rc = gf_random_bytes(nonce, sizeof(nonce))) < 0)
			goto out;
		memcpy(m->body.hello.challenge.bytes, nonce, sizeof(nonce));
		m->body.hello.challenge.size = sizeof(nonce);
	}
	rc = gf_msg_send(fd, m, NULL, 0, deadline_us);
	if (rc < 0)
		goto out;
	rc = recv_expect(fd, r, m, gf_Msg_welcome_tag, "welcome", deadline_us);
	if (rc < 0)
		goto out;
	if (m->body.welcome.version != GF_PROTOCOL_VERSION) {
		rc = gf_err(GF_ERR_VERSION, "handshake: server speaks protocol version %u, we speak %u",
			    m->body.welcome.version, GF_PROTOCOL_VERSION);
		goto out;
	}
	if (m->body.welcome.component != component) {
		rc = gf_err(GF_ERR_PROTOCOL, "handshake: expected the %s, reached the %s",
			    component_name(component), component_name(m->body.welcome.component));
		goto out;
	}
	gf_Welcome welcome = m->body.welcome;
	if (want_proof) {
		uint8_t want[32];
		if ((rc = gf_auth_server_proof(secret, secret_len, nonce, sizeof(nonce), want)) < 0)
			goto out;
		if (welcome.challenge.size == 0 || welcome.proof.size != sizeof(want) ||
		    CRYPTO_memcmp(want, welcome.proof.bytes, sizeof(want)) != 0) {
			rc = gf_err(GF_ERR_PERMISSION, "handshake: the server did not prove it knows the shared secret");
			goto out;
		}
	}
	if (welcome.challenge.size > 0) {
		if (!secret || secret_len == 0) {
			rc = gf_err(GF_ERR_PERMISSION, "handshake: the server requires a shared secret");
			goto out;
		}
		memset(m, 0, sizeof(*m));
		m->which_body = gf_Msg_auth_tag;
		rc = gf_auth_mac(secret, secret_len, welcome.challenge.bytes, welcome.challenge.size,
				 m->body.auth.mac.bytes);
		if (rc < 0)
			goto out;
		m->body.auth.mac.size = 32;
		rc = gf_msg_send(fd, m, NULL, 0, deadline_us);
		if (rc < 0)
			goto out;
		rc = recv_expect(fd, r, m, gf_Msg_auth_ok_tag, "auth_ok", deadline_us);
		if (rc < 0)
			goto out;
	}
	if (welcome_out)
		*welcome_out = welcome;
	rc = 0;
out:
	gf_msg_free(m);
	return rc;
}
