/* attention_vec.h's multi-query part (attend_group): the queries of one kv head (a verify block's T rows x the
 * group's heads) together over tiles of its keys. One translation unit with attention_step.c; hashed with it by
 * kernels/cpu/native.py (every *.h of kernels/cpu).
 *
 * Why: a query at a time, a verify block's attention was 6x one row's (Qwen2.5 0.5B, 8 rows x 14 heads over 1200
 * keys, bench_hot: 320 us a layer against 53), bound by the horizontal sum of every score (45 shuffles and adds per
 * query and 16 keys) and by reloading a key's values for every query. Here one transposition of a key tile (AVX-512)
 * and one load of its values serve all the queries, and a key's score runs down the dimensions in its own lane (no
 * sum tree): ~200 us, ~42 at one row. Not ~2.5x: the block's FMAs alone (2 a cycle) take ~135 us.
 *
 * Every query's arithmetic is its own, whichever queries share a tile (a verify row equals the step at its
 * position, bit for bit; the step comes here too): a key's score the same two chains over the dimensions, the
 * weights the same exp, the value sums the same two chains in key order. */
#ifndef BOLT_ATTENTION_GROUP_H
#define BOLT_ATTENTION_GROUP_H

#define AI __attribute__((always_inline)) inline
#define UNROLL _Pragma("GCC unroll 16")

#if AW == 16
/* rows r[i] (key i's 16 dims) -> t[c] (dim c of the 16 keys): 4 rounds of 16 shuffles */
static AI void transpose16(const av r[16], av t[16]) {
    av a[16], b[16];
    UNROLL for (int i = 0; i < 16; i += 2)
        a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    UNROLL for (int i = 0; i < 4; i++)  /* b[4i + c], 128-bit block k: column 4k + c of rows 4i .. 4i + 3 */
        UNROLL for (int c = 0; c < 4; c++) {
            __m512d x = _mm512_castps_pd(a[4 * i + c / 2]), y = _mm512_castps_pd(a[4 * i + 2 + c / 2]);
            b[4 * i + c] = _mm512_castpd_ps(c % 2 ? _mm512_unpackhi_pd(x, y) : _mm512_unpacklo_pd(x, y));
        }
    UNROLL for (int c = 0; c < 4; c++) {
        av p = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x44), q = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xEE);
        av s = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x44), u = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xEE);
        t[c] = _mm512_shuffle_f32x4(p, s, 0x88), t[4 + c] = _mm512_shuffle_f32x4(p, s, 0xDD);
        t[8 + c] = _mm512_shuffle_f32x4(q, u, 0x88), t[12 + c] = _mm512_shuffle_f32x4(q, u, 0xDD);
    }
}

/* KT [NV*16, 16]: the n <= 16 keys K [n, hd] by dimension (zeros past n: nothing read past the cache) */
static AI void transpose_keys(int NV, const float *K, int64_t hd, int n, float *KT) {
    UNROLL for (int u = 0; u < NV; u++) {
        av r[16], t[16];
        UNROLL for (int i = 0; i < 16; i++) r[i] = i < n ? AV_LOAD(K + i * hd + u * AW) : AV_ZERO;
        transpose16(r, t);
        UNROLL for (int c = 0; c < 16; c++) AV_STORE(KT + (u * AW + c) * AW, t[c]);
    }
}

/* A key's score: keys are the lanes of KT's vectors (dimension d of 16 keys at KT + d * 16), and each query runs two
 * FMA chains down its dimensions, s0 over the even d and s1 over the odd (s = fma(q[d], k_d, s) from 0, d
 * ascending), score = s0 + s1. A step and a verify block both come here (AVX-512, head sizes of 1, 2, 4 or 8
 * vectors), so a verify row's scores are the step's. Before, a key's score was the one-query loop's dot (lanes over
 * d, then a sum tree across them): 31 adds beside every 64 FMAs of a query and 16 keys; this order has one. QG
 * queries share each load of KT: 2 QG chains in flight, enough for the FMA's latency (4 cycles, 2 a cycle). */
#define QG 8

/* the unscaled scores of the QG queries q[g] over KT's 16 keys (hd = NV * 16 dimensions) */
static AI void key_dots(int NV, const float *const *q, const float *KT, av out[QG]) {
    av s0[QG], s1[QG];
    UNROLL for (int g = 0; g < QG; g++) s0[g] = AV_ZERO, s1[g] = AV_ZERO;
    _Pragma("GCC unroll 4") for (int d = 0; d < NV * AW; d += 2) {
        av k0 = AV_LOAD(KT + d * AW), k1 = AV_LOAD(KT + (d + 1) * AW);
        UNROLL for (int g = 0; g < QG; g++) {
            s0[g] = AV_FMA(AV_SET1(q[g][d]), k0, s0[g]);
            s1[g] = AV_FMA(AV_SET1(q[g][d + 1]), k1, s1[g]);
        }
    }
    UNROLL for (int g = 0; g < QG; g++) out[g] = AV_ADD(s0[g], s1[g]);
}

/* the nq queries' scores (-inf where unseen) over n keys (K, pos from a multiple of 16) into sc (rows of stride ld,
 * from the tile's first key); mv [nq, 16]: each query's running maxima, -inf on entry */
static AI void group_scores(int NV, const float *const *qs, const int64_t *ps, int64_t nq, const float *K,
                            int64_t hd, const int64_t *pos, int64_t window, int64_t n, float scale, float *sc,
                            int64_t ld, float *mv) {
    float KT[8 * AW * AW] __attribute__((aligned(64)));
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        int nb = n - j0 < 16 ? (int)(n - j0) : 16;
        transpose_keys(NV, K + j0 * hd, hd, nb, KT);
        int64_t vis_p = -1;  /* no query's position: the mask below is computed once per row (its heads share it) */
        __mmask16 vis = 0;
        for (int64_t i0 = 0; i0 < nq; i0 += QG) {
            const float *q[QG];
            UNROLL for (int g = 0; g < QG; g++) {
                q[g] = qs[i0 + g < nq ? i0 + g : nq - 1];
                __asm__("" : "+r"(q[g]));  /* q's broadcasts hoisted out of the key loop would fill the stack */
            }
            av d[QG];
            key_dots(NV, q, KT, d);
            for (int g = 0; g < QG && i0 + g < nq; g++) {
                int64_t i = i0 + g;
                if (ps[i] != vis_p) vis = sees16(pos + j0, ps[i], window, nb), vis_p = ps[i];
                av r = _mm512_mask_blend_ps(vis, AV_SET1(-INFINITY), AV_MUL(d[g], AV_SET1(scale)));
                AV_STORE(mv + i * 16, AV_MAX(AV_LOAD(mv + i * 16), r));
                if (nb == 16) AV_STORE(sc + i * ld + j0, r);
                else _mm512_mask_storeu_ps(sc + i * ld + j0, (__mmask16)((1u << nb) - 1), r);
            }
        }
    }
}
#endif /* AW == 16 */

/* the registers' share of the value sums: QN queries x 2 chains x NV vectors + NV values (32 vector registers;
 * AVX2 has 16) */
#if AW == 16
#define VQ_NV 4
#else
#define VQ_NV 2
#endif
#define VQ_QN 3

/* o[g], o2[g] [NV*AW] += QN queries' weights e[g] [n] times the values V [n, NV*AW of stride hd]: o over the even
 * keys, o2 the odd ones, each in key order, skipping a zero weight (a key out of sight, an exp that underflowed) as
 * the one-query loop did. Two chains, as one FMA chain per vector waited on the FMA's latency at every key; a key's
 * values loaded once for the QN queries (a query at a time, 4 loads a key for 4 FMAs, was load-bound) */
static AI void vsum_q(int NV, int QN, const float *const *e, const float *V, int64_t hd, int64_t n, float *const *o,
                      float *const *o2) {
    av acc[VQ_QN][VQ_NV], acc2[VQ_QN][VQ_NV];  /* sized by constants: a VLA would live in memory */
    UNROLL for (int g = 0; g < QN; g++)
        UNROLL for (int u = 0; u < NV; u++) acc[g][u] = AV_LOAD(o[g] + u * AW), acc2[g][u] = AV_LOAD(o2[g] + u * AW);
    for (int64_t j = 0; j < n; j += 2) {
        av v[VQ_NV];
        UNROLL for (int u = 0; u < NV; u++) {
            v[u] = AV_LOAD(V + j * hd + u * AW);
            __asm__("" : "+v"(v[u]));  /* in a register: folded into each query's FMA it was loaded QN times */
        }
        UNROLL for (int g = 0; g < QN; g++)
            if (e[g][j] != 0.0f) {
                av ej = AV_SET1(e[g][j]);
                UNROLL for (int u = 0; u < NV; u++) acc[g][u] = AV_FMA(ej, v[u], acc[g][u]);
            }
        if (j + 1 == n) break;
        UNROLL for (int u = 0; u < NV; u++) {
            v[u] = AV_LOAD(V + (j + 1) * hd + u * AW);
            __asm__("" : "+v"(v[u]));
        }
        UNROLL for (int g = 0; g < QN; g++)
            if (e[g][j + 1] != 0.0f) {
                av ej = AV_SET1(e[g][j + 1]);
                UNROLL for (int u = 0; u < NV; u++) acc2[g][u] = AV_FMA(ej, v[u], acc2[g][u]);
            }
    }
    UNROLL for (int g = 0; g < QN; g++)
        UNROLL for (int u = 0; u < NV; u++) AV_STORE(o[g] + u * AW, acc[g][u]), AV_STORE(o2[g] + u * AW, acc2[g][u]);
}

/* vsum_q over the head in slices of up to VQ_NV vectors */
static AI void group_values(int QN, const float *const *e, const float *V, int64_t hd, int64_t n, float *const *o,
                            float *const *o2) {
    for (int64_t i = 0; i < hd;) {
        int64_t left = (hd - i) / AW;
        float *oi[VQ_QN], *o2i[VQ_QN];
        UNROLL for (int g = 0; g < QN; g++) oi[g] = o[g] + i, o2i[g] = o2[g] + i;
        if (left >= VQ_NV) vsum_q(VQ_NV, QN, e, V + i, hd, n, oi, o2i), i += VQ_NV * AW;
        else if (VQ_NV > 2 && left >= 2) vsum_q(2, QN, e, V + i, hd, n, oi, o2i), i += 2 * AW;
        else vsum_q(1, QN, e, V + i, hd, n, oi, o2i), i += AW;
    }
}

/* KEY_TILE keys of K or V (16 KB at head size 64) stay in L1 while every query of the work item reads them: one pass
 * per query over the layer's whole cache had made a verify block's attention L2-bound */
#define KEY_TILE 64

/* the nq queries qs[i] (their positions ps[i]) of one kv head (K, V [n_scan, hd]) -> os[i] [hd]; sc: nq score rows of
 * stride ld; odd [nq, hd]: the odd keys' sums; mv [nq, 16]: a tile's maxima, then the weights' lane sums. Each query's
 * arithmetic is the one-query loop's (a key's score, its weight, the key-order sums); only the order in which queries
 * and keys interleave differs. The exp of a tile runs just before its values (one pass over the scores, not two) */
static void attend_group(const float *const *qs, const int64_t *ps, int64_t nq, const float *K, const float *V,
                         int64_t hd, const int64_t *pos, int64_t window, int64_t n_scan, float scale, float *sc,
                         int64_t ld, float *const *os, float *odd, float *mv) {
    float m[nq], l[nq];
    for (int64_t i = 0; i < nq; i++) m[i] = -INFINITY;
    for (int64_t j0 = 0; j0 < n_scan; j0 += KEY_TILE) {
        int64_t n = n_scan - j0 < KEY_TILE ? n_scan - j0 : KEY_TILE;
        const float *Kt = K + j0 * hd;
#if AW == 16
        int nv = (int)(hd / AW);
        if (nv == 1 || nv == 2 || nv == 4 || nv == 8) {
            for (int64_t i = 0; i < nq * 16; i++) mv[i] = -INFINITY;
            const int64_t *pt = pos + j0;
            if (nv == 1) group_scores(1, qs, ps, nq, Kt, hd, pt, window, n, scale, sc + j0, ld, mv);
            else if (nv == 2) group_scores(2, qs, ps, nq, Kt, hd, pt, window, n, scale, sc + j0, ld, mv);
            else if (nv == 4) group_scores(4, qs, ps, nq, Kt, hd, pt, window, n, scale, sc + j0, ld, mv);
            else group_scores(8, qs, ps, nq, Kt, hd, pt, window, n, scale, sc + j0, ld, mv);
            for (int64_t i = 0; i < nq; i++) {  /* the tile's max, then the running one: the one-query loop's order */
                float mt = _mm512_reduce_max_ps(AV_LOAD(mv + i * 16));
                if (mt > m[i]) m[i] = mt;
            }
            continue;
        }
#endif
        for (int64_t i = 0; i < nq; i++) {
            float mt = vscores(qs[i], Kt, hd, pos + j0, ps[i], window, n, scale, sc + i * ld + j0);
            if (mt > m[i]) m[i] = mt;
        }
    }
    for (int64_t i = 0; i < nq; i++) {
        memset(os[i], 0, sizeof(float) * (size_t)hd);
        memset(odd + i * hd, 0, sizeof(float) * (size_t)hd);
        AV_STORE(mv + i * 16, AV_ZERO);  /* now the weights' lane sums */
    }
    for (int64_t j0 = 0; j0 < n_scan; j0 += KEY_TILE) {
        int64_t n = n_scan - j0 < KEY_TILE ? n_scan - j0 : KEY_TILE;
        for (int64_t i = 0; i < nq; i++) softmax_tile(sc + i * ld + j0, n, m[i], mv + i * 16);
        for (int64_t i0 = 0; i0 < nq; i0 += VQ_QN) {
            int qn = nq - i0 < VQ_QN ? (int)(nq - i0) : VQ_QN;
            const float *e[VQ_QN] = {0};
            float *o2[VQ_QN] = {0};
            for (int g = 0; g < qn; g++) e[g] = sc + (i0 + g) * ld + j0, o2[g] = odd + (i0 + g) * hd;
            if (qn == 3) group_values(3, e, V + j0 * hd, hd, n, os + i0, o2);
            else if (qn == 2) group_values(2, e, V + j0 * hd, hd, n, os + i0, o2);
            else group_values(1, e, V + j0 * hd, hd, n, os + i0, o2);
        }
    }
    for (int64_t i = 0; i < nq; i++) l[i] = AV_HSUM(AV_LOAD(mv + i * 16));
    for (int64_t i = 0; i < nq; i++) {
        float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;  /* l > 0: the query's own key is always visible */
        for (int64_t k = 0; k < hd; k++) os[i][k] = (os[i][k] + odd[i * hd + k]) * inv;
    }
}
#undef AI
#undef UNROLL

#endif
