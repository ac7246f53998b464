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

/* A tile of NU weight units (a unit: two weight rows interleaved with PAIR, one row without) against one chunk of
 * x's rows, block by block: each x group is loaded once per block and meets every unit in registers, so a vpdpbusd
 * costs ~1 load (the units' broadcast codes) instead of 2 (one unit at a time also reloaded x's group: the rows
 * product was bound by loads, ~25 multiply-adds a cycle of vpdpbusd's 64 on a Zen 5). Each lane's integers are exact
 * however they are summed, and its float side is the one order of q8_matmul.c, so the bits are unchanged. */
/* the 32-block's dot for one unit: codes at u, x's 8 groups in xg, from a (x's offset term); AVX2's Q8_0 (sq):
 * signed codes, |q| times x with q's sign */
static inline __attribute__((always_inline)) vi block_dot(const int8_t *u, const vi xg[8], vi a, int sq) {
    vi b = VI_ZERO;
#if SIGNED_Q8
    if (sq) {
        for (int k = 0; k < 8; k += 2) {
            a = dot_ss(a, WI(u + GB * k), xg[k]);
            b = dot_ss(b, WI(u + GB * k + GB), xg[k + 1]);
        }
        return VI_ADD(a, b);
    }
#else
    (void)sq;
#endif
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
                                                              int64_t c, int64_t b, int off, int sq, int mins,
                                                              const int32_t *xt, const float *dt, vf p[NU]) {
    vi xg[8];
    for (int k = 0; k < 8; k++) xg[k] = VI_LOAD(xt + (8 * b + k) * XLANES);
    vi sx = VI_LOAD(xq->s32t + (c * (K / 32) + b) * XLANES);
    vi base = off ? VI_SUB(VI_ZERO, VI_MUL(sx, WI_ALL(off))) : VI_ZERO;  /* - off * sum(x), once for all units */
    vf dx = VF_LOAD(dt + b * XLANES);
    for (int u = 0; u < nu; u++) {
        vi isum = block_dot(rr[u]->q + 32 * DUP * b, xg, base, sq);
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
    int mins = has_min(t), sq = t == Q8_0 && SIGNED_Q8;
    int off = t == Q4_0 ? 8 : t == Q5_0 ? 16 : t == Q8_0 && !SIGNED_Q8 ? 128 : 0;
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
                legacy_block(rr, nu, K, xq, c, g + i, off, sq, mins, xt, dt, pb);
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

/* A's and B's 32 codes side by side in a zmm, dwords [A's 8 groups | B's 8 groups] (or, for the nibble types,
 * [A 0..15 | B 0..15 | A 16..31 | B 16..31]: the halves as the bytes hold them), into the interleaved pair form: per
 * 4-code group A's 4 then B's 4, one vpermd and one store (two unpacks, two lane permutes and two stores before; the
 * pair's unpacking was ~40 % of a Q5_0 verify product) */
static inline void store_pair_z(int8_t *q, __m512i ab, int halves) {
    const __m512i by_rows = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    const __m512i by_halves = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    _mm512_storeu_si512((void *)q, _mm512_permutexvar_epi32(halves ? by_halves : by_rows, ab));
}

/* Q4_0 / Q5_0 / Q8_0 rows at wa, wb unpacked straight into the interleaved form (no row buffers between) */
static inline __attribute__((always_inline)) void pair_legacy_t(int t, const uint8_t *wa, const uint8_t *wb,
                                                                 int64_t K, Row *p) {
    int bytes = t == Q4_0 ? 18 : t == Q5_0 ? 22 : 34;
    const __m256i low = _mm256_set1_epi8(0x0F);
    uint16_t *h = p->dh;  /* the scales' fp16 bits, converted 16 at a time after the loop */
    for (int64_t b = 0; b < K / 32; b++, wa += bytes, wb += bytes) {
        memcpy(h + 2 * b, wa, 2);
        memcpy(h + 2 * b + 1, wb, 2);
        if (t == Q8_0) {
            __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(wa + 2))),
                                            _mm256_loadu_si256((const __m256i *)(wb + 2)), 1);
            store_pair_z(p->q + 64 * b, _mm512_xor_si512(ab, _mm512_set1_epi8((char)0x80)), 0);
            continue;
        }
        int o = t == Q4_0 ? 2 : 6;
        __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(wa + o))),
                                            _mm_loadu_si128((const __m128i *)(wb + o)), 1);  /* [A 16 | B 16] */
        __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, low)),
                                        _mm256_and_si256(_mm256_srli_epi16(v, 4), low), 1);
        if (t == Q5_0) {  /* fifth bits in the same order: A 0..15, B 0..15, A 16..31, B 16..31 */
            uint32_t ha, hb;
            memcpy(&ha, wa + 2, 4);
            memcpy(&hb, wb + 2, 4);
            uint64_t m = (uint64_t)(ha & 0xFFFF) | (uint64_t)(hb & 0xFFFF) << 16 | (uint64_t)(ha >> 16) << 32
                       | (uint64_t)(hb >> 16) << 48;
            ab = _mm512_or_si512(ab, _mm512_maskz_mov_epi8((__mmask64)m, _mm512_set1_epi8(0x10)));
        }
        store_pair_z(p->q + 64 * b, ab, 1);
    }
    for (int64_t i = 0; i < 2 * (K / 32); i += 16)  /* dh and dw hold whole 16s */
        _mm512_storeu_ps(p->dw + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
}

static void unpack_pair_legacy(int t, const uint8_t *wa, const uint8_t *wb, int64_t K, Row *p) {
    switch (t) {  /* t a constant in each: no type tests in the loop */
    case Q4_0: pair_legacy_t(Q4_0, wa, wb, K, p); break;
    case Q5_0: pair_legacy_t(Q5_0, wa, wb, K, p); break;
    default: pair_legacy_t(Q8_0, wa, wb, K, p); break;
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

/* two rows' 32 bytes at a, b as one zmm [a | b] */
static inline __m512i ld_ab(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* int32 lanes of A and of B (8 each, or 16 with hi) interleaved, A's lane i then B's: the pair form of a scalar */
static inline __m512i inter32(__m512i a, __m512i b, int hi) {
    const __m512i lo_idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi_idx = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    return _mm512_permutex2var_epi32(a, hi ? hi_idx : lo_idx, b);
}

/* Q4_K's 12 scale bytes at q: the 8 scales and the 8 mins k_scale_min gives, a byte each, 4 at a time */
static inline void q4k_scale_bytes(const uint8_t *q, uint64_t *sc, uint64_t *mn) {
    uint32_t u0, u1, u2;
    memcpy(&u0, q, 4);
    memcpy(&u1, q + 4, 4);
    memcpy(&u2, q + 8, 4);
    *sc = (uint64_t)(u0 & 0x3F3F3F3F) | (uint64_t)((u2 & 0x0F0F0F0F) | ((u0 >> 6) & 0x03030303) << 4) << 32;
    *mn = (uint64_t)(u1 & 0x3F3F3F3F) | (uint64_t)(((u2 >> 4) & 0x0F0F0F0F) | ((u1 >> 6) & 0x03030303) << 4) << 32;
}

/* Q4_K / Q6_K rows at wa, wb straight into the interleaved form, both rows in each zmm (codes, scales, the pairs
 * of int16 scales and mins): the scalar scale decode and the pair copies were ~40 % of a Q4_K verify product */
static inline __attribute__((always_inline)) void pair_k_t(int t, const uint8_t *wa, const uint8_t *wb, int64_t K,
                                                          Row *p) {
    const int bytes = t == Q4_K ? 144 : 210;
    const __m512i low = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(3);
    for (int64_t sb = 0; sb < K / 256; sb++, wa += bytes, wb += bytes) {
        int8_t *q = p->q + 512 * sb;
        if (t == Q4_K) {
            p->dw[2 * sb] = f16c(wa);
            p->dw[2 * sb + 1] = f16c(wb);
            p->mw[2 * sb] = f16c(wa + 2);
            p->mw[2 * sb + 1] = f16c(wb + 2);
            for (int g = 0; g < 4; g++) {  /* 32 bytes: elements 64g + 0..31 (low nibbles), 64g + 32..63 (high) */
                __m512i v = ld_ab(wa + 16 + 32 * g, wb + 16 + 32 * g);
                store_pair_z(q + 128 * g, _mm512_and_si512(v, low), 0);
                store_pair_z(q + 128 * g + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low), 0);
            }
            uint64_t sa, ma, sbb, mb;
            q4k_scale_bytes(wa + 4, &sa, &ma);
            q4k_scale_bytes(wb + 4, &sbb, &mb);
            __m512i scA = _mm512_castsi256_si512(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sa)));
            __m512i scB = _mm512_castsi256_si512(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sbb)));
            _mm512_storeu_si512((void *)(p->sc + 16 * sb), inter32(scA, scB, 0));
            __m128i mA = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)ma));  /* 4 pairs of int16 mins */
            __m128i mB = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mb));
            _mm_storeu_si128((__m128i *)(p->mnp + 8 * sb), _mm_unpacklo_epi32(mA, mB));
            _mm_storeu_si128((__m128i *)(p->mnp + 8 * sb + 4), _mm_unpackhi_epi32(mA, mB));
            continue;
        }
        p->dw[2 * sb] = f16c(wa + 208);
        p->dw[2 * sb + 1] = f16c(wb + 208);
        for (int half = 0; half < 2; half++) {  /* q6_k_codes on both rows at once */
            const uint8_t *qa = wa + 64 * half, *qb = wb + 64 * half;
            __m512i l0 = ld_ab(qa, qb), l1 = ld_ab(qa + 32, qb + 32);
            __m512i h = ld_ab(wa + 128 + 32 * half, wb + 128 + 32 * half);
            __m512i lo4[4] = {_mm512_and_si512(l0, low), _mm512_and_si512(l1, low),
                              _mm512_and_si512(_mm512_srli_epi16(l0, 4), low),
                              _mm512_and_si512(_mm512_srli_epi16(l1, 4), low)};
            for (int k = 0; k < 4; k++) {
                __m512i hk = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 2 * k), two), 4);
                store_pair_z(q + 256 * half + 64 * k, _mm512_or_si512(lo4[k], hk), 0);
            }
        }
        __m128i sa = _mm_loadu_si128((const __m128i *)(wa + 192)), sbv = _mm_loadu_si128((const __m128i *)(wb + 192));
        __m512i scA = _mm512_cvtepi8_epi32(sa), scB = _mm512_cvtepi8_epi32(sbv);
        _mm512_storeu_si512((void *)(p->sc + 32 * sb), inter32(scA, scB, 0));
        _mm512_storeu_si512((void *)(p->sc + 32 * sb + 16), inter32(scA, scB, 1));
        __m512i pA = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sa));  /* 8 pairs of int16 scales */
        __m512i pB = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sbv));
        _mm512_storeu_si512((void *)(p->scp + 16 * sb), inter32(pA, pB, 0));
    }
}

static void unpack_pair_k(int t, const uint8_t *wa, const uint8_t *wb, int64_t K, Row *p) {
    if (t == Q4_K) pair_k_t(Q4_K, wa, wb, K, p);
    else pair_k_t(Q6_K, wa, wb, K, p);
}

/* two unpacked weight rows a, b -> p, interleaved as the PAIR lanes read them: per 4-code group a's 4 then b's 4 */
static void interleave_rows(int t, int64_t K, const Row *a, const Row *b, Row *p) {
    for (int64_t j = 0; j < K; j += 32)
        store_pair(p->q + 2 * j, _mm256_loadu_si256((const __m256i *)(a->q + j)),
                   _mm256_loadu_si256((const __m256i *)(b->q + j)));
    pair_scalars(t, a, b, p, 0, K / block_len(t));
}
#endif

static void rows_simd(int t, const Row *const *rr, int64_t K, const XQ *xq, int64_t c, const Ahead *pf, float *out) {
    switch (t) {
    case Q4_0: rows_t(Q4_0, rr, NU, K, xq, c, pf, out); break;
    case Q5_0: rows_t(Q5_0, rr, NU, K, xq, c, pf, out); break;
    case Q8_0: rows_t(Q8_0, rr, NU, K, xq, c, pf, out); break;
    case Q4_K: rows_t(Q4_K, rr, NU, K, xq, c, pf, out); break;
    case Q6_K: rows_t(Q6_K, rr, NU, K, xq, c, pf, out); break;
    default: rows_t(t, rr, NU, K, xq, c, pf, out); break;  /* Q4_1, Q5_1, Q5_K: unpacked by the scalar loop */
    }
}
#endif /* SIMD */

#endif
