/* q8_matmul: several rows of x (a verify block), rows-as-lanes.
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order. */
#ifndef BOLT_Q8_ROWS_H
#define BOLT_Q8_ROWS_H

#ifdef SIMD
typedef __m256i vi;
typedef __m256 vf;
#define VI_ZERO _mm256_setzero_si256()
#define VI_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VI_SET1(v) _mm256_set1_epi32(v)
#define VI_ADD _mm256_add_epi32
#define VI_SUB _mm256_sub_epi32
#define VI_MUL _mm256_mullo_epi32
#define VI_DOT(a, x, q) dot_us(a, x, q)
#define VI_MADD(a, x, m) madd_acc(a, x, m)
#define VF_ZERO _mm256_setzero_ps()
#define VF_LOAD _mm256_loadu_ps
#define VF_STORE _mm256_storeu_ps
#define VF_SET1 _mm256_set1_ps
#define VF_CVT _mm256_cvtepi32_ps
#define VF_ADD _mm256_add_ps
#define VF_MUL _mm256_mul_ps

/* sum over n4 groups of 4 unsigned codes at u of u . x, x's groups at xt (LANES rows each), in two chains */
static inline vi dot_groups(const int8_t *u, const int32_t *xt, int n4) {
    vi a0 = VI_ZERO, a1 = VI_ZERO;
    for (int c = 0; c < n4; c += 2) {
        a0 = VI_DOT(a0, VI_SET1(*(const int32_t *)(u + 4 * c)), VI_LOAD(xt + c * LANES));
        a1 = VI_DOT(a1, VI_SET1(*(const int32_t *)(u + 4 * c + 4)), VI_LOAD(xt + (c + 1) * LANES));
    }
    return VI_ADD(a0, a1);
}

/* the 32 unsigned codes at u times x (signed) at xt, in two chains; AVX2's Q8_0 (sq): signed codes, |q| times x with
 * q's sign */
static inline vi dot_block_u(const int8_t *u, const int32_t *xt, int sq) {
    vi a0 = VI_ZERO, a1 = VI_ZERO;
#if SIGNED_Q8
    if (sq) {
        for (int c = 0; c < 8; c += 2) {
            a0 = dot_ss(a0, _mm256_set1_epi32(*(const int32_t *)(u + 4 * c)), VI_LOAD(xt + c * LANES));
            a1 = dot_ss(a1, _mm256_set1_epi32(*(const int32_t *)(u + 4 * c + 4)), VI_LOAD(xt + (c + 1) * LANES));
        }
        return VI_ADD(a0, a1);
    }
#else
    (void)sq;
#endif
    for (int c = 0; c < 8; c += 2) {
        a0 = VI_DOT(a0, VI_SET1(*(const int32_t *)(u + 4 * c)), VI_LOAD(xt + c * LANES));
        a1 = VI_DOT(a1, VI_SET1(*(const int32_t *)(u + 4 * c + 4)), VI_LOAD(xt + (c + 1) * LANES));
    }
    return VI_ADD(a0, a1);
}

/* one 32-block b of the chunk: its products, lanes: rows */
static inline __attribute__((always_inline)) vf legacy_lanes(int t, const Row *r, int64_t K, const XQ *xq, int64_t c,
                                                             int64_t b, int off, int sq, int mins, const int32_t *xt,
                                                             const float *dt) {
    vi isum = dot_block_u(r->q + 32 * b, xt + 8 * b * LANES, sq);
    vi sx = VI_LOAD(xq->s32t + (c * (K / 32) + b) * LANES);
    if (off) isum = VI_SUB(isum, VI_MUL(sx, VI_SET1(off)));
    vf dx = VF_LOAD(dt + b * LANES);
    vf pb = VF_MUL(VF_CVT(isum), VF_MUL(VF_SET1(r->dw[b]), dx));
    (void)t;
    return mins ? VF_ADD(pb, VF_MUL(VF_CVT(sx), VF_MUL(VF_SET1(r->mw[b]), dx))) : pb;
}

/* one superblock b of the chunk: its product, lanes: rows */
static inline vf k_lanes(int t, const Row *r, int64_t K, const XQ *xq, int64_t c, int64_t b, int mins,
                         const int32_t *xt, const float *dt) {
    int sl = sub_len(t);
    vi isum = VI_ZERO, jsum = VI_ZERO;
    for (int s = 0; s < 256 / sl; s++) {
        int64_t e = 256 * b + sl * s;
        isum = VI_ADD(isum, VI_MUL(dot_groups(r->q + e, xt + (e / 4) * LANES, sl / 4), VI_SET1(r->sc[e / sl])));
    }
    if (t == Q6_K) {  /* - 32 sum_s sc_s sum(x)_s, the pairs of 16-sums times the pairs of scales */
        const int32_t *h = xq->h16t + (c * (K / 32) + 8 * b) * LANES;
        vi cor = VI_ZERO;
        for (int i = 0; i < 8; i++) cor = VI_MADD(cor, VI_LOAD(h + i * LANES), VI_SET1(r->scp[8 * b + i]));
        isum = VI_SUB(isum, _mm256_slli_epi32(cor, 5));
    }
    vf dx = VF_LOAD(dt + b * LANES);
    vf pb = VF_MUL(VF_CVT(isum), VF_MUL(VF_SET1(r->dw[b]), dx));
    if (!mins) return pb;
    const int32_t *h = xq->h32t + (c * (K / 64) + 4 * b) * LANES;
    for (int i = 0; i < 4; i++) jsum = VI_MADD(jsum, VI_LOAD(h + i * LANES), VI_SET1(r->mnp[4 * b + i]));
    return VF_ADD(pb, VF_MUL(VF_CVT(VI_SUB(VI_ZERO, jsum)), VF_MUL(VF_SET1(r->mw[b]), dx)));
}

static inline vf tree8v(const vf p[8]) {
    return VF_ADD(VF_ADD(VF_ADD(p[0], p[1]), VF_ADD(p[2], p[3])), VF_ADD(VF_ADD(p[4], p[5]), VF_ADD(p[6], p[7])));
}

/* out[l] for the chunk's LANES rows (c: the chunk); whole groups of 8 blocks unrolled, the last one padded with 0 */
static void rows_simd(int t, const Row *r, int64_t K, const XQ *xq, int64_t c, float *out) {
    int mins = has_min(t), sq = t == Q8_0 && SIGNED_Q8;
    int off = t == Q4_0 ? 8 : t == Q5_0 ? 16 : t == Q8_0 && !SIGNED_Q8 ? 128 : 0;
    int64_t nb = K / block_len(t), full = nb / 8 * 8;
    const int32_t *xt = xq->qt + c * (K / 4) * LANES;
    const float *dt = xq->dt + c * xq->nbp * LANES;
    vf acc = VF_ZERO, p[8];
    if (!is_k(t)) {
        for (int64_t g = 0; g < full; g += 8) {
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) p[i] = legacy_lanes(t, r, K, xq, c, g + i, off, sq, mins, xt, dt);
            acc = VF_ADD(acc, tree8v(p));
        }
        if (full < nb) {
            for (int i = 0; i < 8; i++)
                p[i] = full + i < nb ? legacy_lanes(t, r, K, xq, c, full + i, off, sq, mins, xt, dt) : VF_ZERO;
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
#endif /* SIMD */

#endif
