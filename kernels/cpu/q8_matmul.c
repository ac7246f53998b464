/* y = x @ W^T for a GGUF weight W [N, K] read in its own blocks and M <= 64 rows of x, with x quantized to int8 the
 * way llama.cpp (our numerical reference) does it: Q8_0 for the 32-blocks (Q4_0 .. Q8_0: one fp32 scale amax/127 per
 * 32), Q8_K for the K-quants (one scale per 256, sums per 16 and 32). Products are integer: vpmaddubsw + vpmaddwd on
 * AVX2, vpdpbusd with AVX-VNNI or AVX-512 VNNI. A K-quant superblock's sub-block scales multiply integer sums, so one
 * float conversion serves 256 weights.
 *
 * This file is compiled once per instruction-set level (native.py: LEVEL = portable, avx2, avxvnni, avx512vnni, each
 * with its own -m flags) and exports bolt_q8_parts_<LEVEL>; Python picks the level by the CPU's flags, or a lower one
 * by BOLT_CPU_LEVEL, so one machine can test every level it can run.
 *
 * One float order everywhere. Per block (superblock for K-quants) the integer isum = sum(q x) (q: the weight's signed
 * code after its offset; K-quants: sum over sub-blocks of sc * sum(q x)) and, for types with a min, jsum (sum(x), or
 * -sum(mn * sum(x)) for K-quants) are exact, however they are computed; the float side is fixed per row of x:
 * p = (float)isum * (d_w * d_x) [+ (float)jsum * (m_w * d_x)], then per group of 8 blocks
 * ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)) added to the row's sum. So a verify block's rows are the 1-row results bit for
 * bit (greedy DFlash == plain decoding), and every level equals the portable loop bit for bit (test_native_matmul.py).
 * -ffp-contract=off keeps the compiler from fusing.
 *
 * Two layouts, one per kind of call:
 * - One row of x (decode) runs along K, reading the weight bytes straight into registers: unsigned codes (u) times
 *   signed x, 32 per instruction; an offset (Q5_0: u - 16) comes off through x's block sums, which are computed once
 *   per call; 8 blocks' lane sums are reduced together.
 * - Several rows (DFlash verify) run rows-as-lanes: each weight row is unpacked once, and x is laid out [K/4][rows]
 *   in 4-byte groups, so one broadcast 4-byte group of codes meets 8 rows (a ymm) in one instruction and each row's
 *   block sum lands in its own lane, with no horizontal adds. The 32-blocks keep unsigned codes and take the offset
 *   off through x's sums per 32 (one vector op per block); for the K-quants, through x's sums per 16 (Q6_K) and per
 *   32 (the mins) in pairs of int16, one vpmaddwd per pair of sub-blocks. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_blocks.h"

#ifndef LEVEL
#define LEVEL portable
#endif
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)

#define MAX_M 64

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SIMD 1
#include <immintrin.h>
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)) || defined(__AVXVNNI__)
#define VNNI 1
#endif
#endif
/* rows per rows-as-lanes chunk: one ymm of int32. A zmm of 16 was slower for 8 rows on a Zen 5 EPYC (Q5_0 4864x896,
 * 1 thread: 0.70 vs 0.55 ms), and 8 is the usual verify block; 16 rows are two chunks over one unpacked row. */
#define LANES 8

static int is_k(int t) { return t == Q4_K || t == Q5_K || t == Q6_K; }
static int has_min(int t) { return t == Q4_1 || t == Q5_1 || t == Q4_K || t == Q5_K; }
static int sub_len(int t) { return t == Q6_K ? 16 : 32; }  /* K-quants: weights per integer sub-block scale */
static int block_len(int t) { return is_k(t) ? 256 : 32; }

/* ---- x -> int8 -------------------------------------------------------------------------------------------- */

/* x [n] in blocks of bs: d = amax / 127, q = nearest(x / d) in -127..127 */
static void quantize_row(const float *x, int64_t n, int bs, int8_t *q, float *d) {
    for (int64_t b = 0; b < n / bs; b++) {
        const float *xb = x + b * bs;
        float amax = 0.0f;
        for (int j = 0; j < bs; j++) {  /* not fmaxf: a libm call per element, 2 % of a verify product */
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        for (int j = 0; j < bs; j++) {
            float v = nearbyintf(xb[j] * id);
            q[b * bs + j] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
    }
}

/* One quantized x (blocks of bs = 32 or 256). Per row: q [M][K], d [M][nbp] (nbp: blocks rounded up to 8, padding
 * zero), sums of q per 32 s32 [M][n32p] (int32, padded like d) and as int16 h32 [M][K/32], per 16 h16 [M][K/16].
 * Several rows also rows-as-lanes, padded rows zero: qt [chunks][K/4][LANES] (4 bytes per int32), dt
 * [chunks][nbp][LANES], s32t [chunks][K/32][LANES], and h32t [chunks][K/64][LANES] (two int16 sums per int32).
 * h16t [chunks][K/32][LANES] holds the sums per 16 the same way. */
typedef struct {
    int64_t nbp, n32p;
    int8_t *q, *qp;
    float *d;
    int32_t *s32;
    int16_t *h32, *h16;
    int32_t *qt, *s32t, *h32t, *h16t;
    float *dt;
} XQ;

static int xq_make(XQ *o, const float *x, int64_t M, int64_t K, int bs) {
    memset(o, 0, sizeof *o);
    o->nbp = (K / bs + 7) / 8 * 8;
    o->n32p = (K / 32 + 7) / 8 * 8;
    int64_t ch = (M + LANES - 1) / LANES;
    o->q = malloc((size_t)(M * K));
    o->d = calloc((size_t)(M * o->nbp), sizeof(float));
    o->s32 = calloc((size_t)(M * o->n32p), sizeof(int32_t));
    o->h32 = malloc(sizeof(int16_t) * (size_t)(M * (K / 32)));
    o->h16 = malloc(sizeof(int16_t) * (size_t)(M * (K / 16)));
    if (M > 1) {
        o->qt = calloc((size_t)(ch * (K / 4) * LANES), sizeof(int32_t));
        o->dt = calloc((size_t)(ch * o->nbp * LANES), sizeof(float));
        o->s32t = calloc((size_t)(ch * (K / 32) * LANES), sizeof(int32_t));
        o->h32t = calloc((size_t)(ch * (K / 64 + 1) * LANES), sizeof(int32_t));
        o->h16t = calloc((size_t)(ch * (K / 32) * LANES), sizeof(int32_t));
    }
    if (M == 1 && bs == 32) o->qp = calloc((size_t)((K / 32 + 1) / 2 * 64), 1);
    if (!o->q || !o->d || !o->s32 || !o->h32 || !o->h16 || (M > 1 && (!o->qt || !o->dt || !o->s32t || !o->h32t || !o->h16t))
        || (M == 1 && bs == 32 && !o->qp))
        return -1;
    for (int64_t m = 0; m < M; m++) {
        int8_t *q = o->q + m * K;
        quantize_row(x + m * K, K, bs, q, o->d + m * o->nbp);
        for (int64_t i = 0; i < K / 16; i++) {
            int32_t t = 0;
            for (int j = 0; j < 16; j++) t += q[16 * i + j];
            o->h16[m * (K / 16) + i] = (int16_t)t;  /* |t| <= 16 * 127 */
        }
        for (int64_t i = 0; i < K / 32; i++) {
            int32_t t = o->h16[m * (K / 16) + 2 * i] + o->h16[m * (K / 16) + 2 * i + 1];
            o->s32[m * o->n32p + i] = t;
            o->h32[m * (K / 32) + i] = (int16_t)t;
        }
    }
    if (o->qp)  /* pairs of blocks b, b + 1: [b 0..15 | b+1 0..15][b 16..31 | b+1 16..31], as two nibble halves meet them */
        for (int64_t b = 0; b < K / 32; b++)
            for (int j = 0; j < 32; j++)
                o->qp[64 * (b / 2) + 32 * (j / 16) + 16 * (b % 2) + j % 16] = o->q[32 * b + j];
    if (M > 1)
        for (int64_t m = 0; m < M; m++) {
            int64_t c = m / LANES, l = m % LANES;
            for (int64_t k4 = 0; k4 < K / 4; k4++) {
                uint32_t v;
                memcpy(&v, o->q + m * K + 4 * k4, 4);
                o->qt[(c * (K / 4) + k4) * LANES + l] = (int32_t)v;
            }
            for (int64_t b = 0; b < K / bs; b++) o->dt[(c * o->nbp + b) * LANES + l] = o->d[m * o->nbp + b];
            for (int64_t i = 0; i < K / 32; i++) o->s32t[(c * (K / 32) + i) * LANES + l] = o->s32[m * o->n32p + i];
            for (int64_t i = 0; i < K / 64; i++) {
                uint32_t lo = (uint16_t)o->h32[m * (K / 32) + 2 * i], hi = (uint16_t)o->h32[m * (K / 32) + 2 * i + 1];
                o->h32t[(c * (K / 64) + i) * LANES + l] = (int32_t)(lo | (hi << 16));
            }
            for (int64_t i = 0; i < K / 32; i++) {
                uint32_t lo = (uint16_t)o->h16[m * (K / 16) + 2 * i], hi = (uint16_t)o->h16[m * (K / 16) + 2 * i + 1];
                o->h16t[(c * (K / 32) + i) * LANES + l] = (int32_t)(lo | (hi << 16));
            }
        }
    return 0;
}

static void xq_free(XQ *o) {
    free(o->q); free(o->qp); free(o->d); free(o->s32); free(o->h32); free(o->h16); free(o->qt); free(o->dt); free(o->s32t);
    free(o->h32t); free(o->h16t);
}

/* ---- a weight row, unpacked (several rows of x, and the portable loop) ---------------------------------------- */

/* q: signed codes [K] (after the offset: Q4_0 n - 8, Q5_0 n - 16, Q6_K n - 32; the types with a min keep n); per
 * block (nbp, padding zero) dw and mw (the min's scale, or dmin); K-quants: the integer scale sc per sub-block
 * (K / sub_len) and mn per 32, with mnp the pairs (mn[2i], mn[2i+1]) and scp the pairs (sc[2i], sc[2i+1]) of a
 * per-16 scale, each as two int16.
 * In the SIMD builds the rows-as-lanes product takes unsigned codes (unpack_simd: Q6_K keeps 0..63) and x signed,
 * the offset coming off through x's sums. */
typedef struct {
    int8_t *q;
    float *dw, *mw;
    int32_t *sc, *mn, *mnp, *scp;
    float *pbuf;  /* tile1's products: (K / 256 + 8) * 64 floats */
} Row;

static void unpack_scalar(int t, const uint8_t *w, int64_t K, Row *r) {
    int8_t *u = r->q;
    if (!is_k(t)) {
        int bytes = t == Q4_0 ? 18 : t == Q4_1 ? 20 : t == Q5_0 ? 22 : t == Q5_1 ? 24 : 34;
        for (int64_t b = 0; b < K / 32; b++, w += bytes, u += 32) {
            r->dw[b] = f16(w);
            r->mw[b] = (t == Q4_1 || t == Q5_1) ? f16(w + 2) : 0.0f;
            if (t == Q8_0) {
                memcpy(u, w + 2, 32);
            } else if (t == Q4_0 || t == Q4_1) {
                const uint8_t *qs = w + (t == Q4_0 ? 2 : 4);
                int off = t == Q4_0 ? 8 : 0;
                for (int j = 0; j < 16; j++) {
                    u[j] = (int8_t)((qs[j] & 0xF) - off);
                    u[j + 16] = (int8_t)((qs[j] >> 4) - off);
                }
            } else {
                const uint8_t *h = w + (t == Q5_0 ? 2 : 4), *qs = w + (t == Q5_0 ? 6 : 8);
                uint32_t qh = (uint32_t)h[0] | ((uint32_t)h[1] << 8) | ((uint32_t)h[2] << 16) | ((uint32_t)h[3] << 24);
                int off = t == Q5_0 ? 16 : 0;
                for (int j = 0; j < 16; j++) {
                    u[j] = (int8_t)(((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - off);
                    u[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off);
                }
            }
        }
        return;
    }
    int bytes = t == Q4_K ? 144 : t == Q5_K ? 176 : 210;
    for (int64_t sb = 0; sb < K / 256; sb++, w += bytes, u += 256) {
        if (t == Q6_K) {
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *s8 = (const int8_t *)(w + 192);
            r->dw[sb] = f16(w + 208);
            r->mw[sb] = 0.0f;
            for (int n = 0; n < 256; n += 128, ql += 64, qh += 32)
                for (int l = 0; l < 32; l++) {
                    u[n + l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                    u[n + l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    u[n + l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    u[n + l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            for (int i = 0; i < 16; i++) r->sc[16 * sb + i] = s8[i];
        } else {
            const uint8_t *qh = w + 16, *ql = t == Q4_K ? w + 16 : w + 48;
            r->dw[sb] = f16(w);
            r->mw[sb] = f16(w + 2);
            for (int g = 0; g < 4; g++, ql += 32)
                for (int l = 0; l < 32; l++) {
                    u[64 * g + l] = (int8_t)(ql[l] & 0xF);
                    u[64 * g + 32 + l] = (int8_t)(ql[l] >> 4);
                    if (t == Q5_K) {
                        u[64 * g + l] |= (int8_t)(((qh[l] >> (2 * g)) & 1) << 4);
                        u[64 * g + 32 + l] |= (int8_t)(((qh[l] >> (2 * g + 1)) & 1) << 4);
                    }
                }
            for (int j = 0; j < 8; j++) {
                int s, m;
                k_scale_min(j, w + 4, &s, &m);
                r->sc[8 * sb + j] = s;
                r->mn[8 * sb + j] = m;
            }
            for (int i = 0; i < 4; i++)
                r->mnp[4 * sb + i] = (int32_t)((uint32_t)r->mn[8 * sb + 2 * i] | ((uint32_t)r->mn[8 * sb + 2 * i + 1] << 16));
        }
    }
}

/* per block: isum and jsum from the unpacked row (the definition every level computes) */
static void block_ints(int t, const Row *r, int64_t b, const int8_t *q, const int16_t *h32, int32_t *isum,
                       int32_t *jsum) {
    int bl = block_len(t), sl = is_k(t) ? sub_len(t) : 32;
    int32_t is = 0, js = 0;
    for (int s = 0; s < bl / sl; s++) {
        int64_t e = bl * b + sl * s;
        int32_t dot = 0;
        for (int j = 0; j < sl; j++) dot += (int32_t)r->q[e + j] * q[e + j];
        is += is_k(t) ? r->sc[e / sl] * dot : dot;
    }
    if (t == Q4_1 || t == Q5_1) js = h32[b];
    if (t == Q4_K || t == Q5_K)
        for (int j = 0; j < 8; j++) js -= r->mn[8 * b + j] * h32[8 * b + j];
    *isum = is;
    *jsum = js;
}

static inline float tree8(const float *p) { return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])); }

/* the float side of one block, as every path computes it */
static inline float block_p(int mins, int32_t isum, int32_t jsum, float dw, float mw, float dx) {
    float p = (float)isum * (dw * dx);
    return mins ? p + (float)jsum * (mw * dx) : p;
}

__attribute__((unused)) static float row1_scalar(int t, const Row *r, int64_t K, const int8_t *q, const float *d,
                                                 const int16_t *h32) {
    int64_t nb = K / block_len(t);
    float acc = 0.0f, p[8];
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            int32_t is, js;
            if (b < nb) block_ints(t, r, b, q, h32, &is, &js);
            p[i] = b < nb ? block_p(has_min(t), is, js, r->dw[b], r->mw[b], d[b]) : 0.0f;
        }
        acc = acc + tree8(p);
    }
    return acc;
}

#ifdef SIMD
static inline float f16c(const uint8_t *p) { return _cvtsh_ss((uint16_t)(p[0] | (p[1] << 8))); }

/* 16 bytes of packed nibbles -> 32 bytes: the low nibbles (elements 0..15), then the high ones (16..31) */
static inline __m256i nibbles32(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

/* bit i of the 32-bit little-endian word at p -> byte i: 0x10 where set (Q5_0's fifth bit) */
static inline __m256i fifth_bits_word(uint32_t bits) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_mov_epi8((__mmask32)bits, _mm256_set1_epi8(0x10));
#else
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    b = _mm256_cmpeq_epi8(_mm256_and_si256(b, mask), mask);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
#endif
}

static inline __m256i fifth_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    return fifth_bits_word(bits);
}

/* u8 . s8, 4 at a time into 8 int32 lanes */
static inline __m256i dot_us(__m256i acc, __m256i u, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, x);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}

/* s8 . s8 (|q| times x with q's sign: exact while x > -128, which the quantizer keeps) */
static inline __m256i dot_ss(__m256i acc, __m256i q, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q)),
                                                   _mm256_set1_epi16(1)));
}

/* int16 pairs times int16 pairs into int32 lanes */
static inline __m256i madd_acc(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* 8 vectors of 8 int32 -> their 8 sums */
static inline __m256i hsum8x8(const __m256i v[8]) {
    __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    a = _mm256_hadd_epi32(a, b);
    c = _mm256_hadd_epi32(c, d);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, c, 0x20), _mm256_permute2x128_si256(a, c, 0x31));
}

static inline int32_t hsum_i32(__m256i v) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    return _mm_cvtsi128_si32(t);
}

static inline int32_t hsum_i32_128(__m128i t) {
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    return _mm_cvtsi128_si32(t);
}

/* ---- one row of x, along K, from the weight bytes ---------------------------------------------------------- */

/* 8 vectors of 8 block products (lanes: blocks) -> per vector ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), one per lane
 * (lanes: the vectors); float addition commutes, so hadd's pairs are the scalar tree's */
static inline __m256 tree8x8(const __m256 P[8]) {
    __m256 a = _mm256_hadd_ps(P[0], P[1]), b = _mm256_hadd_ps(P[2], P[3]);
    __m256 c = _mm256_hadd_ps(P[4], P[5]), d = _mm256_hadd_ps(P[6], P[7]);
    a = _mm256_hadd_ps(a, b);
    c = _mm256_hadd_ps(c, d);
    return _mm256_add_ps(_mm256_permute2f128_ps(a, c, 0x20), _mm256_permute2f128_ps(a, c, 0x31));
}

/* 8 vectors, lanes: rows -> the same tree per lane */
static inline __m256 tree8_rows(const __m256 P[8]) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(P[0], P[1]), _mm256_add_ps(P[2], P[3])),
                         _mm256_add_ps(_mm256_add_ps(P[4], P[5]), _mm256_add_ps(P[6], P[7])));
}

/* Q4_0, Q5_0, Q8_0, the 8 blocks of group g of one weight row: their products (lanes: blocks). Unsigned codes
 * (Q8_0 with VNNI: q + 128) times x, the offset off through x's sums per 32 */
static const uint8_t ZERO_BLOCK[64];  /* past a row's last block: codes, scale and x all zero, so its product is 0 */

static inline __m256 legacy_p(int t, const uint8_t *w, int64_t g, int64_t nb, const int8_t *x, const float *d,
                              const int32_t *s32) {
    int bytes = t == Q4_0 ? 18 : t == Q5_0 ? 22 : 34;
#ifdef VNNI
    int off = t == Q4_0 ? 8 : t == Q5_0 ? 16 : 128, sq = 0;
#else
    int off = t == Q4_0 ? 8 : t == Q5_0 ? 16 : 0, sq = t == Q8_0;
#endif
    __m256i v[8];
    __m128i dh = _mm_setzero_si128();  /* the 8 fp16 scales, converted at once (8 scalar stores then one vector load
                                          would stall on store forwarding) */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        int in = g + i < nb;
        const uint8_t *wb = in ? w + (g + i) * bytes : ZERO_BLOCK;
        const int8_t *xb = in ? x + 32 * (g + i) : (const int8_t *)ZERO_BLOCK;
        uint16_t h16;
        memcpy(&h16, wb, 2);
        dh = _mm_insert_epi16(dh, h16, i);
        __m256i xv = _mm256_loadu_si256((const __m256i *)xb);
        if (t == Q4_0) {
            v[i] = dot_us(_mm256_setzero_si256(), nibbles32(wb + 2), xv);
        } else if (t == Q5_0) {
            v[i] = dot_us(_mm256_setzero_si256(), _mm256_or_si256(nibbles32(wb + 6), fifth_bits(wb + 2)), xv);
        } else {
            __m256i q = _mm256_loadu_si256((const __m256i *)(wb + 2));
            v[i] = sq ? dot_ss(_mm256_setzero_si256(), q, xv)
                      : dot_us(_mm256_setzero_si256(), _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), xv);
        }
    }
    __m256i isum = hsum8x8(v);
    if (off) isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(s32 + g)),
                                                              _mm256_set1_epi32(off)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_cvtph_ps(dh), _mm256_loadu_ps(d + g)));
}

/* Q4_0, Q5_0: the 8 blocks of group g, two blocks per instruction: their nibble halves loaded side by side meet x
 * in pairs (xp, XQ.qp), so one vpdpbusd covers 2 x 16 codes and 4 vectors hold the 8 blocks' lane sums (a third
 * fewer vector instructions than a block at a time: the 4-bit unpack bounds this product) */
static inline __m256 nib_p(int t, const uint8_t *w, int64_t g, int64_t nb, const int8_t *xp, const float *d,
                           const int32_t *s32) {
    int bytes = t == Q4_0 ? 18 : 22, qs = t == Q4_0 ? 2 : 6, off = t == Q4_0 ? 8 : 16;
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i v[4];
    __m128i dh = _mm_setzero_si128();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        int64_t b0 = g + 2 * i, b1 = b0 + 1;
        const uint8_t *w0 = b0 < nb ? w + b0 * bytes : ZERO_BLOCK, *w1 = b1 < nb ? w + b1 * bytes : ZERO_BLOCK;
        const int8_t *xb = b0 < nb ? xp + 32 * b0 : (const int8_t *)ZERO_BLOCK;
        uint16_t h0, h1;
        memcpy(&h0, w0, 2);
        memcpy(&h1, w1, 2);
        dh = _mm_insert_epi16(dh, h0, 2 * i);
        dh = _mm_insert_epi16(dh, h1, 2 * i + 1);
        __m256i raw = _mm256_loadu2_m128i((const __m128i *)(w1 + qs), (const __m128i *)(w0 + qs));
        __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
        if (t == Q5_0) {
            uint32_t q0, q1;
            memcpy(&q0, w0 + 2, 4);
            memcpy(&q1, w1 + 2, 4);
            lo = _mm256_or_si256(lo, fifth_bits_word((q0 & 0xFFFF) | (q1 << 16)));
            hi = _mm256_or_si256(hi, fifth_bits_word((q0 >> 16) | (q1 & 0xFFFF0000u)));
        }
        v[i] = dot_us(dot_us(_mm256_setzero_si256(), lo, _mm256_loadu_si256((const __m256i *)xb)), hi,
                      _mm256_loadu_si256((const __m256i *)(xb + 32)));
    }
    /* v[i]: lanes 0-3 block 2i, 4-7 block 2i+1 -> [0, 2, 4, 6 | 1, 3, 5, 7] -> blocks in order */
    __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i isum = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(s32 + g)),
                                                     _mm256_set1_epi32(off)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_cvtph_ps(dh), _mm256_loadu_ps(d + g)));
}

/* Q4_K superblock b: nibbles times x (vpmaddubsw), the 6-bit scales onto the int16 pair sums (vpmaddwd), the mins
 * through x's sums per 32 */
static inline float q4_k_p(const uint8_t *wb, const int8_t *xb, float dx, const int16_t *h32b) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    /* the 12 bytes of 6-bit scales and mins -> 8 scale bytes then 8 min bytes, by 32-bit masks and shifts (bits laid
     * out as k_scale_min reads them) */
    uint32_t u[4];
    memcpy(u, wb + 4, 12);
    uint32_t mins_hi = ((u[2] >> 4) & 0x0F0F0F0F) | (((u[1] >> 6) & 0x03030303) << 4);
    uint32_t mins_lo = u[1] & 0x3F3F3F3F;
    uint32_t sc_hi = (u[2] & 0x0F0F0F0F) | (((u[0] >> 6) & 0x03030303) << 4);
    uint32_t sc_lo = u[0] & 0x3F3F3F3F;
    __m256i sm = _mm256_cvtepu8_epi16(_mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mins_lo, (int)mins_hi));
    __m128i sc8 = _mm256_castsi256_si128(sm);  /* int16 scales 0..7 */
    __m256i scb = _mm256_broadcastsi128_si256(sc8);
    __m256i a = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(wb + 16 + 32 * k));
        __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(v, low), _mm256_loadu_si256((const __m256i *)(xb + 64 * k)));
        __m256i p1 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                                          _mm256_loadu_si256((const __m256i *)(xb + 64 * k + 32)));
        /* int16 scale 2k (then 2k + 1) in every lane: bytes 4k, 4k + 1 (4k + 2, 4k + 3) of the scales */
        __m256i s0 = _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)(0x0100 * (4 * k + 1) + 4 * k)));
        __m256i s1 = _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)(0x0100 * (4 * k + 3) + 4 * k + 2)));
        a = madd_acc(a, p0, s0);
        a = madd_acc(a, p1, s1);
    }
    int32_t js = -hsum_i32_128(_mm_madd_epi16(_mm256_extracti128_si256(sm, 1), _mm_loadu_si128((const __m128i *)h32b)));
    return block_p(1, hsum_i32(a), js, f16c(wb), f16c(wb + 2), dx);
}

/* Q6_K superblock: 6-bit codes (0..63) times x, the int8 scales per 16 onto the pair sums, the -32 through x's sums
 * per 16 */
static inline float q6_k_p(const uint8_t *wb, const int8_t *xb, float dx, const int16_t *h16b) {
    const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
    const int8_t *s8 = (const int8_t *)(wb + 192);
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)s8));  /* the 16 scales */
    __m256i a = _mm256_setzero_si256();
    for (int half = 0; half < 2; half++) {
        const uint8_t *ql = wb + 64 * half, *qh = wb + 128 + 32 * half;
        __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        __m256i lo4[4] = {_mm256_and_si256(l0, low), _mm256_and_si256(l1, low),
                          _mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                          _mm256_and_si256(_mm256_srli_epi16(l1, 4), low)};
        for (int k = 0; k < 4; k++) {
            int j = 4 * half + k;  /* 32 codes: sub-blocks 2j (int16 lanes 0-7) and 2j+1 (8-15) */
            __m256i u = _mm256_or_si256(lo4[k], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k), two),
                                                                  4));
            __m256i pr = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(xb + 32 * j)));
            a = madd_acc(a, pr, _mm256_set_m128i(_mm_set1_epi16((short)s8[2 * j + 1]), _mm_set1_epi16((short)s8[2 * j])));
        }
    }
    int32_t cor = hsum_i32(_mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)h16b)));
    return block_p(0, hsum_i32(a) - 32 * cor, 0, f16c(wb + 208), 0.0f, dx);
}

/* the next weight row comes in while this one is multiplied (this thread's rows are contiguous): for verify rows,
 * where a row's arithmetic is long enough to hide it (one row at a time it measured no gain: the hardware prefetcher
 * keeps up with a plain stream) */
static inline void prefetch_row(const uint8_t *p, int64_t rb) {
    for (int64_t o = 0; o < rb; o += 64) __builtin_prefetch(p + o);
}

/* R <= 8 weight rows (rb bytes apart) against one row of x, along K: out[r]. Each weight row is read through in turn
 * (one memory stream: interleaving the 8 rows' bytes tripled the time of the cold Q8_0 head), its products kept in
 * pbuf [groups][8 rows][8]; then the rows' trees run side by side as lanes, so their float tails overlap instead of
 * queueing (one row at a time, the chain of group sums was a quarter of a Q5_0 decode product's time). */
static void tile1(int t, const uint8_t *w, int64_t rb, int R, int64_t K, const XQ *xq, float *pbuf, float *out) {
    __m256 acc = _mm256_setzero_ps(), P[8];
    if (!is_k(t)) {
        int64_t nb = K / 32, ng = (nb + 7) / 8;
        for (int r = 0; r < 8; r++) {
            for (int64_t g = 0; g < ng; g++)
                _mm256_storeu_ps(pbuf + (g * 8 + r) * 8,
                                 r >= R ? _mm256_setzero_ps()
                                 : t == Q8_0 ? legacy_p(t, w + r * rb, 8 * g, nb, xq->q, xq->d, xq->s32)
                                             : nib_p(t, w + r * rb, 8 * g, nb, xq->qp, xq->d, xq->s32));
        }
        for (int64_t g = 0; g < ng; g++) {
            for (int r = 0; r < 8; r++) P[r] = _mm256_loadu_ps(pbuf + (g * 8 + r) * 8);
            acc = _mm256_add_ps(acc, tree8x8(P));
        }
    } else {
        int64_t nb = K / 256, nbp = (nb + 7) / 8 * 8;
        int bytes = t == Q4_K ? 144 : 210;
        memset(pbuf, 0, sizeof(float) * (size_t)(nbp * 8));
        for (int r = 0; r < R; r++) {
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *wb = w + r * rb + b * bytes;
                pbuf[b * 8 + r] = t == Q4_K ? q4_k_p(wb, xq->q + 256 * b, xq->d[b], xq->h32 + 8 * b)
                                            : q6_k_p(wb, xq->q + 256 * b, xq->d[b], xq->h16 + 16 * b);
            }
        }
        for (int64_t g = 0; g < nbp; g += 8) {
            for (int i = 0; i < 8; i++) P[i] = _mm256_loadu_ps(pbuf + (g + i) * 8);
            acc = _mm256_add_ps(acc, tree8_rows(P));
        }
    }
    float o[8];
    _mm256_storeu_ps(o, acc);
    memcpy(out, o, (size_t)R * sizeof(float));
}

/* the other types: from the unpacked row, signed codes times x */
static float row1_unpacked(int t, const Row *r, int64_t K, const int8_t *x, const float *d, const int16_t *h32) {
    int64_t nb = K / block_len(t);
    int sl = is_k(t) ? sub_len(t) : 32, mins = has_min(t);
    float acc = 0.0f, p[8];
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            if (b >= nb) {
                p[i] = 0.0f;
                continue;
            }
            int32_t is = 0, js = 0;
            for (int64_t e = block_len(t) * b; e < block_len(t) * (b + 1); e += 32) {
                __m256i dot = dot_ss(_mm256_setzero_si256(), _mm256_loadu_si256((const __m256i *)(r->q + e)),
                                     _mm256_loadu_si256((const __m256i *)(x + e)));
                if (!is_k(t)) {
                    is += hsum_i32(dot);
                } else if (sl == 32) {
                    is += r->sc[e / 32] * hsum_i32(dot);
                } else {  /* lanes 0-3: the first 16, 4-7: the next 16 */
                    __m256i sv = _mm256_set_m128i(_mm_set1_epi32(r->sc[e / 16 + 1]), _mm_set1_epi32(r->sc[e / 16]));
                    is += hsum_i32(_mm256_mullo_epi32(dot, sv));
                }
            }
            if (t == Q4_1 || t == Q5_1) js = h32[b];
            if (t == Q4_K || t == Q5_K)
                for (int j = 0; j < 8; j++) js -= r->mn[8 * b + j] * h32[8 * b + j];
            p[i] = block_p(mins, is, js, r->dw[b], r->mw[b], d[b]);
        }
        acc = acc + tree8(p);
    }
    return acc;
}

/* ---- rows-as-lanes: LANES rows of x against an unpacked weight row --------------------------------------------- */

/* Q8_0's codes are signed: with VNNI they go in as q + 128 (off 128; vpdpbusd does not saturate), while AVX2's
 * vpmaddubsw would saturate on 255 * 127 * 2, so there they are multiplied signed (|q| times x with q's sign) */
#ifdef VNNI
#define SIGNED_Q8 0
#else
#define SIGNED_Q8 1
#endif

/* the vectorized unpackers (the others take the scalar one). The 32-blocks' codes stay unsigned (u: Q4_0 0..15,
 * Q5_0 0..31, Q8_0 q + 128, Q6_K 0..63) with their offset taken off through x's sums. */
static int unpack_simd(int t, const uint8_t *w, int64_t K, Row *r) {
    int8_t *u = r->q;
    if (t == Q4_0 || t == Q5_0 || t == Q8_0) {  /* unsigned codes (AVX2's Q8_0: signed), the offset through x */
        int bytes = t == Q4_0 ? 18 : t == Q5_0 ? 22 : 34;
        for (int64_t b = 0; b < K / 32; b++, w += bytes, u += 32) {
            r->dw[b] = f16c(w);
            r->mw[b] = 0.0f;
            __m256i c = t == Q4_0 ? nibbles32(w + 2)
                      : t == Q5_0 ? _mm256_or_si256(nibbles32(w + 6), fifth_bits(w + 2))
                                  : _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 2)),
                                                     _mm256_set1_epi8(SIGNED_Q8 ? 0 : (char)0x80));
            _mm256_storeu_si256((__m256i *)u, c);
        }
        return 1;
    }
    if (t == Q4_K) {
        const __m256i low = _mm256_set1_epi8(0x0F);
        for (int64_t sb = 0; sb < K / 256; sb++, w += 144, u += 256) {
            r->dw[sb] = f16c(w);
            r->mw[sb] = f16c(w + 2);
            for (int g = 0; g < 4; g++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * g));
                _mm256_storeu_si256((__m256i *)(u + 64 * g), _mm256_and_si256(v, low));
                _mm256_storeu_si256((__m256i *)(u + 64 * g + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
            }
            for (int j = 0; j < 8; j++) {
                int s, m;
                k_scale_min(j, w + 4, &s, &m);
                r->sc[8 * sb + j] = s;
                r->mn[8 * sb + j] = m;
            }
            for (int i = 0; i < 4; i++)
                r->mnp[4 * sb + i] = (int32_t)((uint32_t)r->mn[8 * sb + 2 * i] | ((uint32_t)r->mn[8 * sb + 2 * i + 1] << 16));
        }
        return 1;
    }
    if (t == Q6_K) {
        const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
        for (int64_t sb = 0; sb < K / 256; sb++, w += 210, u += 256) {
            r->dw[sb] = f16c(w + 208);
            r->mw[sb] = 0.0f;
            for (int half = 0; half < 2; half++) {
                const uint8_t *ql = w + 64 * half, *qh = w + 128 + 32 * half;
                __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
                __m256i h = _mm256_loadu_si256((const __m256i *)qh);
                __m256i lo4[4] = {_mm256_and_si256(l0, low), _mm256_and_si256(l1, low),
                                  _mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                                  _mm256_and_si256(_mm256_srli_epi16(l1, 4), low)};
                for (int k = 0; k < 4; k++) {
                    __m256i hi2 = _mm256_and_si256(_mm256_srli_epi16(h, 2 * k), two);
                    _mm256_storeu_si256((__m256i *)(u + 128 * half + 32 * k),
                                        _mm256_or_si256(lo4[k], _mm256_slli_epi16(hi2, 4)));
                }
            }
            const int8_t *s8 = (const int8_t *)(w + 192);
            for (int i = 0; i < 16; i++) r->sc[16 * sb + i] = s8[i];
            for (int i = 0; i < 8; i++)
                r->scp[8 * sb + i] = (int32_t)((uint16_t)(int16_t)s8[2 * i] | ((uint32_t)(uint16_t)(int16_t)s8[2 * i + 1] << 16));
        }
        return 1;
    }
    return 0;
}

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

/* 1 where this level has a vectorized kernel for the type (the others run, correctly, at scalar speed) */
int CAT(bolt_q8_fast, LEVEL)(int t) {
#ifdef SIMD
    return t == Q4_0 || t == Q5_0 || t == Q8_0 || t == Q4_K || t == Q6_K;
#else
    (void)t;
    return 0;
#endif
}

static int supported(int t, int64_t K) {
    switch (t) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: return K % 32 == 0;
    case Q4_K: case Q5_K: case Q6_K: return K % 256 == 0;
    default: return 0;
    }
}

static int64_t row_bytes(int t, int64_t K) {
    switch (t) {
    case Q4_0: return K / 32 * 18;
    case Q4_1: return K / 32 * 20;
    case Q5_0: return K / 32 * 22;
    case Q5_1: return K / 32 * 24;
    case Q8_0: return K / 32 * 34;
    case Q4_K: return K / 256 * 144;
    case Q5_K: return K / 256 * 176;
    default: return K / 256 * 210;
    }
}

/* R <= 8 weight rows (rb bytes apart) against all M rows of x: y[m * ystride + r]; r: this thread's unpack buffers */
static void weight_rows(int t, const uint8_t *w, int64_t rb, int R, int64_t K, int64_t M, const XQ *xq, Row *r,
                        float *y, int64_t ystride) {
#ifdef SIMD
    if (M == 1 && (t == Q4_0 || t == Q5_0 || t == Q8_0 || t == Q4_K || t == Q6_K)) {
        tile1(t, w, rb, R, K, xq, r->pbuf, y);
        return;
    }
    for (int i = 0; i < R; i++) {
        const uint8_t *wr = w + i * rb;
        if (M == 1) {
            unpack_scalar(t, wr, K, r);
            y[i] = row1_unpacked(t, r, K, xq->q, xq->d, xq->h32);
            continue;
        }
        if (!unpack_simd(t, wr, K, r)) unpack_scalar(t, wr, K, r);
        /* the unpack's first touch of a row's bytes held a quarter of a verify product's samples */
        prefetch_row(wr + rb, rb);
        float lanes[LANES];
        for (int64_t c = 0; c * LANES < M; c++) {
            rows_simd(t, r, K, xq, c, lanes);
            for (int64_t l = 0; l < LANES && c * LANES + l < M; l++) y[(c * LANES + l) * ystride + i] = lanes[l];
        }
    }
#else
    for (int i = 0; i < R; i++) {
        unpack_scalar(t, w + i * rb, K, r);
        for (int64_t m = 0; m < M; m++)
            y[m * ystride + i] = row1_scalar(t, r, K, xq->q + m * K, xq->d + m * xq->nbp, xq->h32 + m * (K / 32));
    }
#endif
}

/* y [M, sum N_p] = x [M, K] @ [W_0; W_1; ...]^T for n_parts weights side by side (q|k|v, gate|up), each [N_p, K] in
 * its own GGUF type at w[p], read where it lies (the GGUF mmap); x is quantized once per format the parts need.
 * Returns 0, or -1 for an unsupported type, a K that isn't whole blocks, M outside 1..MAX_M, or no memory. */
int CAT(bolt_q8_parts, LEVEL)(int n_parts, const int *types, const uint8_t *const *w, const int64_t *N, int64_t K,
                              const float *x, int64_t M, float *y, int n_threads) {
    if (n_parts < 1 || M < 1 || M > MAX_M || K < 32) return -1;
    int64_t n_total = 0;
    int need32 = 0, needk = 0;
    for (int p = 0; p < n_parts; p++) {
        if (!supported(types[p], K) || N[p] < 0) return -1;
        n_total += N[p];
        if (is_k(types[p])) needk = 1; else need32 = 1;
    }
    XQ x32, xk;
    memset(&x32, 0, sizeof x32);
    memset(&xk, 0, sizeof xk);
    int bad = (need32 && xq_make(&x32, x, M, K, 32)) || (needk && xq_make(&xk, x, M, K, 256));
    int64_t nbp = (K / 32 + 7) / 8 * 8;
    if (!bad) {
        #pragma omp parallel num_threads(n_threads)
        {
            Row r;
            r.q = malloc((size_t)K + 64);
            r.dw = calloc((size_t)nbp, sizeof(float));
            r.mw = calloc((size_t)nbp, sizeof(float));
            r.sc = calloc((size_t)(K / 16 + 16), sizeof(int32_t));
            r.mn = calloc((size_t)(K / 32 + 8), sizeof(int32_t));
            r.mnp = calloc((size_t)(K / 64 + 8), sizeof(int32_t));
            r.scp = calloc((size_t)(K / 32 + 8), sizeof(int32_t));
            r.pbuf = malloc(sizeof(float) * (size_t)((K / 256 + 8) * 64));
            int ok = r.q && r.dw && r.mw && r.sc && r.mn && r.mnp && r.scp && r.pbuf;
            int64_t off = 0;
            for (int p = 0; p < n_parts && ok; p++) {
                int t = types[p];
                int64_t rb = row_bytes(t, K);
                const XQ *xq = is_k(t) ? &xk : &x32;
                #pragma omp for schedule(static) nowait
                for (int64_t n = 0; n < N[p]; n += 8)  /* tiles of 8 weight rows */
                    weight_rows(t, w[p] + n * rb, rb, (int)(N[p] - n < 8 ? N[p] - n : 8), K, M, xq, &r, y + off + n,
                                n_total);
                off += N[p];
            }
            free(r.q); free(r.dw); free(r.mw); free(r.sc); free(r.mn); free(r.mnp); free(r.scp); free(r.pbuf);
            if (!ok) bad = 1;
        }
    }
    xq_free(&x32);
    xq_free(&xk);
    return bad ? -1 : 0;
}
