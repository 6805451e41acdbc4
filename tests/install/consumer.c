/* SPDX-License-Identifier: Apache-2.0 */
/* An out-of-tree program on the installed library: built by the test with
 * nothing but `pkg-config --cflags --libs [--static] libgpufailover`. It
 * touches the wire code (nanopb), JSON and the memory backend, so a missing
 * private dependency fails the link. */
#include <stdio.h>
#include <string.h>

#include <gpufailover.h>
#include <gpufailover/lock.h>
#include <gpufailover/mem.h>
#include <gpufailover/safetensors.h>

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: consumer UNIX_SOCKET_PATH_WITHOUT_SERVER\n");
		return 2;
	}
	uint64_t ms;
	if (gf_parse_duration_ms("1m30s", &ms) || ms != 90000)
		return 1;
	gf_mem *m;
	if (gf_mem_open(&m, GF_MEM_HOST, 0))
		return 1;
	gf_mem_free(m);
	char uri[512];
	snprintf(uri, sizeof(uri), "unix://%s", argv[1]);
	int rc = gf_lock_ping(uri, NULL, 0, 1000);
	if (rc != GF_ERR_UNREACHABLE)
		return 1;
	if (gf_safetensors_dtype_bits("BF16") != 16)
		return 1;
	printf("ok %s\n", gf_version());
	return 0;
}
