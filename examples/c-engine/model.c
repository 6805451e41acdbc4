/* SPDX-License-Identifier: Apache-2.0 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Uniform in [-1, 1) from the top 24 bits: exact in a float. */
static float unit(uint64_t *s)
{
	return (float)((int64_t)(splitmix64(s) >> 40) - (1 << 23)) / (float)(1 << 23);
}

static int add(struct model *m, const char *name, const char *dtype, unsigned ndim, const uint64_t *shape,
	       uint64_t nbytes, const void *data)
{
	struct model_tensor *t = realloc(m->t, (m->n + 1) * sizeof(*t));
	if (!t)
		return -1;
	m->t = t;
	t = &m->t[m->n];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (!t->name)
		return -1;
	snprintf(t->dtype, sizeof(t->dtype), "%s", dtype);
	t->ndim = ndim;
	memcpy(t->shape, shape, ndim * sizeof(*shape));
	t->nbytes = nbytes;
	t->data = data;
	m->n++;
	return 0;
}

int model_generate(struct model *m, unsigned layers, unsigned dim, void **buf)
{
	size_t per_layer = (size_t)dim * dim + dim;
	float *w = malloc(per_layer * layers * sizeof(float));
	if (!w)
		return -1;
	memset(m, 0, sizeof(*m));
	uint64_t s = 0x5eed0f9a11011e5ULL; /* fixed: every run generates the same weights */
	/* Scale so activations neither vanish nor saturate through the tanh chain. */
	float scale = 1.5f / sqrtf((float)dim);
	for (size_t i = 0; i < per_layer * layers; i++)
		w[i] = unit(&s) * scale;
	for (unsigned l = 0; l < layers; l++) {
		char name[64];
		uint64_t shape[2] = { dim, dim };
		float *base = w + l * per_layer;
		snprintf(name, sizeof(name), "layers.%u.weight", l);
		if (add(m, name, "F32", 2, shape, (uint64_t)dim * dim * 4, base))
			goto fail;
		snprintf(name, sizeof(name), "layers.%u.bias", l);
		if (add(m, name, "F32", 1, shape, (uint64_t)dim * 4, base + (size_t)dim * dim))
			goto fail;
	}
	*buf = w;
	return 0;
fail:
	model_clear(m);
	free(w);
	return -1;
}

int model_from_safetensors(struct model *m, const gf_safetensors *f)
{
	memset(m, 0, sizeof(*m));
	for (size_t i = 0; i < gf_safetensors_count(f); i++) {
		struct gf_safetensors_tensor t;
		if (gf_safetensors_at(f, i, &t) || add(m, t.name, t.dtype, t.ndim, t.shape, t.end - t.begin, t.data)) {
			model_clear(m);
			return -1;
		}
	}
	return 0;
}

int model_write(const struct model *m, const char *path, char *err, size_t errlen)
{
	struct st_tensor_in *in = calloc(m->n ? m->n : 1, sizeof(*in));
	if (!in) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (size_t i = 0; i < m->n; i++)
		in[i] = (struct st_tensor_in){ m->t[i].name, m->t[i].dtype, m->t[i].ndim, m->t[i].shape,
					       m->t[i].data };
	int rc = st_write(path, in, m->n, err, errlen);
	free(in);
	return rc;
}

void model_clear(struct model *m)
{
	for (size_t i = 0; i < m->n; i++)
		free(m->t[i].name);
	free(m->t);
	memset(m, 0, sizeof(*m));
}

static int is_f32(const struct model_tensor *t, unsigned ndim)
{
	return t->ndim == ndim && !strcmp(t->dtype, "F32");
}

int model_infer(const struct model *m, uint64_t seed, float **out, size_t *out_len)
{
	size_t len = 8;
	for (size_t i = 0; i < m->n; i++) {
		if (is_f32(&m->t[i], 2) && m->t[i].shape[1] > 0) {
			len = (size_t)m->t[i].shape[1];
			break;
		}
	}
	float *x = malloc(len * sizeof(float));
	if (!x)
		return -1;
	uint64_t s = seed ^ 0x1f0e5eedULL;
	for (size_t i = 0; i < len; i++)
		x[i] = unit(&s);
	for (size_t i = 0; i < m->n; i++) {
		const struct model_tensor *w = &m->t[i];
		if (!is_f32(w, 2) || w->shape[1] != len || w->shape[0] == 0)
			continue;
		size_t rows = (size_t)w->shape[0];
		const float *wd = w->data;
		const float *bias = NULL;
		if (i + 1 < m->n && is_f32(&m->t[i + 1], 1) && m->t[i + 1].shape[0] == rows)
			bias = m->t[i + 1].data;
		float *y = malloc(rows * sizeof(float));
		if (!y) {
			free(x);
			return -1;
		}
		for (size_t r = 0; r < rows; r++) {
			/* Double accumulation in four independent chains, summed in a
			 * fixed order: the same result on loader and follower whatever
			 * the compiler does, at four times the speed of one chain. */
			double acc[4] = {0.0, 0.0, 0.0, 0.0};
			const float *row = wd + r * len;
			size_t c = 0;
			for (; c + 4 <= len; c += 4)
				for (int k = 0; k < 4; k++)
					acc[k] += (double)row[c + k] * (double)x[c + k];
			for (; c < len; c++)
				acc[0] += (double)row[c] * (double)x[c];
			double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
			y[r] = (float)tanh(bias ? bias[r] + sum : sum);
		}
		free(x);
		x = y;
		len = rows;
	}
	*out = x;
	*out_len = len;
	return 0;
}
