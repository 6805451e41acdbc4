/* SPDX-License-Identifier: Apache-2.0 */
/* gfctl gpu list: the devices the memory backend sees, by index and UUID. */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gfctl.h"
#include "gpufailover.h"

static void json_string(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static int run_list(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "backend", required_argument, NULL, 'b' },
		{ NULL, 0, NULL, 0 },
	};
	bool json = false;
	int kind = GF_MEM_CUDA, c;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
		switch (c) {
		case 'j':
			json = true;
			break;
		case 'b':
			if (!strcmp(optarg, "cuda"))
				kind = GF_MEM_CUDA;
			else if (!strcmp(optarg, "host"))
				kind = GF_MEM_HOST;
			else {
				fprintf(stderr, "gfctl gpu: --backend must be cuda or host, not \"%s\"\n", optarg);
				return GFCTL_EXIT_USAGE;
			}
			break;
		default:
			fprintf(stderr, "gfctl gpu list: unknown option or missing value: '%s' (see 'gfctl gpu list --help')\n",
				argv[optind - 1]);
			return GFCTL_EXIT_USAGE;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "gfctl gpu list: unexpected argument '%s'\n", argv[optind]);
		return GFCTL_EXIT_USAGE;
	}
	size_t n = 0;
	int rc = gf_device_list(kind, NULL, 0, &n);
	struct gf_device_info *devs = NULL;
	if (rc == 0 && n && !(devs = calloc(n, sizeof(*devs))))
		rc = GF_ERR_NOMEM;
	if (rc == 0)
		rc = gf_device_list(kind, devs, n, &n);
	if (rc < 0) {
		fprintf(stderr, "gfctl gpu list: %s: %s\n", gf_error_name(rc), gf_error_detail());
		free(devs);
		return gfctl_exit_code(rc);
	}
	if (json) {
		printf("{\"backend\":\"%s\",\"devices\":[", gf_mem_kind_name(kind));
		for (size_t i = 0; i < n; i++) {
			printf("%s{\"index\":%d,\"uuid\":", i ? "," : "", devs[i].index);
			json_string(devs[i].uuid);
			printf(",\"name\":");
			json_string(devs[i].name);
			printf(",\"total_bytes\":%" PRIu64 ",\"free_bytes\":%" PRIu64 ",\"mig\":%s}", devs[i].total_bytes,
			       devs[i].free_bytes, devs[i].mig ? "true" : "false");
		}
		printf("]}\n");
	} else {
		printf("%-5s %-44s %-28s %14s %14s\n", "INDEX", "UUID", "NAME", "TOTAL_BYTES", "FREE_BYTES");
		for (size_t i = 0; i < n; i++)
			printf("%-5d %-44s %-28s %14" PRIu64 " %14" PRIu64 "\n", devs[i].index, devs[i].uuid, devs[i].name,
			       devs[i].total_bytes, devs[i].free_bytes);
	}
	free(devs);
	return GFCTL_OK;
}

static const struct gfctl_cmd gpu_cmds[] = {
	{ "list", "[--json] [--backend cuda|host]",
	  "List each visible device: index, UUID, name, total and free memory.",
	  "Devices as the process sees them (after CUDA_VISIBLE_DEVICES). An index or a\n"
	  "UUID (GPU-... or MIG-..., or a unique prefix) from this list is what every\n"
	  "--device flag accepts.",
	  "  --json                 the list as one JSON object\n"
	  "  --backend cuda|host    which memory backend's devices (default cuda)\n",
	  "; 1 when the driver cannot be loaded (the detail says why)", run_list },
	{ 0 },
};

const struct gfctl_group gfctl_gpu_group = {
	"gpu", "Devices by index and UUID, as the memory backend sees them.", gpu_cmds,
};
