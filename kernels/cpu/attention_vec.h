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

/* the scores of a head size that is whole vectors, a query at a time (AVX2; AVX-512 beyond 8 vectors): q in
 * registers up to 8 vectors, else vdot */
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
#endif

/* a query's softmax weights in place of its scores sc over a tile of n keys (from a multiple of KEY_TILE; padded to
 * whole vectors with -inf), their sum added to its AW lanes lv. The sum runs in lanes across the tiles, then one
 * horizontal sum (a scalar running sum was a chain of one add per key); the vectors past the query's last visible key
 * add exact zeros, so a verify row's sum is the step's */
static inline void softmax_tile(float *sc, int64_t n, float m, float *lv) {
    av l = AV_LOAD(lv);
    for (int64_t j = 0; j < n; j += AW) {
        av e = av_exp(AV_SUB(AV_LOAD(sc + j), AV_SET1(m)));
        AV_STORE(sc + j, e);
        l = AV_ADD(l, e);
    }
    AV_STORE(lv, l);
}

#include "attention_group.h"  /* attend_group: the queries of a kv head together */
#endif

#endif
