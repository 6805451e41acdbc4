/* SPDX-License-Identifier: Apache-2.0 */
#include "secret_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int secret_file_read(const char *path, char **out, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	char *buf = malloc(4096);
	ssize_t n = buf ? read(fd, buf, 4096) : -1;
	int err = buf ? errno : ENOMEM;
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	if (n <= 0) {
		if (buf) {
			memset(buf, 0, 4096);
			free(buf);
		}
		errno = n == 0 ? EINVAL : err;
		return -1;
	}
	*out = buf;
	*len = (size_t)n;
	return 0;
}
