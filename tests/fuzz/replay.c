/* SPDX-License-Identifier: Apache-2.0 */
/* Replays a fuzz corpus through a fuzz target as an ordinary test, so the
 * corpus guards against regressions without clang or libFuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
	int files = 0;
	for (int i = 1; i < argc; i++) {
		DIR *d = opendir(argv[i]);
		struct dirent *e;
		if (!d) {
			printf("Bail out! cannot open corpus %s\n", argv[i]);
			return 1;
		}
		while ((e = readdir(d))) {
			char path[4096];
			if (e->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
			FILE *f = fopen(path, "rb");
			if (!f)
				continue;
			fseek(f, 0, SEEK_END);
			long n = ftell(f);
			rewind(f);
			uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
			size_t got = fread(buf, 1, (size_t)n, f);
			fclose(f);
			LLVMFuzzerTestOneInput(buf, got);
			free(buf);
			files++;
			printf("ok %d - %s\n", files, e->d_name);
		}
		closedir(d);
	}
	if (files == 0) {
		printf("Bail out! empty corpus\n");
		return 1;
	}
	printf("1..%d\n", files);
	return 0;
}
