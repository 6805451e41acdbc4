/* SPDX-License-Identifier: Apache-2.0 */
/* gfctl gpu list: the devices the memory backend sees, by index and UUID. */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gfctl.h"
#include "gpufailover.h"

/* The list as one JSON object (jansson escapes the names). NULL when out of memory
 * or a name is not UTF-8. */
static char *list_json(int kind, const struct gf_device_info *devs, size_t n)
{
	json_t *arr = json_array();
	for (size_t i = 0; arr && i < n; i++) {
		json_t *d = json_pack("{s:i, s:s, s:s, s:I, s:I, s:b}", "index", devs[i].index, "uuid", devs[i].uuid,
				      "name", devs[i].name, "total_bytes", (json_int_t)devs[i].total_bytes,
				      "free_bytes", (json_int_t)devs[i].free_bytes, "mig", devs[i].mig ? 1 : 0);
		if (!d || json_array_append_new(arr, d) < 0) {
			json_decref(arr);
			arr = NULL;
		}
	}
	json_t *o = arr ? json_pack("{s:s, s:o}", "backend", gf_mem_kind_name(kind), "devices", arr) : NULL;
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return text;
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
	while ((c = getopt_long(argc, argv, GFCTL_OPTSTRING, opts, NULL)) != -1) {
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
			gfctl_bad_option("gpu", argv, c, opts);
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
		char *text = list_json(kind, devs, n);
		if (!text) {
			fprintf(stderr, "gfctl gpu list: cannot write the list as JSON (out of memory, or a name not UTF-8)\n");
			free(devs);
			return GFCTL_EXIT_FAILURE;
		}
		puts(text);
		free(text);
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
