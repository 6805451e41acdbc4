/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The grant's fence proof, a pure function of the grant (a MAC of its epoch
 * keyed by its session token): the lock server makes it before it grants and
 * checks it in status requests; the holder and gfctl make or forward it; the
 * etcd backend checks it against the holder's lease. No I/O.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gpufailover/lock.h"
#include "wire.h"

int gf_lock_grant_proof(const struct gf_lock_grant *grant, struct gf_lock_proof *out)
{
	if (!grant || !out || grant->epoch == 0)
		return gf_err(GF_ERR_INVALID_ARG, "lock proof: no grant");
	if (grant->has_fence_proof) {
		/* The server's copy: the same MAC, computed before the grant. */
		out->epoch = grant->epoch;
		memcpy(out->token, grant->fence_proof, GF_LOCK_PROOF_LEN);
		return 0;
	}
	uint8_t msg[32 + 8];
	int n = snprintf((char *)msg, sizeof(msg), "gf-fence-proof:");
	for (int i = 0; i < 8; i++)
		msg[n + i] = (uint8_t)(grant->epoch >> (8 * i));
	struct gf_lock_proof p = { .epoch = grant->epoch };
	int rc = gf_auth_mac(grant->session_token, sizeof(grant->session_token), msg, (size_t)n + 8, p.token);
	if (rc < 0)
		return rc;
	*out = p;
	return 0;
}
