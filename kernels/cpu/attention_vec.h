/* attention_step.c's vector part: one translation unit with it (included after its dot, sees and scores_by).
 * Built and hashed with it by kernels/cpu/native.py (every *.h of kernels/cpu). */
#ifndef BOLT_ATTENTION_VEC_H
#define BOLT_ATTENTION_VEC_H

/* Vectors for the scores, the softmax's exp and the value sums. Every query's arithmetic is its own, whatever T is
 * (a verify block's row equals the step at that position, bit for bit): a key's score is one dot in a fixed order, the
 * exp is the same polynomial at every index (the scores are padded to whole vectors), and the sums over keys run in key
 * order. With -march=native: AVX-512 (16 lanes), AVX2 + FMA (8), else the portable loops. */
#include "vec_f32.h"  /* AW, the AV_* names, av_exp */

#ifdef AW
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

/* o[0 .. NV*AW) += sum over the even keys j (by index) with e[j] != 0 of e[j] v_j, o2 the same over the odd ones,
 * each in key order, held in 2 NV registers: two chains, since one FMA chain per vector waited on the FMA's latency
 * at every key (most of a verify block's attention). Over a tile of keys at a time (n even, or the last tile), o and
 * o2 carrying the sums from tile to tile (stored and loaded exactly: the values of one pass over all keys) */
#define VSUM(NV)                                                                                                     \
    static inline void vsum_##NV(const float *e, const float *V, int64_t hd, int64_t n, float *o, float *o2) {      \
        av acc[NV], acc2[NV];                                                                                        \
        for (int u = 0; u < NV; u++) acc[u] = AV_LOAD(o + u * AW), acc2[u] = AV_LOAD(o2 + u * AW);                   \
        for (int64_t j = 0; j < n; j += 2) {                                                                         \
            if (e[j] != 0.0f) {                                                                                      \
                av ej = AV_SET1(e[j]);                                                                               \
                const float *v = V + j * hd;                                                                         \
                for (int u = 0; u < NV; u++) acc[u] = AV_FMA(ej, AV_LOAD(v + u * AW), acc[u]);                       \
            }                                                                                                        \
            if (j + 1 < n && e[j + 1] != 0.0f) {                                                                     \
                av ej = AV_SET1(e[j + 1]);                                                                           \
                const float *v = V + (j + 1) * hd;                                                                   \
                for (int u = 0; u < NV; u++) acc2[u] = AV_FMA(ej, AV_LOAD(v + u * AW), acc2[u]);                     \
            }                                                                                                        \
        }                                                                                                            \
        for (int u = 0; u < NV; u++) AV_STORE(o + u * AW, acc[u]), AV_STORE(o2 + u * AW, acc2[u]);                   \
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

#if AW == 16
/* 16 vectors -> one: lane j the sum of s[j]'s 16 lanes (a fixed tree per lane, so a key's score depends on its own
 * products and its index mod 16 only): unpack/add within 128-bit lanes, then across them */
static inline av hsum16(av s[16]) {
    av t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(s[2 * i], s[2 * i + 1]), _mm512_unpackhi_ps(s[2 * i], s[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    av w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
    av w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}

/* which of the 16 slots at pos the query at p sees (the cache rule, sees()), n <= 16 of them there */
static inline __mmask16 sees16(const int64_t *pos, int64_t p, int64_t window, int n) {
    __mmask8 in = n >= 8 ? 0xFF : (__mmask8)((1u << n) - 1), in2 = n >= 16 ? 0xFF : n > 8 ? (__mmask8)((1u << (n - 8)) - 1) : 0;
    __m512i P = _mm512_set1_epi64(p), Z = _mm512_setzero_si512(), Wm = _mm512_set1_epi64(p - window);
    __m512i a = _mm512_maskz_loadu_epi64(in, pos), b = _mm512_maskz_loadu_epi64(in2, pos + 8);
    __mmask8 ma = _mm512_mask_cmpge_epi64_mask(in, a, Z) & _mm512_cmple_epi64_mask(a, P);
    __mmask8 mb = _mm512_mask_cmpge_epi64_mask(in2, b, Z) & _mm512_cmple_epi64_mask(b, P);
    if (window > 0) ma &= _mm512_cmpgt_epi64_mask(a, Wm), mb &= _mm512_cmpgt_epi64_mask(b, Wm);
    return (__mmask16)(ma | ((unsigned)mb << 8));
}

/* vscores_NV over keys in blocks of 16 (K from a 16-aligned key index): each key's 16 lanes of products as the
 * one-key loop makes them, then hsum16 for 16 keys at once (a horizontal sum per key was most of the scores' time) */
#define VSCORES16(NV)                                                                                                \
    static inline float vscores16_##NV(const float *qh, const float *K, int64_t hd, const int64_t *pos, int64_t p, \
                                       int64_t window, int64_t n_scan, float scale, float *sc) {                    \
        av qv[NV], m = AV_SET1(-INFINITY);                                                                           \
        for (int u = 0; u < NV; u++) qv[u] = AV_LOAD(qh + u * AW);                                                   \
        for (int64_t j0 = 0; j0 < n_scan; j0 += 16) {                                                                \
            int n = n_scan - j0 < 16 ? (int)(n_scan - j0) : 16;                                                      \
            __mmask16 vis = sees16(pos + j0, p, window, n);                                                          \
            av s[16];                                                                                                \
            for (int j = 0; j < 16; j++) {                                                                           \
                av s0 = AV_ZERO, s1 = AV_ZERO;                                                                       \
                if (j < n && (vis >> j & 1)) {                                                                       \
                    const float *k = K + (j0 + j) * hd;                                                              \
                    for (int u = 0; u + 1 < NV; u += 2) {                                                            \
                        s0 = AV_FMA(qv[u], AV_LOAD(k + u * AW), s0);                                                 \
                        s1 = AV_FMA(qv[u + 1], AV_LOAD(k + (u + 1) * AW), s1);                                       \
                    }                                                                                                \
                    if (NV % 2) s0 = AV_FMA(qv[NV - 1], AV_LOAD(k + (NV - 1) * AW), s0);                             \
                }                                                                                                    \
                s[j] = AV_ADD(s0, s1);                                                                               \
            }                                                                                                        \
            av r = _mm512_mask_blend_ps(vis, AV_SET1(-INFINITY), AV_MUL(hsum16(s), AV_SET1(scale)));                \
            m = AV_MAX(m, r);                                                                                        \
            if (n == 16) AV_STORE(sc + j0, r);                                                                       \
            else _mm512_mask_storeu_ps(sc + j0, (__mmask16)((1u << n) - 1), r);                                      \
        }                                                                                                            \
        return _mm512_reduce_max_ps(m);                                                                              \
    }
VSCORES16(1)
VSCORES16(2)
VSCORES16(4)
VSCORES16(8)
#endif

/* a query's scores over a tile of keys starting at a multiple of 16 (the key index fixes its sums' order) */
static inline float tile_scores(const float *qh, const float *K, int64_t hd, const int64_t *pos, int64_t p,
                                int64_t window, int64_t n, float scale, float *sc) {
#if AW == 16
    switch (hd / AW) {
    case 1: return vscores16_1(qh, K, hd, pos, p, window, n, scale, sc);
    case 2: return vscores16_2(qh, K, hd, pos, p, window, n, scale, sc);
    case 4: return vscores16_4(qh, K, hd, pos, p, window, n, scale, sc);
    case 8: return vscores16_8(qh, K, hd, pos, p, window, n, scale, sc);
    default: break;
    }
#endif
    return vscores(qh, K, hd, pos, p, window, n, scale, sc);
}

/* a query's softmax weights in place of its scores sc [n_scan, padded to whole vectors with -inf]; returns their
 * sum. The sum runs in AW lanes then one horizontal sum (a scalar running sum was a chain of one add per key); the
 * chunks past the query's last visible key add exact zeros, so a verify row's sum is the step's */
static float softmax_weights(float *sc, int64_t n_scan, float m) {
    int64_t npad = (n_scan + AW - 1) / AW * AW;
    av lv = AV_ZERO;
    for (int64_t j = 0; j < npad; j += AW) {
        av e = av_exp(AV_SUB(AV_LOAD(sc + j), AV_SET1(m)));
        AV_STORE(sc + j, e);
        lv = AV_ADD(lv, e);
    }
    return AV_HSUM(lv);
}

/* o, o2 [hd] += the weights e [n] times the values V [n, hd], even and odd keys (vsum): slices of up to 8 vectors */
static void weighted_values(const float *e, const float *V, int64_t hd, int64_t n, float *o, float *o2) {
    for (int64_t i = 0; i < hd;) {
        int64_t left = (hd - i) / AW;
        if (left >= 8) vsum_8(e, V + i, hd, n, o + i, o2 + i), i += 8 * AW;
        else if (left >= 4) vsum_4(e, V + i, hd, n, o + i, o2 + i), i += 4 * AW;
        else if (left >= 2) vsum_2(e, V + i, hd, n, o + i, o2 + i), i += 2 * AW;
        else vsum_1(e, V + i, hd, n, o + i, o2 + i), i += AW;
    }
}

/* KEY_TILE keys of K or V (16 KB at head size 64) stay in L1 while every query of the work item reads them: one pass
 * per query over the layer's whole cache had made a verify block's attention L2-bound (Qwen2.5 0.5B, 8 rows x 14
 * heads over 1200 keys: 410 us a layer, 6.9x one row) */
#define KEY_TILE 64

/* the nq queries qs[i] (their positions ps[i]) of one kv head (K, V [n_scan, hd]) -> os[i] [hd]; sc: nq score rows of
 * stride ld. Each query's arithmetic is the one-query loop's (a key's score, its weight, the key-order sums); only the
 * order in which queries and key tiles interleave differs */
static void attend_group(const float *const *qs, const int64_t *ps, int64_t nq, const float *K, const float *V,
                         int64_t hd, const int64_t *pos, int64_t window, int64_t n_scan, float scale, float *sc,
                         int64_t ld, float *const *os, float *odd) {
    float m[nq], l[nq];
    for (int64_t i = 0; i < nq; i++) m[i] = -INFINITY;
    for (int64_t j0 = 0; j0 < n_scan; j0 += KEY_TILE) {
        int64_t n = n_scan - j0 < KEY_TILE ? n_scan - j0 : KEY_TILE;
        for (int64_t i = 0; i < nq; i++) {
            float mt = tile_scores(qs[i], K + j0 * hd, hd, pos + j0, ps[i], window, n, scale, sc + i * ld + j0);
            if (mt > m[i]) m[i] = mt;
        }
    }
    for (int64_t i = 0; i < nq; i++) {
        l[i] = softmax_weights(sc + i * ld, n_scan, m[i]);
        memset(os[i], 0, sizeof(float) * (size_t)hd);
        memset(odd + i * hd, 0, sizeof(float) * (size_t)hd);
    }
    for (int64_t j0 = 0; j0 < n_scan; j0 += KEY_TILE) {
        int64_t n = n_scan - j0 < KEY_TILE ? n_scan - j0 : KEY_TILE;
        for (int64_t i = 0; i < nq; i++) weighted_values(sc + i * ld + j0, V + j0 * hd, hd, n, os[i], odd + i * hd);
    }
    for (int64_t i = 0; i < nq; i++) {
        float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;  /* l > 0: the query's own key is always visible */
        for (int64_t k = 0; k < hd; k++) os[i][k] = (os[i][k] + odd[i * hd + k]) * inv;
    }
}
#endif

#endif
