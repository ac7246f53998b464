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

/* A tile of NU weight units (a unit: two weight rows interleaved with PAIR, one row without) against one chunk of
 * x's rows, block by block: each x group is loaded once per block and meets every unit in registers, so a vpdpbusd
 * costs ~1 load (the units' broadcast codes) instead of 2 (one unit at a time also reloaded x's group: the rows
 * product was bound by loads, ~25 multiply-adds a cycle of vpdpbusd's 64 on a Zen 5). Each lane's integers are exact
 * however they are summed, and its float side is the one order of q8_matmul.c, so the bits are unchanged. */
/* the 32-block's dot for one unit: codes at u, x's 8 groups in xg */
static inline __attribute__((always_inline)) vi block_dot(const int8_t *u, const vi xg[8]) {
    vi a = VI_ZERO, b = VI_ZERO;
    for (int k = 0; k < 8; k += 2) {
        a = VI_DOT(a, WI(u + GB * k), xg[k]);
        b = VI_DOT(b, WI(u + GB * k + GB), xg[k + 1]);
    }
    return VI_ADD(a, b);
}

/* n4 groups of 4 codes at u against x's groups in xg (n4: 4 or 8) */
static inline __attribute__((always_inline)) vi sub_dot(const int8_t *u, const vi *xg, int n4) {
    vi a = VI_ZERO, b = VI_ZERO;
    for (int k = 0; k < n4; k += 2) {
        a = VI_DOT(a, WI(u + GB * k), xg[k]);
        b = VI_DOT(b, WI(u + GB * k + GB), xg[k + 1]);
    }
    return VI_ADD(a, b);
}

/* 32-block b of the chunk for every unit: p[u] (lanes: rows, times weight rows A | B with PAIR) */
static inline __attribute__((always_inline)) void legacy_block(const Row *const *rr, int nu, int64_t K, const XQ *xq,
                                                              int64_t c, int64_t b, int mins, const int32_t *xt,
                                                              const float *dt, vf p[NU]) {
    vi xg[8];
    for (int k = 0; k < 8; k++) xg[k] = VI_LOAD(xt + (8 * b + k) * XLANES);
    vi sx = VI_LOAD(xq->s32t + (c * (K / 32) + b) * XLANES);
    vf dx = VF_LOAD(dt + b * XLANES);
    for (int u = 0; u < nu; u++) {
        vi isum = block_dot(rr[u]->q + 32 * DUP * b, xg);
        vf pb = VF_MUL(VF_CVT(isum), VF_MUL(WF(rr[u]->dw + DUP * b), dx));
        p[u] = mins ? VF_ADD(pb, VF_MUL(VF_CVT(sx), VF_MUL(WF(rr[u]->mw + DUP * b), dx))) : pb;
    }
}

/* superblock b of the chunk for every unit: p[u]. Sub-block by sub-block, x's groups loaded once for the units. */
static inline __attribute__((always_inline)) void k_block(int t, const Row *const *rr, int nu, int64_t K,
                                                         const XQ *xq, int64_t c, int64_t b, int mins,
                                                         const int32_t *xt, const float *dt, vf p[NU]) {
    int sl = sub_len(t);
    vi isum[NU];
    for (int u = 0; u < NU; u++) isum[u] = VI_ZERO;
    for (int s = 0; s < 256 / sl; s++) {
        int64_t e = 256 * b + sl * s;
        vi xg[8];
        for (int k = 0; k < sl / 4; k++) xg[k] = VI_LOAD(xt + (e / 4 + k) * XLANES);
        for (int u = 0; u < nu; u++)
            isum[u] = VI_ADD(isum[u], VI_MUL(sub_dot(rr[u]->q + DUP * e, xg, sl / 4), WI(rr[u]->sc + DUP * (e / sl))));
    }
    if (t == Q6_K) {  /* - 32 sum_s sc_s sum(x)_s, the pairs of 16-sums times the pairs of scales */
        const int32_t *h = xq->h16t + (c * (K / 32) + 8 * b) * XLANES;
        vi hv[8];
        for (int i = 0; i < 8; i++) hv[i] = VI_LOAD(h + i * XLANES);
        for (int u = 0; u < nu; u++) {
            vi cor = VI_ZERO;
            for (int i = 0; i < 8; i++) cor = VI_MADD(cor, hv[i], WI(rr[u]->scp + DUP * (8 * b + i)));
            isum[u] = VI_SUB(isum[u], VI_SLL5(cor));
        }
    }
    vf dx = VF_LOAD(dt + b * XLANES);
    vi hm[4];
    if (mins)
        for (int i = 0; i < 4; i++) hm[i] = VI_LOAD(xq->h32t + (c * (K / 64) + 4 * b + i) * XLANES);
    for (int u = 0; u < nu; u++) {
        vf pb = VF_MUL(VF_CVT(isum[u]), VF_MUL(WF(rr[u]->dw + DUP * b), dx));
        if (mins) {
            vi jsum = VI_ZERO;
            for (int i = 0; i < 4; i++) jsum = VI_MADD(jsum, hm[i], WI(rr[u]->mnp + DUP * (4 * b + i)));
            pb = VF_ADD(pb, VF_MUL(VF_CVT(VI_SUB(VI_ZERO, jsum)), VF_MUL(WF(rr[u]->mw + DUP * b), dx)));
        }
        p[u] = pb;
    }
}

/* The next tile's weight rows, fetched while this tile is multiplied: a block's share of each row per block, so the
 * requests spread over the product's arithmetic. All at once before it (or during the unpack) they queued on the
 * cache's miss buffers and stalled the unpack: the cold head at 8 rows took 25 % longer than with no tiles. */
typedef struct {
    const uint8_t *w;    /* the first row */
    int64_t rb, bb, n;   /* bytes per row, per block; rows */
} Ahead;

static inline void ahead_block(const Ahead *pf, int64_t b) {
    for (int64_t r = 0; r < pf->n; r++)  /* the lines block b's bytes start in (a line a block, or a few) */
        for (int64_t o = pf->bb * b & ~(int64_t)63; o < pf->bb * (b + 1); o += 64)
            __builtin_prefetch(pf->w + r * pf->rb + o);
}

static inline vf tree8v(const vf p[8]) {
    return VF_ADD(VF_ADD(VF_ADD(p[0], p[1]), VF_ADD(p[2], p[3])), VF_ADD(VF_ADD(p[4], p[5]), VF_ADD(p[6], p[7])));
}

/* out[u][XLANES] for the chunk's LANES rows and nu <= NU units (c: the chunk; PAIR: out[u][2l], out[u][2l + 1] = x
 * row l times the unit's rows A, B); groups of 8 blocks, the last one padded with 0, each unit's tree as one row's.
 * Inlined into rows_simd once per type, so that t is a constant: a sub-block's length and index are shifts, not an
 * idiv per sub-block (perf: the idiv and the loop around 4 dot instructions held a third of Q6_K's samples) */
static inline __attribute__((always_inline)) void rows_t(int t, const Row *const *rr, int nu, int64_t K, const XQ *xq,
                                                         int64_t c, const Ahead *pf, float *out) {
    int mins = has_min(t);  /* the types here keep unsigned codes and their min (unpack_scalar): no offset */
    int64_t nb = K / block_len(t);
    const int32_t *xt = xq->qt + c * (K / 4) * XLANES;
    const float *dt = xq->dt + c * xq->nbp * XLANES;
    vf acc[NU], p[NU][8], pb[NU];
    for (int u = 0; u < NU; u++) acc[u] = VF_ZERO;
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            if (pf && g + i < nb) ahead_block(pf, g + i);
            if (g + i >= nb)
                for (int u = 0; u < NU; u++) pb[u] = VF_ZERO;
            else if (is_k(t))
                k_block(t, rr, nu, K, xq, c, g + i, mins, xt, dt, pb);
            else
                legacy_block(rr, nu, K, xq, c, g + i, mins, xt, dt, pb);
            for (int u = 0; u < nu; u++) p[u][i] = pb[u];
        }
        for (int u = 0; u < nu; u++) acc[u] = VF_ADD(acc[u], tree8v(p[u]));
    }
    for (int u = 0; u < nu; u++) VF_STORE(out + u * XLANES, acc[u]);
}

#ifdef PAIR
/* 32 codes of row a and of row b -> 64 bytes at q: per 4-code group a's 4 then b's 4 */
static inline void store_pair(int8_t *q, __m256i A, __m256i B) {
    __m256i lo = _mm256_unpacklo_epi32(A, B), hi = _mm256_unpackhi_epi32(A, B);  /* per 128-bit lane */
    _mm256_storeu_si256((__m256i *)q, _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256((__m256i *)(q + 32), _mm256_permute2x128_si256(lo, hi, 0x31));
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

/* two unpacked weight rows a, b -> p, interleaved as the PAIR lanes read them: per 4-code group a's 4 then b's 4 */
static void interleave_rows(int t, int64_t K, const Row *a, const Row *b, Row *p) {
    for (int64_t j = 0; j < K; j += 32)
        store_pair(p->q + 2 * j, _mm256_loadu_si256((const __m256i *)(a->q + j)),
                   _mm256_loadu_si256((const __m256i *)(b->q + j)));
    pair_scalars(t, a, b, p, 0, K / block_len(t));
}
#endif

/* the types without a weight-rows-as-lanes product (Q4_1, Q5_1, Q5_K: unpacked by the scalar loop); the vectorized
 * types take q8_lanes.h for every M > 1 */
static void rows_simd(int t, const Row *const *rr, int64_t K, const XQ *xq, int64_t c, const Ahead *pf, float *out) {
    switch (t) {
    case Q4_1: rows_t(Q4_1, rr, NU, K, xq, c, pf, out); break;
    case Q5_1: rows_t(Q5_1, rr, NU, K, xq, c, pf, out); break;
    default: rows_t(Q5_K, rr, NU, K, xq, c, pf, out); break;
    }
}
#endif /* SIMD */

#endif
