/* The attention of a few new tokens (a decode step, a DFlash verify block) on the CPU, from the QKV projection's
 * output to the attention output, in one call: bias, per-head RMS norms of q and k (and the weightless v norm),
 * RoPE, the cache write, and softmax attention over the slots each query sees.
 *
 * Why one call: in torch these are ~25 small ops per layer (slices, norms, the rotation's halves, index writes, two
 * bmm and a softmax), ~0.2 ms of dispatch on 2 cores against a few microseconds of arithmetic at T = 1.
 *
 * Visibility comes from the cache's slot positions, the rule every cache form shares (kv_cache.py): slot s is seen by
 * the query at position p iff 0 <= pos[s] <= p and, on a sliding layer, p - pos[s] < window. So position-indexed
 * caches and sliding rings take the same loop, and the slots this step writes are visible to its later queries only.
 *
 * Numerics: the rotation is the torch reference's operations in its order (products rounded, then the difference;
 * -ffp-contract=off), so it agrees bit for bit given the same cos/sin tables; the norms' and the softmax's sums run
 * in another order (fp32 rounding). Built and loaded by kernels/cpu/native.py; the reference is the composition of
 * ops in kernels/ops.py (test_native_attention.py). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/* rms_norm.c (the same library): y = norm(x) * w row by row; in place when y == x */
int bolt_rms_norm(const float *x, const float *w, const float *r, float *y, int64_t rows, int64_t D, float eps);

/* sum a[i] b[i] in 16 partial sums (which the compiler vectorizes; a single running sum can't be reordered), then
 * pairwise: the portable loop, for a head size that isn't whole vectors */
static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++) acc[i % 16] += a[i] * b[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

/* the cache rule (module doc): the query at position p sees the key at kp */
static inline int sees(int64_t kp, int64_t p, int64_t window) {
    return kp >= 0 && kp <= p && !(window > 0 && p - kp >= window);
}

/* a query's scores over the first n_scan slots (-inf where it sees no key) into sc, by dotf; returns the max */
static inline __attribute__((always_inline)) float scores_by(float (*dotf)(const float *, const float *, int64_t),
                                                              const float *qh, const float *K, int64_t hd,
                                                              const int64_t *pos, int64_t p, int64_t window,
                                                              int64_t n_scan, float scale, float *sc) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n_scan; j++) {
        sc[j] = sees(pos[j], p, window) ? dotf(qh, K + j * hd, hd) * scale : -INFINITY;
        if (sc[j] > m) m = sc[j];
    }
    return m;
}

#include "attention_vec.h"  /* the vector paths (AW lanes) and attend_group */

/* one head [D]: the first 2P dims rotate, pairs (i, i + P) (neox) or (2i, 2i + 1) (llama's "norm") */
static void rope(float *x, const float *c, const float *s, int64_t P, int neox) {
    for (int64_t i = 0; i < P; i++) {
        int64_t a = neox ? i : 2 * i, b = neox ? i + P : 2 * i + 1;
        float x1 = x[a], x2 = x[b];
        x[a] = x1 * c[i] - x2 * s[i];
        x[b] = x2 * c[i] + x1 * s[i];
    }
}

/* Returns 0, or -1 for bad sizes or no memory.
 *   qkv [T, W] fp32, W = n_head*hd (+ 2*n_kv*hd when write): q | k | v of each new token; bias [W] or NULL
 *   q_norm, k_norm [hd] or NULL; v_norm: the weightless norm of v
 *   cos, sin [T, P]: this step's rotation; neox: the pair layout
 *   kc, vc [n_kv, S, hd] fp32, pos [S]: the layer's cache; write: store this step's k, v and positions [T] at slot
 *   position % S on a sliding ring (ring), at slot position otherwise
 *   n_scan: the leading slots that can hold a visible key; window > 0: a sliding layer
 *   out [T, n_head*hd] */
int bolt_attention_step(const float *qkv, int64_t T, int64_t n_head, int64_t n_kv, int64_t hd, const float *bias,
                        const float *q_norm, const float *k_norm, int v_norm, float eps, const float *cos,
                        const float *sin, int64_t P, int neox, float *kc, float *vc, int64_t *pos, int64_t S,
                        int write, const int64_t *positions, int ring, int64_t n_scan, int64_t window,
                        float scale, float *out, int n_threads) {
    if (T < 1 || n_head < 1 || n_kv < 1 || n_head % n_kv || hd < 1 || 2 * P > hd || n_scan < 1 || n_scan > S)
        return -1;
    int64_t nq = n_head * hd, nkv = n_kv * hd, W = nq + (write ? 2 * nkv : 0);
    for (int64_t t = 0; t < T; t++) {  /* refuse before anything is written */
        int64_t slot = ring ? positions[t] % S : positions[t];
        if (positions[t] < 0 || (write && slot >= S)) return -1;
    }
    float *q = malloc(sizeof(float) * (size_t)(T * nq));
    if (!q) return -1;
    for (int64_t t = 0; t < T; t++) {
        const float *row = qkv + t * W;
        const float *c = cos + t * P, *s = sin + t * P;
        float *qt = q + t * nq;
        for (int64_t i = 0; i < nq; i++) qt[i] = bias ? row[i] + bias[i] : row[i];
        for (int64_t h = 0; h < n_head; h++) {
            if (q_norm) bolt_rms_norm(qt + h * hd, q_norm, NULL, qt + h * hd, 1, hd, eps);
            rope(qt + h * hd, c, s, P, neox);
        }
        if (!write) continue;
        int64_t slot = ring ? positions[t] % S : positions[t];
        for (int64_t h = 0; h < n_kv; h++) {
            float *k = kc + (h * S + slot) * hd, *v = vc + (h * S + slot) * hd;
            for (int64_t i = 0; i < hd; i++) {
                int64_t j = nq + h * hd + i;
                k[i] = bias ? row[j] + bias[j] : row[j];
                v[i] = bias ? row[j + nkv] + bias[j + nkv] : row[j + nkv];
            }
            if (k_norm) bolt_rms_norm(k, k_norm, NULL, k, 1, hd, eps);
            rope(k, c, s, P, neox);
            if (v_norm) bolt_rms_norm(v, NULL, NULL, v, 1, hd, eps);
        }
        pos[slot] = positions[t];
    }
    int64_t group = n_head / n_kv, items = T * n_head;
    /* a parallel region costs ~10 us: worth it only when the keys are many */
    int threads = items * n_scan * hd >= (1 << 15) ? n_threads : 1;
    int failed = 0;
#ifdef AW
    if (hd % AW == 0) {
        /* the queries of a kv head (T rows x group heads) together over tiles of its keys (attend_group), in
         * chunks: enough of them for the threads (Gemma 3 270M has one kv head) */
        int64_t G = T * group, per_kv = (threads + n_kv - 1) / n_kv, chunk = (G + per_kv - 1) / per_kv;
        int64_t nchunks = (G + chunk - 1) / chunk, ld = (n_scan + 16 + 15) / 16 * 16;
        #pragma omp parallel for num_threads(threads) schedule(static) reduction(|: failed)
        for (int64_t it = 0; it < n_kv * nchunks; it++) {
            int64_t kvh = it / nchunks, g0 = it % nchunks * chunk, m = G - g0 < chunk ? G - g0 : chunk;
            float *sc = malloc(sizeof(float) * (size_t)(m * (ld + hd + 16)));  /* scores, odd sums, maxima/lane sums */
            const float **qs = malloc(sizeof(float *) * (size_t)m);
            float **os = malloc(sizeof(float *) * (size_t)m);
            int64_t *ps = malloc(sizeof(int64_t) * (size_t)m);
            if (!sc || !qs || !os || !ps) {
                failed = 1;
            } else {
                for (int64_t i = 0; i < m; i++) {  /* query g: row g / group, head kvh * group + g % group */
                    int64_t t = (g0 + i) / group, h = kvh * group + (g0 + i) % group;
                    qs[i] = q + t * nq + h * hd;
                    os[i] = out + t * nq + h * hd;
                    ps[i] = positions[t];
                    for (int64_t j = n_scan; j < ld; j++) sc[i * ld + j] = -INFINITY;
                }
                attend_group(qs, ps, m, kc + kvh * S * hd, vc + kvh * S * hd, hd, pos, window, n_scan, scale, sc,
                             ld, os, sc + m * ld, sc + m * (ld + hd));
            }
            free(sc), free(qs), free(os), free(ps);
        }
        free(q);
        return failed ? -1 : 0;
    }
#endif
    #pragma omp parallel for num_threads(threads) schedule(static) reduction(|: failed)
    for (int64_t it = 0; it < items; it++) {
        int64_t t = it / n_head, h = it % n_head, kvh = h / group, p = positions[t];
        const float *qh = q + t * nq + h * hd;
        const float *K = kc + kvh * S * hd, *V = vc + kvh * S * hd;
        float *o = out + t * nq + h * hd;
        float *sc = malloc(sizeof(float) * (size_t)(n_scan + 16));
        if (!sc) {
            failed = 1;
            continue;
        }
        for (int64_t j = n_scan; j < n_scan + 16; j++) sc[j] = -INFINITY;
        float m = scores_by(dot, qh, K, hd, pos, p, window, n_scan, scale, sc);
        memset(o, 0, sizeof(float) * (size_t)hd);
        float l = 0.0f;
        for (int64_t j = 0; j < n_scan; j++) {
            if (sc[j] == -INFINITY) continue;
            float e = expf(sc[j] - m);
            l += e;
            const float *v = V + j * hd;
            for (int64_t i = 0; i < hd; i++) o[i] += e * v[i];
        }
        float inv = l > 0.0f ? 1.0f / l : 0.0f;  /* l > 0: the query's own key is always visible */
        for (int64_t i = 0; i < hd; i++) o[i] *= inv;
        free(sc);
    }
    free(q);
    return failed ? -1 : 0;
}
