/* SPDX-License-Identifier: Apache-2.0 */
#include <math.h>
#include <stdbool.h>
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

/*
 * Double accumulation in sixteen independent lanes (lane k takes the
 * elements c = k mod 16), then the lanes summed pairwise in a fixed order:
 * the same result on loader and follower whatever the compiler or the CPU.
 * The AVX version does exactly the scalar version's operations, four lanes
 * at a time, and neither fuses a multiply with an add, so they round
 * identically. The failover's first answer waits on this. @xd is the input
 * already widened to double: it is shared by every row.
 */
static double lanes_sum(double acc[16], const float *row, const double *xd, size_t c, size_t len)
{
	for (size_t k = 0; c < len; c++, k++)
		acc[k] += (double)row[c] * xd[c];
	for (int w = 8; w >= 1; w /= 2)
		for (int k = 0; k < w; k++)
			acc[k] += acc[k + w];
	return acc[0];
}

static double dot_scalar(const float *row, const double *xd, size_t len)
{
	double acc[16] = { 0 };
	size_t c = 0;
	for (; c + 16 <= len; c += 16)
		for (int k = 0; k < 16; k++)
			acc[k] += (double)row[c + k] * xd[c + k];
	return lanes_sum(acc, row, xd, c, len);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

__attribute__((target("avx"))) static double dot_avx(const float *row, const double *xd, size_t len)
{
	__m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
	size_t c = 0;
	for (; c + 16 <= len; c += 16) {
		a0 = _mm256_add_pd(a0, _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(row + c)), _mm256_loadu_pd(xd + c)));
		a1 = _mm256_add_pd(a1, _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(row + c + 4)),
						     _mm256_loadu_pd(xd + c + 4)));
		a2 = _mm256_add_pd(a2, _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(row + c + 8)),
						     _mm256_loadu_pd(xd + c + 8)));
		a3 = _mm256_add_pd(a3, _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(row + c + 12)),
						     _mm256_loadu_pd(xd + c + 12)));
	}
	double acc[16];
	_mm256_storeu_pd(acc, a0);
	_mm256_storeu_pd(acc + 4, a1);
	_mm256_storeu_pd(acc + 8, a2);
	_mm256_storeu_pd(acc + 12, a3);
	/* The rest is SSE code (and tanh after it): leave no dirty upper halves. */
	_mm256_zeroupper();
	return lanes_sum(acc, row, xd, c, len);
}

/* The CPU's features are read once, by libgcc at load: this is a flag test. */
static bool have_avx(void)
{
	return __builtin_cpu_supports("avx");
}
#else
static bool have_avx(void)
{
	return false;
}
#define dot_avx dot_scalar
#endif

static double dot(const float *row, const double *xd, size_t len)
{
	return have_avx() ? dot_avx(row, xd, len) : dot_scalar(row, xd, len);
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
		double *xd = malloc(len * sizeof(double));
		if (!y || !xd) {
			free(y);
			free(xd);
			free(x);
			return -1;
		}
		for (size_t c = 0; c < len; c++)
			xd[c] = x[c];
		for (size_t r = 0; r < rows; r++) {
			double sum = dot(wd + r * len, xd, len);
			y[r] = (float)tanh(bias ? bias[r] + sum : sum);
		}
		free(xd);
		free(x);
		x = y;
		len = rows;
	}
	*out = x;
	*out_len = len;
	return 0;
}
