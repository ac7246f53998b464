/* q8_matmul: several rows of x (a verify block), rows-as-lanes.
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order. */
#ifndef BOLT_Q8_ROWS_H
#define BOLT_Q8_ROWS_H

#ifdef SIMD
/* Where the weights' scalars and 4-code groups live: one weight row's (DUP 1: r->q [K], r->dw [blocks], ...) or two
 * rows' interleaved (PAIR: r->q [K/4][2][4 codes], r->dw [blocks][2], ... as interleave_rows writes them), so that
 * WI / WF broadcast what lanes of both rows need in one load. */
static inline int32_t ld32(const void *p) { int32_t v; memcpy(&v, p, 4); return v; }
#ifdef PAIR
static inline int64_t ld64(const void *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline double ld64f(const void *p) { double v; memcpy(&v, p, 8); return v; }
typedef __m512i vi;
typedef __m512 vf;
#define VI_ZERO _mm512_setzero_si512()
#define VI_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define VI_ADD _mm512_add_epi32
#define VI_SUB _mm512_sub_epi32
#define VI_MUL _mm512_mullo_epi32
#define VI_SLL5(v) _mm512_slli_epi32(v, 5)
#define VI_DOT(a, u, x) _mm512_dpbusd_epi32(a, u, x)
#define VI_MADD(a, x, m) _mm512_dpwssd_epi32(a, x, m)
#define VF_ZERO _mm512_setzero_ps()
#define VF_LOAD _mm512_loadu_ps
#define VF_STORE _mm512_storeu_ps
#define VF_CVT _mm512_cvtepi32_ps
#define VF_ADD _mm512_add_ps
#define VF_MUL _mm512_mul_ps
#define WI(p) _mm512_set1_epi64(ld64(p))                    /* int32 scalars of rows A, B at p */
#define WF(p) _mm512_castpd_ps(_mm512_set1_pd(ld64f(p)))    /* float scalars of rows A, B at p */
#else
typedef __m256i vi;
typedef __m256 vf;
#define VI_ZERO _mm256_setzero_si256()
#define VI_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VI_ADD _mm256_add_epi32
#define VI_SUB _mm256_sub_epi32
#define VI_MUL _mm256_mullo_epi32
#define VI_SLL5(v) _mm256_slli_epi32(v, 5)
#define VI_DOT(a, x, q) dot_us(a, x, q)
#define VI_MADD(a, x, m) madd_acc(a, x, m)
#define VF_ZERO _mm256_setzero_ps()
#define VF_LOAD _mm256_loadu_ps
#define VF_STORE _mm256_storeu_ps
#define VF_CVT _mm256_cvtepi32_ps
#define VF_ADD _mm256_add_ps
#define VF_MUL _mm256_mul_ps
#define WI(p) _mm256_set1_epi32(ld32(p))
#define WF(p) _mm256_set1_ps(*(p))
#endif
#define GB (4 * DUP)  /* bytes of one 4-code group in r->q */
#ifdef PAIR
#define WI_ALL(v) _mm512_set1_epi32(v)
#else
#define WI_ALL(v) _mm256_set1_epi32(v)
#endif

/* sum over n4 groups of 4 unsigned codes at u of u . x, x's groups at xt (XLANES each), in two chains */
static inline vi dot_groups(const int8_t *u, const int32_t *xt, int n4) {
    vi a0 = VI_ZERO, a1 = VI_ZERO;
    for (int c = 0; c < n4; c += 2) {
        a0 = VI_DOT(a0, WI(u + GB * c), VI_LOAD(xt + c * XLANES));
        a1 = VI_DOT(a1, WI(u + GB * c + GB), VI_LOAD(xt + (c + 1) * XLANES));
    }
    return VI_ADD(a0, a1);
}

/* the 32 unsigned codes at u times x (signed) at xt, in two chains; AVX2's Q8_0 (sq): signed codes, |q| times x with
 * q's sign */
static inline vi dot_block_u(const int8_t *u, const int32_t *xt, int sq) {
#if SIGNED_Q8
    if (sq) {
        vi a0 = VI_ZERO, a1 = VI_ZERO;
        for (int c = 0; c < 8; c += 2) {
            a0 = dot_ss(a0, WI(u + GB * c), VI_LOAD(xt + c * XLANES));
            a1 = dot_ss(a1, WI(u + GB * c + GB), VI_LOAD(xt + (c + 1) * XLANES));
        }
        return VI_ADD(a0, a1);
    }
#else
    (void)sq;
#endif
    return dot_groups(u, xt, 8);
}

/* one 32-block b of the chunk: its products, lanes: rows (x rows, times weight rows A | B with PAIR) */
static inline __attribute__((always_inline)) vf legacy_lanes(const Row *r, int64_t K, const XQ *xq, int64_t c,
                                                             int64_t b, int off, int sq, int mins, const int32_t *xt,
                                                             const float *dt) {
    vi isum = dot_block_u(r->q + 32 * DUP * b, xt + 8 * b * XLANES, sq);
    vi sx = VI_LOAD(xq->s32t + (c * (K / 32) + b) * XLANES);
    if (off) isum = VI_SUB(isum, VI_MUL(sx, WI_ALL(off)));
    vf dx = VF_LOAD(dt + b * XLANES);
    vf pb = VF_MUL(VF_CVT(isum), VF_MUL(WF(r->dw + DUP * b), dx));
    return mins ? VF_ADD(pb, VF_MUL(VF_CVT(sx), VF_MUL(WF(r->mw + DUP * b), dx))) : pb;
}

/* one superblock b of the chunk: its product, lanes: rows */
static inline __attribute__((always_inline)) vf k_lanes(int t, const Row *r, int64_t K, const XQ *xq, int64_t c,
                                                        int64_t b, int mins, const int32_t *xt, const float *dt) {
    int sl = sub_len(t);
    vi isum = VI_ZERO, jsum = VI_ZERO;
    for (int s = 0; s < 256 / sl; s++) {
        int64_t e = 256 * b + sl * s;
        isum = VI_ADD(isum, VI_MUL(dot_groups(r->q + DUP * e, xt + (e / 4) * XLANES, sl / 4),
                                   WI(r->sc + DUP * (e / sl))));
    }
    if (t == Q6_K) {  /* - 32 sum_s sc_s sum(x)_s, the pairs of 16-sums times the pairs of scales */
        const int32_t *h = xq->h16t + (c * (K / 32) + 8 * b) * XLANES;
        vi cor = VI_ZERO;
        for (int i = 0; i < 8; i++) cor = VI_MADD(cor, VI_LOAD(h + i * XLANES), WI(r->scp + DUP * (8 * b + i)));
        isum = VI_SUB(isum, VI_SLL5(cor));
    }
    vf dx = VF_LOAD(dt + b * XLANES);
    vf pb = VF_MUL(VF_CVT(isum), VF_MUL(WF(r->dw + DUP * b), dx));
    if (!mins) return pb;
    const int32_t *h = xq->h32t + (c * (K / 64) + 4 * b) * XLANES;
    for (int i = 0; i < 4; i++) jsum = VI_MADD(jsum, VI_LOAD(h + i * XLANES), WI(r->mnp + DUP * (4 * b + i)));
    return VF_ADD(pb, VF_MUL(VF_CVT(VI_SUB(VI_ZERO, jsum)), VF_MUL(WF(r->mw + DUP * b), dx)));
}

static inline vf tree8v(const vf p[8]) {
    return VF_ADD(VF_ADD(VF_ADD(p[0], p[1]), VF_ADD(p[2], p[3])), VF_ADD(VF_ADD(p[4], p[5]), VF_ADD(p[6], p[7])));
}

/* out[XLANES] for the chunk's LANES rows (c: the chunk; PAIR: out[2l], out[2l + 1] = x row l times rows A, B); whole groups of 8 blocks unrolled, the last one padded with 0.
 * Inlined into rows_simd once per type, so that t is a constant: a sub-block's length and index are shifts, not an
 * idiv per sub-block (perf: the idiv and the loop around 4 dot instructions held a third of Q6_K's samples) */
static inline __attribute__((always_inline)) void rows_t(int t, const Row *r, int64_t K, const XQ *xq, int64_t c,
                                                         float *out) {
    int mins = has_min(t), sq = t == Q8_0 && SIGNED_Q8;
    int off = t == Q4_0 ? 8 : t == Q5_0 ? 16 : t == Q8_0 && !SIGNED_Q8 ? 128 : 0;
    int64_t nb = K / block_len(t), full = nb / 8 * 8;
    const int32_t *xt = xq->qt + c * (K / 4) * XLANES;
    const float *dt = xq->dt + c * xq->nbp * XLANES;
    vf acc = VF_ZERO, p[8];
    if (!is_k(t)) {
        for (int64_t g = 0; g < full; g += 8) {
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) p[i] = legacy_lanes(r, K, xq, c, g + i, off, sq, mins, xt, dt);
            acc = VF_ADD(acc, tree8v(p));
        }
        if (full < nb) {
            for (int i = 0; i < 8; i++)
                p[i] = full + i < nb ? legacy_lanes(r, K, xq, c, full + i, off, sq, mins, xt, dt) : VF_ZERO;
            acc = VF_ADD(acc, tree8v(p));
        }
    } else {
        for (int64_t g = 0; g < nb; g += 8) {
            for (int i = 0; i < 8; i++) p[i] = g + i < nb ? k_lanes(t, r, K, xq, c, g + i, mins, xt, dt) : VF_ZERO;
            acc = VF_ADD(acc, tree8v(p));
        }
    }
    VF_STORE(out, acc);
}

#ifdef PAIR
/* 32 codes of row a and of row b -> 64 bytes at q: per 4-code group a's 4 then b's 4 */
static inline void store_pair(int8_t *q, __m256i A, __m256i B) {
    __m256i lo = _mm256_unpacklo_epi32(A, B), hi = _mm256_unpackhi_epi32(A, B);  /* per 128-bit lane */
    _mm256_storeu_si256((__m256i *)q, _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256((__m256i *)(q + 32), _mm256_permute2x128_si256(lo, hi, 0x31));
}

/* Q4_0 / Q5_0 / Q8_0 rows at wa, wb unpacked straight into the interleaved form (no row buffers between) */
static void unpack_pair_legacy(int t, const uint8_t *wa, const uint8_t *wb, int64_t K, Row *p) {
    int bytes = t == Q4_0 ? 18 : t == Q5_0 ? 22 : 34;
    for (int64_t b = 0; b < K / 32; b++, wa += bytes, wb += bytes) {
        p->dw[2 * b] = f16c(wa);
        p->dw[2 * b + 1] = f16c(wb);
        store_pair(p->q + 64 * b, legacy_codes(t, wa), legacy_codes(t, wb));
    }
}

/* the scalars of blocks [b0, b1) of rows a, b -> p, a's then b's (only those the type's product reads) */
static void pair_scalars(int t, const Row *a, const Row *b, Row *p, int64_t b0, int64_t b1) {
#define PAIR_UP(f, n) for (int64_t i = (n) * b0; i < (n) * b1; i++) p->f[2 * i] = a->f[i], p->f[2 * i + 1] = b->f[i]
    PAIR_UP(dw, 1);
    if (has_min(t)) PAIR_UP(mw, 1);
    if (is_k(t)) PAIR_UP(sc, 256 / sub_len(t));
    if (t == Q4_K || t == Q5_K) PAIR_UP(mnp, 4);
    if (t == Q6_K) PAIR_UP(scp, 8);
#undef PAIR_UP
}

/* Q4_K / Q6_K rows at wa, wb unpacked into the interleaved form; their scalars pass through a, b */
static void unpack_pair_k(int t, const uint8_t *wa, const uint8_t *wb, int64_t K, Row *a, Row *b, Row *p) {
    int bytes = t == Q4_K ? 144 : 210;
    for (int64_t sb = 0; sb < K / 256; sb++, wa += bytes, wb += bytes) {
        __m256i A[8], B[8];
        k_superblock(t, wa, sb, a, A);
        k_superblock(t, wb, sb, b, B);
        for (int k = 0; k < 8; k++) store_pair(p->q + 512 * sb + 64 * k, A[k], B[k]);
    }
    pair_scalars(t, a, b, p, 0, K / 256);
}

/* two unpacked weight rows a, b -> p, interleaved as the PAIR lanes read them: per 4-code group a's 4 then b's 4 */
static void interleave_rows(int t, int64_t K, const Row *a, const Row *b, Row *p) {
    for (int64_t j = 0; j < K; j += 32)
        store_pair(p->q + 2 * j, _mm256_loadu_si256((const __m256i *)(a->q + j)),
                   _mm256_loadu_si256((const __m256i *)(b->q + j)));
    pair_scalars(t, a, b, p, 0, K / block_len(t));
}
#endif

static void rows_simd(int t, const Row *r, int64_t K, const XQ *xq, int64_t c, float *out) {
    switch (t) {
    case Q4_0: rows_t(Q4_0, r, K, xq, c, out); break;
    case Q5_0: rows_t(Q5_0, r, K, xq, c, out); break;
    case Q8_0: rows_t(Q8_0, r, K, xq, c, out); break;
    case Q4_K: rows_t(Q4_K, r, K, xq, c, out); break;
    case Q6_K: rows_t(Q6_K, r, K, xq, c, out); break;
    default: rows_t(t, r, K, xq, c, out); break;  /* Q4_1, Q5_1, Q5_K: unpacked by the scalar loop */
    }
}
#endif /* SIMD */

#endif
