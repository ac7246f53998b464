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

/* Vectors for the scores, the softmax's exp and the value sums. Every query's arithmetic is its own, whatever T is
 * (a verify block's row equals the step at that position, bit for bit): a key's score is one dot in a fixed order, the
 * exp is the same polynomial at every index (the scores are padded to whole vectors), and the sums over keys run in key
 * order. With -march=native: AVX-512 (16 lanes), AVX2 + FMA (8), else the portable loops. */
#if defined(__AVX512F__)
#define AW 16
typedef __m512 av;
#define AV_LOAD _mm512_loadu_ps
#define AV_STORE _mm512_storeu_ps
#define AV_SET1 _mm512_set1_ps
#define AV_ZERO _mm512_setzero_ps()
#define AV_FMA _mm512_fmadd_ps
#define AV_ADD _mm512_add_ps
#define AV_MUL _mm512_mul_ps
#define AV_SUB _mm512_sub_ps
#define AV_MAX _mm512_max_ps
#define AV_ROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define AV_HSUM _mm512_reduce_add_ps
static inline av av_pow2(av y, av n) { return _mm512_scalef_ps(y, n); }
static inline av av_zero_where_neg_inf(av e, av x) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, AV_SET1(-INFINITY), _CMP_NEQ_OQ), e);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define AW 8
typedef __m256 av;
#define AV_LOAD _mm256_loadu_ps
#define AV_STORE _mm256_storeu_ps
#define AV_SET1 _mm256_set1_ps
#define AV_ZERO _mm256_setzero_ps()
#define AV_FMA _mm256_fmadd_ps
#define AV_ADD _mm256_add_ps
#define AV_MUL _mm256_mul_ps
#define AV_SUB _mm256_sub_ps
#define AV_MAX _mm256_max_ps
#define AV_ROUND(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline float AV_HSUM(av v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
static inline av av_pow2(av y, av n) {  /* y * 2^n, n integral in [-127, 127] */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
static inline av av_zero_where_neg_inf(av e, av x) {
    return _mm256_and_ps(e, _mm256_cmp_ps(x, AV_SET1(-INFINITY), _CMP_NEQ_OQ));
}
#endif

#ifdef AW
/* exp(x), x <= 0 (a score minus the row's max): 2^n e^r with |r| <= ln2/2 and Cephes' degree-6 expf polynomial (rel.
 * error ~1e-7, the float rounding of expf); x = -inf gives 0 */
static inline av av_exp(av x) {
    av xc = AV_MAX(x, AV_SET1(-87.0f));
    av n = AV_ROUND(AV_MUL(xc, AV_SET1(1.44269504088896341f)));
    av r = AV_SUB(AV_SUB(xc, AV_MUL(n, AV_SET1(0.693359375f))), AV_MUL(n, AV_SET1(-2.12194440e-4f)));
    av p = AV_SET1(1.9875691500e-4f);
    p = AV_FMA(p, r, AV_SET1(1.3981999507e-3f));
    p = AV_FMA(p, r, AV_SET1(8.3334519073e-3f));
    p = AV_FMA(p, r, AV_SET1(4.1665795894e-2f));
    p = AV_FMA(p, r, AV_SET1(1.6666665459e-1f));
    p = AV_FMA(p, r, AV_SET1(5.0000001201e-1f));
    av y = AV_ADD(AV_FMA(AV_MUL(p, r), r, r), AV_SET1(1.0f));
    return av_zero_where_neg_inf(av_pow2(y, n), x);
}

/* a . b over n = a whole number of vectors, two chains */
static inline float vdot(const float *restrict a, const float *restrict b, int64_t n) {
    av s0 = AV_ZERO, s1 = AV_ZERO;
    int64_t i = 0;
    for (; i + 2 * AW <= n; i += 2 * AW) {
        s0 = AV_FMA(AV_LOAD(a + i), AV_LOAD(b + i), s0);
        s1 = AV_FMA(AV_LOAD(a + i + AW), AV_LOAD(b + i + AW), s1);
    }
    if (i < n) s0 = AV_FMA(AV_LOAD(a + i), AV_LOAD(b + i), s0);
    return AV_HSUM(AV_ADD(s0, s1));
}

/* o[0 .. NV*AW) = sum over the keys j with e[j] != 0 of e[j] v_j, in key order, held in NV registers */
#define VSUM(NV)                                                                                                     \
    static inline void vsum_##NV(const float *e, const float *V, int64_t hd, int64_t n, float *o) {                 \
        av acc[NV];                                                                                                  \
        for (int u = 0; u < NV; u++) acc[u] = AV_ZERO;                                                               \
        for (int64_t j = 0; j < n; j++) {                                                                            \
            if (e[j] == 0.0f) continue;                                                                              \
            av ej = AV_SET1(e[j]);                                                                                   \
            const float *v = V + j * hd;                                                                             \
            for (int u = 0; u < NV; u++) acc[u] = AV_FMA(ej, AV_LOAD(v + u * AW), acc[u]);                           \
        }                                                                                                            \
        for (int u = 0; u < NV; u++) AV_STORE(o + u * AW, acc[u]);                                                   \
    }
VSUM(1)
VSUM(2)
VSUM(4)
VSUM(8)

/* one query's scores over the keys it sees (the others -inf) into sc, its q held in NV registers; returns the max */
#define VSCORES(NV)                                                                                                  \
    static inline float vscores_##NV(const float *qh, const float *K, int64_t hd, const int64_t *pos, int64_t p,   \
                                     int64_t window, int64_t n_scan, float scale, float *sc) {                      \
        av qv[NV];                                                                                                   \
        for (int u = 0; u < NV; u++) qv[u] = AV_LOAD(qh + u * AW);                                                   \
        float m = -INFINITY;                                                                                         \
        for (int64_t j = 0; j < n_scan; j++) {                                                                       \
            if (!sees(pos[j], p, window)) {                                                                          \
                sc[j] = -INFINITY;                                                                                   \
                continue;                                                                                            \
            }                                                                                                        \
            const float *k = K + j * hd;                                                                             \
            av s0 = AV_ZERO, s1 = AV_ZERO;                                                                           \
            for (int u = 0; u + 1 < NV; u += 2) {                                                                    \
                s0 = AV_FMA(qv[u], AV_LOAD(k + u * AW), s0);                                                         \
                s1 = AV_FMA(qv[u + 1], AV_LOAD(k + (u + 1) * AW), s1);                                               \
            }                                                                                                        \
            if (NV % 2) s0 = AV_FMA(qv[NV - 1], AV_LOAD(k + (NV - 1) * AW), s0);                                     \
            sc[j] = AV_HSUM(AV_ADD(s0, s1)) * scale;                                                                 \
            if (sc[j] > m) m = sc[j];                                                                                \
        }                                                                                                            \
        return m;                                                                                                    \
    }
VSCORES(1)
VSCORES(2)
VSCORES(4)
VSCORES(8)

/* the scores of a head size that is whole vectors: q in registers up to 8 vectors, else vdot */
static float vscores(const float *qh, const float *K, int64_t hd, const int64_t *pos, int64_t p, int64_t window,
                     int64_t n_scan, float scale, float *sc) {
    switch (hd / AW) {
    case 1: return vscores_1(qh, K, hd, pos, p, window, n_scan, scale, sc);
    case 2: return vscores_2(qh, K, hd, pos, p, window, n_scan, scale, sc);
    case 4: return vscores_4(qh, K, hd, pos, p, window, n_scan, scale, sc);
    case 8: return vscores_8(qh, K, hd, pos, p, window, n_scan, scale, sc);
    default: return scores_by(vdot, qh, K, hd, pos, p, window, n_scan, scale, sc);
    }
}

/* one query's softmax-weighted value sum: o [hd] from its scores sc [n_scan, padded to whole vectors with -inf].
 * The weights' sum runs in AW lanes then one horizontal sum (a scalar running sum was a chain of one add per key);
 * the chunks past the query's last visible key add exact zeros, so a verify row's sum is the step's */
static void softmax_values(float *sc, int64_t n_scan, float m, const float *V, int64_t hd, float *o) {
    int64_t npad = (n_scan + AW - 1) / AW * AW;
    av lv = AV_ZERO;
    for (int64_t j = 0; j < npad; j += AW) {
        av e = av_exp(AV_SUB(AV_LOAD(sc + j), AV_SET1(m)));
        AV_STORE(sc + j, e);
        lv = AV_ADD(lv, e);
    }
    float l = AV_HSUM(lv);
    for (int64_t i = 0; i < hd;) {  /* slices of up to 8 vectors, each held in registers over all the keys */
        int64_t left = (hd - i) / AW;
        if (left >= 8) vsum_8(sc, V + i, hd, n_scan, o + i), i += 8 * AW;
        else if (left >= 4) vsum_4(sc, V + i, hd, n_scan, o + i), i += 4 * AW;
        else if (left >= 2) vsum_2(sc, V + i, hd, n_scan, o + i), i += 2 * AW;
        else vsum_1(sc, V + i, hd, n_scan, o + i), i += AW;
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;  /* l > 0: the query's own key is always visible */
    for (int64_t i = 0; i < hd; i++) o[i] *= inv;
}
#endif

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
#ifdef AW
        if (hd % AW == 0) {
            float mv = vscores(qh, K, hd, pos, p, window, n_scan, scale, sc);
            softmax_values(sc, n_scan, mv, V, hd, o);
            free(sc);
            continue;
        }
#endif
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
