/* y = x @ W^T for a GGUF weight W [N, K] read in its own blocks and M <= 64 rows of x, with x quantized to int8 the
 * way llama.cpp (our numerical reference) does it: Q8_0 for the 32-blocks (Q4_0 .. Q8_0: one fp32 scale amax/127 per
 * 32), Q8_K for the K-quants (one scale per 256, sums per 16). Products are integer (vpmaddubsw + vpmaddwd on AVX2,
 * vpdpbusd with AVX-VNNI or AVX-512 VNNI) on unsigned weight codes; an offset (Q4_0: 8, Q5_0: 16, Q8_0: 128, Q6_K: 32)
 * comes off through x's block sums. A K-quant superblock's sub-block scales multiply integer sums, so one float
 * conversion serves 256 weights.
 *
 * This file is compiled once per instruction-set level (native.py: LEVEL = portable, avx2, avxvnni, avx512vnni, each
 * with its own -m flags) and exports bolt_q8_parts_<LEVEL>; Python picks the level by the CPU's flags, or a lower one
 * by BOLT_CPU_LEVEL, so one machine can test every level it can run.
 *
 * One float order everywhere. Integer sums are exact, so every level and every M computes the same per-block integer;
 * the float side is fixed per row of x: p = (float)isum * (d_w * d_x) [+ (float)jsum * (m_w * d_x)] per block
 * (superblock for K-quants), then per group of 8 blocks ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)) added to the row's sum.
 * So a verify block's rows are the 1-row results bit for bit (greedy DFlash == plain decoding), and the SIMD levels
 * equal the portable loop bit for bit (test_native_matmul.py). -ffp-contract=off keeps the compiler from fusing.
 *
 * Layout. Each weight row is unpacked once into u8 codes (K bytes) and per-block numbers, then multiplied with all M
 * rows. One row of x (decode) runs along K: 32 codes x 32 int8 of x per instruction, 8 blocks' lane sums reduced
 * together. Several rows (DFlash verify) run rows-as-lanes: x is laid out [K/4][rows] in 4-byte groups, so one
 * broadcast 4-byte group of codes meets 8 (ymm) or 16 (zmm, AVX-512) rows in one instruction and the block's sums come
 * out one per lane, with no horizontal adds; the float side is then one vector op for all those rows. */
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
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define VNNI 1
#define LANES 16 /* rows per rows-as-lanes chunk: one zmm of int32 */
#elif defined(__AVXVNNI__)
#define VNNI 1
#define LANES 8
#else
#define LANES 8
#endif
#else
#define LANES 8
#endif

static int is_k(int t) { return t == Q4_K || t == Q5_K || t == Q6_K; }
static int has_min(int t) { return t == Q4_1 || t == Q5_1 || t == Q4_K || t == Q5_K; }
/* the offset the unsigned codes carry: w = d (u - off) [+ m] */
static int code_off(int t) {
    switch (t) {
    case Q4_0: return 8;
    case Q5_0: return 16;
    case Q8_0: return 128;
    case Q6_K: return 32;
    default: return 0;
    }
}

/* ---- x -> int8 -------------------------------------------------------------------------------------------- */

/* x [n] in blocks of bs: d = amax / 127, q = nearest(x / d) in -127..127, and the sum of q per sb elements */
static void quantize_row(const float *x, int64_t n, int bs, int sb, int8_t *q, float *d, int32_t *s) {
    for (int64_t b = 0; b < n / bs; b++) {
        const float *xb = x + b * bs;
        float amax = 0.0f;
        for (int j = 0; j < bs; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        for (int j = 0; j < bs; j++) {
            float v = nearbyintf(xb[j] * id);
            q[b * bs + j] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
    }
    for (int64_t i = 0; i < n / sb; i++) {
        int32_t t = 0;
        for (int j = 0; j < sb; j++) t += q[i * sb + j];
        s[i] = t;
    }
}

/* One quantized x: q [M][K], per row d [M][nbp] (nbp = blocks rounded up to 8, zero-padded) and sums [M][ns];
 * for several rows the same numbers rows-as-lanes: qt [chunks][K/4][LANES] (4 bytes per int32), dt [chunks][nbp]
 * [LANES], st [chunks][ns][LANES], padded rows zero. */
typedef struct {
    int bs, sb;          /* scale block, sum block */
    int64_t nbp, ns;
    int8_t *q;
    float *d;
    int32_t *s;
    int32_t *qt, *st;
    float *dt;
} XQ;

static int xq_make(XQ *o, const float *x, int64_t M, int64_t K, int bs, int sb) {
    memset(o, 0, sizeof *o);
    o->bs = bs;
    o->sb = sb;
    o->nbp = (K / bs + 7) / 8 * 8;
    o->ns = K / sb;
    int64_t ch = (M + LANES - 1) / LANES;
    o->q = malloc((size_t)(M * K));
    o->d = calloc((size_t)(M * o->nbp), sizeof(float));
    o->s = malloc(sizeof(int32_t) * (size_t)(M * o->ns));
    if (M > 1) {
        o->qt = calloc((size_t)(ch * (K / 4) * LANES), sizeof(int32_t));
        o->dt = calloc((size_t)(ch * o->nbp * LANES), sizeof(float));
        o->st = calloc((size_t)(ch * o->ns * LANES), sizeof(int32_t));
    }
    if (!o->q || !o->d || !o->s || (M > 1 && (!o->qt || !o->dt || !o->st))) return -1;
    for (int64_t m = 0; m < M; m++)
        quantize_row(x + m * K, K, bs, sb, o->q + m * K, o->d + m * o->nbp, o->s + m * o->ns);
    if (M > 1)
        for (int64_t m = 0; m < M; m++) {
            int64_t c = m / LANES, l = m % LANES;
            for (int64_t k4 = 0; k4 < K / 4; k4++)
                memcpy(o->qt + (c * (K / 4) + k4) * LANES + l, o->q + m * K + 4 * k4, 4);
            for (int64_t b = 0; b < K / bs; b++) o->dt[(c * o->nbp + b) * LANES + l] = o->d[m * o->nbp + b];
            for (int64_t i = 0; i < o->ns; i++) o->st[(c * o->ns + i) * LANES + l] = o->s[m * o->ns + i];
        }
    return 0;
}

static void xq_free(XQ *o) {
    free(o->q); free(o->d); free(o->s); free(o->qt); free(o->dt); free(o->st);
}

/* ---- a weight row, unpacked --------------------------------------------------------------------------------- */

/* codes u8 [K]; per block (32, or 256 for K-quants; nbp padded with zeros) the float scale dw and the min's mw (or
 * dmin); per 4 codes the integer sub-block scale sc (K-quants: Q4_K/Q5_K per 32, Q6_K per 16) and min mn */
typedef struct {
    uint8_t *codes;
    float *dw, *mw;
    int32_t *sc, *mn;
} Row;

static void unpack_scalar(int t, const uint8_t *w, int64_t K, Row *r) {
    uint8_t *u = r->codes;
    if (!is_k(t)) {
        int bytes = t == Q4_0 ? 18 : t == Q4_1 ? 20 : t == Q5_0 ? 22 : t == Q5_1 ? 24 : 34;
        for (int64_t b = 0; b < K / 32; b++, w += bytes, u += 32) {
            r->dw[b] = f16(w);
            r->mw[b] = (t == Q4_1 || t == Q5_1) ? f16(w + 2) : 0.0f;
            if (t == Q8_0) {
                for (int j = 0; j < 32; j++) u[j] = (uint8_t)(w[2 + j] ^ 0x80);  /* q + 128 */
            } else if (t == Q4_0 || t == Q4_1) {
                const uint8_t *qs = w + (t == Q4_0 ? 2 : 4);
                for (int j = 0; j < 16; j++) {
                    u[j] = qs[j] & 0xF;
                    u[j + 16] = qs[j] >> 4;
                }
            } else {
                const uint8_t *h = w + (t == Q5_0 ? 2 : 4), *qs = w + (t == Q5_0 ? 6 : 8);
                uint32_t qh = (uint32_t)h[0] | ((uint32_t)h[1] << 8) | ((uint32_t)h[2] << 16) | ((uint32_t)h[3] << 24);
                for (int j = 0; j < 16; j++) {
                    u[j] = (uint8_t)((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
                    u[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
                }
            }
        }
        return;
    }
    int bytes = t == Q4_K ? 144 : t == Q5_K ? 176 : 210;
    for (int64_t sb = 0; sb < K / 256; sb++, w += bytes, u += 256) {
        int32_t *sc = r->sc + sb * 64, *mn = r->mn + sb * 64;
        if (t == Q6_K) {
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *s8 = (const int8_t *)(w + 192);
            r->dw[sb] = f16(w + 208);
            r->mw[sb] = 0.0f;
            for (int n = 0; n < 256; n += 128, ql += 64, qh += 32)
                for (int l = 0; l < 32; l++) {
                    u[n + l] = (uint8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
                    u[n + l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
                    u[n + l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                    u[n + l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
                }
            for (int i = 0; i < 64; i++) {
                sc[i] = s8[i / 4];
                mn[i] = 0;
            }
        } else {
            const uint8_t *qh = w + 16, *ql = t == Q4_K ? w + 16 : w + 48;
            r->dw[sb] = f16(w);
            r->mw[sb] = f16(w + 2);
            for (int g = 0; g < 4; g++, ql += 32)
                for (int l = 0; l < 32; l++) {
                    u[64 * g + l] = ql[l] & 0xF;
                    u[64 * g + 32 + l] = ql[l] >> 4;
                    if (t == Q5_K) {
                        u[64 * g + l] |= (uint8_t)(((qh[l] >> (2 * g)) & 1) << 4);
                        u[64 * g + 32 + l] |= (uint8_t)(((qh[l] >> (2 * g + 1)) & 1) << 4);
                    }
                }
            for (int j = 0; j < 8; j++) {
                int s, m;
                k_scale_min(j, w + 4, &s, &m);
                for (int i = 0; i < 8; i++) {
                    sc[8 * j + i] = s;
                    mn[8 * j + i] = m;
                }
            }
        }
    }
}

#ifdef SIMD
/* 16 bytes of packed nibbles -> 32 bytes: the low nibbles (elements 0..15), then the high ones (16..31) */
static inline __m256i nibbles32(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

/* bit i of the 32-bit little-endian word at p -> byte i: 0x10 where set (Q5_0's fifth bit) */
static inline __m256i fifth_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    b = _mm256_cmpeq_epi8(_mm256_and_si256(b, mask), mask);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

/* the vectorized unpackers (the others take the scalar one); the same bytes as unpack_scalar */
static int unpack_simd(int t, const uint8_t *w, int64_t K, Row *r) {
    uint8_t *u = r->codes;
    if (t == Q4_0 || t == Q5_0 || t == Q8_0) {
        int bytes = t == Q4_0 ? 18 : t == Q5_0 ? 22 : 34;
        for (int64_t b = 0; b < K / 32; b++, w += bytes, u += 32) {
            r->dw[b] = _cvtsh_ss((uint16_t)(w[0] | (w[1] << 8)));
            r->mw[b] = 0.0f;
            __m256i c = t == Q4_0 ? nibbles32(w + 2)
                      : t == Q5_0 ? _mm256_or_si256(nibbles32(w + 6), fifth_bits(w + 2))
                                  : _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 2)),
                                                     _mm256_set1_epi8((char)0x80));
            _mm256_storeu_si256((__m256i *)u, c);
        }
        return 1;
    }
    if (t == Q4_K) {
        const __m256i low = _mm256_set1_epi8(0x0F);
        for (int64_t sb = 0; sb < K / 256; sb++, w += 144, u += 256) {
            r->dw[sb] = _cvtsh_ss((uint16_t)(w[0] | (w[1] << 8)));
            r->mw[sb] = _cvtsh_ss((uint16_t)(w[2] | (w[3] << 8)));
            for (int g = 0; g < 4; g++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * g));
                _mm256_storeu_si256((__m256i *)(u + 64 * g), _mm256_and_si256(v, low));
                _mm256_storeu_si256((__m256i *)(u + 64 * g + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
            }
            int32_t *sc = r->sc + sb * 64, *mn = r->mn + sb * 64;
            for (int j = 0; j < 8; j++) {
                int s, m;
                k_scale_min(j, w + 4, &s, &m);
                _mm256_storeu_si256((__m256i *)(sc + 8 * j), _mm256_set1_epi32(s));
                _mm256_storeu_si256((__m256i *)(mn + 8 * j), _mm256_set1_epi32(m));
            }
        }
        return 1;
    }
    if (t == Q6_K) {
        const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
        for (int64_t sb = 0; sb < K / 256; sb++, w += 210, u += 256) {
            r->dw[sb] = _cvtsh_ss((uint16_t)(w[208] | (w[209] << 8)));
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
            int32_t *sc = r->sc + sb * 64, *mn = r->mn + sb * 64;
            for (int i = 0; i < 16; i++) _mm_storeu_si128((__m128i *)(sc + 4 * i), _mm_set1_epi32(s8[i]));
            memset(mn, 0, 64 * sizeof(int32_t));
        }
        return 1;
    }
    return 0;
}

/* Q8_0's codes are signed: with VNNI they go in as q + 128 (off 128, vpdpbusd does not saturate); AVX2's vpmaddubsw
 * would saturate on 255 * 127 * 2, so there they are multiplied signed (|q| times x with q's sign) */
#if defined(VNNI)
#define SIGNED_Q8 0
#else
#define SIGNED_Q8 1
#endif

/* u8 codes . s8 x, 4 at a time into 8 int32 lanes */
static inline __m256i dot_us(__m256i acc, __m256i u, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, x);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}

/* the same for codes stored as q + 128 whose products must be signed (AVX2's Q8_0) */
static inline __m256i dot_ss(__m256i acc, __m256i u, __m256i x) {
    __m256i q = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q)),
                                                   _mm256_set1_epi16(1)));
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

/* ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)): float addition commutes, so the swaps give exactly the scalar tree */
static inline float tree8_lanes(__m256 v) {
    __m256 s = _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1));
    s = _mm256_add_ps(s, _mm256_permute_ps(s, 0x4E));
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
}
#endif /* SIMD */

static inline float tree8(const float *p) { return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])); }

/* ---- one row of x against an unpacked weight row --------------------------------------------------------------
 * per block: isum = sum(u x) - off * sum(x) (K-quants: sum over sub-blocks of sc (u.x - off sum x)), jsum = sum(x)
 * for Q4_1/Q5_1, -sum(mn sum x) for Q4_K/Q5_K; p = isum * (dw dx) [+ jsum * (mw dx)] */

__attribute__((unused)) static float row1_scalar(int t, const Row *r, int64_t K, const int8_t *q, const float *d, const int32_t *s) {
    int64_t nb = is_k(t) ? K / 256 : K / 32;
    int off = code_off(t), mins = has_min(t);
    float acc = 0.0f, p[8];
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            if (b >= nb) {
                p[i] = 0.0f;
                continue;
            }
            int32_t isum = 0, jsum = 0;
            if (!is_k(t)) {
                for (int j = 0; j < 32; j++) isum += (int32_t)r->codes[32 * b + j] * q[32 * b + j];
                isum -= off * s[b];
                jsum = s[b];
            } else {
                for (int i16 = 0; i16 < 16; i16++) {
                    int64_t e = 256 * b + 16 * i16;
                    int32_t dot = 0;
                    for (int j = 0; j < 16; j++) dot += (int32_t)r->codes[e + j] * q[e + j];
                    isum += r->sc[e / 4] * (dot - off * s[e / 16]);
                    jsum -= r->mn[e / 4] * s[e / 16];
                }
            }
            float pb = (float)isum * (r->dw[b] * d[b]);
            if (mins) pb = pb + (float)jsum * (r->mw[b] * d[b]);
            p[i] = pb;
        }
        acc = acc + tree8(p);
    }
    return acc;
}

#ifdef SIMD
static float row1_simd(int t, const Row *r, int64_t K, const int8_t *q, const float *d, const int32_t *s) {
    int off = code_off(t), mins = has_min(t);
    float acc = 0.0f;
    if (!is_k(t)) {
        int64_t nb = K / 32;
        int sq = t == Q8_0 && SIGNED_Q8;
        for (int64_t g = 0; g < nb; g += 8) {
            __m256i v[8];
            for (int i = 0; i < 8; i++) {
                int64_t b = g + i;
                if (b >= nb) {
                    v[i] = _mm256_setzero_si256();
                    continue;
                }
                __m256i u = _mm256_loadu_si256((const __m256i *)(r->codes + 32 * b));
                __m256i x = _mm256_loadu_si256((const __m256i *)(q + 32 * b));
                v[i] = sq ? dot_ss(_mm256_setzero_si256(), u, x) : dot_us(_mm256_setzero_si256(), u, x);
            }
            __m256i isum = hsum8x8(v), sx = _mm256_setzero_si256();
            int64_t n = nb - g < 8 ? nb - g : 8;
            int32_t sbuf[8] = {0};
            memcpy(sbuf, s + g, (size_t)n * sizeof(int32_t));
            sx = _mm256_loadu_si256((const __m256i *)sbuf);
            if (!sq) isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(sx, _mm256_set1_epi32(off)));
            __m256 dx = _mm256_loadu_ps(d + g);
            __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_loadu_ps(r->dw + g), dx));
            if (mins) p = _mm256_add_ps(p, _mm256_mul_ps(_mm256_cvtepi32_ps(sx),
                                                         _mm256_mul_ps(_mm256_loadu_ps(r->mw + g), dx)));
            acc = acc + tree8_lanes(p);
        }
        return acc;
    }
    int64_t nb = K / 256;
    float p[8];
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            if (b >= nb) {
                p[i] = 0.0f;
                continue;
            }
            __m256i acc_i = _mm256_setzero_si256(), cor = _mm256_setzero_si256(), mj = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {  /* 32 codes; lanes 0-3 are sub-block 2j of 16, lanes 4-7 sub-block 2j+1 */
                int64_t e = 256 * b + 32 * j;
                __m256i dot = dot_us(_mm256_setzero_si256(), _mm256_loadu_si256((const __m256i *)(r->codes + e)),
                                     _mm256_loadu_si256((const __m256i *)(q + e)));
                acc_i = _mm256_add_epi32(acc_i, _mm256_mullo_epi32(dot, _mm256_loadu_si256((const __m256i *)
                                                                                            (r->sc + e / 4))));
            }
            /* the offset and the mins through x's sums per 16: sc and mn are stored per 4 codes, so every 4th */
            const __m256i every4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
            for (int h = 0; h < 2; h++) {
                __m256i bs = _mm256_loadu_si256((const __m256i *)(s + 16 * b + 8 * h));
                __m256i sc = _mm256_i32gather_epi32(r->sc + 64 * b + 32 * h, every4, 4);
                __m256i mn = _mm256_i32gather_epi32(r->mn + 64 * b + 32 * h, every4, 4);
                cor = _mm256_add_epi32(cor, _mm256_mullo_epi32(sc, bs));
                mj = _mm256_add_epi32(mj, _mm256_mullo_epi32(mn, bs));
            }
            int32_t isum = hsum_i32(acc_i) - off * hsum_i32(cor), jsum = -hsum_i32(mj);
            float pb = (float)isum * (r->dw[b] * d[b]);
            if (mins) pb = pb + (float)jsum * (r->mw[b] * d[b]);
            p[i] = pb;
        }
        acc = acc + tree8(p);
    }
    return acc;
}

/* ---- rows-as-lanes: a chunk of LANES rows of x against an unpacked weight row -------------------------------- */
#if LANES == 16
typedef __m512i vi;
typedef __m512 vf;
#define VI_ZERO _mm512_setzero_si512()
#define VI_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define VI_BCAST(p) _mm512_set1_epi32(*(const int32_t *)(p))
#define VI_SET1(v) _mm512_set1_epi32(v)
#define VI_ADD _mm512_add_epi32
#define VI_SUB _mm512_sub_epi32
#define VI_MUL _mm512_mullo_epi32
#define VI_DOT(a, u, x) _mm512_dpbusd_epi32(a, u, x)
#define VF_ZERO _mm512_setzero_ps()
#define VF_LOAD _mm512_loadu_ps
#define VF_STORE _mm512_storeu_ps
#define VF_SET1 _mm512_set1_ps
#define VF_CVT _mm512_cvtepi32_ps
#define VF_ADD _mm512_add_ps
#define VF_MUL _mm512_mul_ps
#else
typedef __m256i vi;
typedef __m256 vf;
#define VI_ZERO _mm256_setzero_si256()
#define VI_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VI_BCAST(p) _mm256_set1_epi32(*(const int32_t *)(p))
#define VI_SET1(v) _mm256_set1_epi32(v)
#define VI_ADD _mm256_add_epi32
#define VI_SUB _mm256_sub_epi32
#define VI_MUL _mm256_mullo_epi32
#define VI_DOT(a, u, x) dot_us(a, u, x)
#define VF_ZERO _mm256_setzero_ps()
#define VF_LOAD _mm256_loadu_ps
#define VF_STORE _mm256_storeu_ps
#define VF_SET1 _mm256_set1_ps
#define VF_CVT _mm256_cvtepi32_ps
#define VF_ADD _mm256_add_ps
#define VF_MUL _mm256_mul_ps
#endif

#if SIGNED_Q8
/* AVX2's Q8_0 in lanes: |q| broadcast times x with q's sign */
static inline vi dot_ss_lanes(vi a, const uint8_t *u4, vi x) {
    int32_t w;
    memcpy(&w, u4, 4);
    __m256i q = _mm256_xor_si256(_mm256_set1_epi32(w), _mm256_set1_epi8((char)0x80));
    return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q)),
                                                 _mm256_set1_epi16(1)));
}
#endif

/* the integer dot of n4 groups of 4 codes at u with x's groups at xt (LANES rows each), two chains */
static inline vi dot_groups(const uint8_t *u, const int32_t *xt, int n4, int sq) {
    vi a0 = VI_ZERO, a1 = VI_ZERO;
#if SIGNED_Q8
    if (sq) {
        for (int c = 0; c < n4; c += 2) {
            a0 = dot_ss_lanes(a0, u + 4 * c, VI_LOAD(xt + c * LANES));
            a1 = dot_ss_lanes(a1, u + 4 * c + 4, VI_LOAD(xt + (c + 1) * LANES));
        }
        return VI_ADD(a0, a1);
    }
#else
    (void)sq;
#endif
    for (int c = 0; c < n4; c += 2) {
        a0 = VI_DOT(a0, VI_BCAST(u + 4 * c), VI_LOAD(xt + c * LANES));
        a1 = VI_DOT(a1, VI_BCAST(u + 4 * c + 4), VI_LOAD(xt + (c + 1) * LANES));
    }
    return VI_ADD(a0, a1);
}

/* out[l] for the chunk's LANES rows (c: the chunk) */
static void rows_simd(int t, const Row *r, int64_t K, const XQ *xq, int64_t c, float *out) {
    int off = code_off(t), mins = has_min(t), sq = t == Q8_0 && SIGNED_Q8;
    int64_t nb = is_k(t) ? K / 256 : K / 32;
    const int32_t *xt = xq->qt + c * (K / 4) * LANES, *st = xq->st + c * xq->ns * LANES;
    const float *dt = xq->dt + c * xq->nbp * LANES;
    vf acc = VF_ZERO, p[8];
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            if (b >= nb) {
                p[i] = VF_ZERO;
                continue;
            }
            vi isum, jsum = VI_ZERO;
            if (!is_k(t)) {
                isum = dot_groups(r->codes + 32 * b, xt + 8 * b * LANES, 8, sq);
                vi sx = VI_LOAD(st + b * LANES);
                if (!sq) isum = VI_SUB(isum, VI_MUL(sx, VI_SET1(off)));
                jsum = sx;
            } else {
                isum = VI_ZERO;
                for (int i16 = 0; i16 < 16; i16++) {
                    int64_t e = 256 * b + 16 * i16;
                    vi dot = dot_groups(r->codes + e, xt + (e / 4) * LANES, 4, 0);
                    vi sx = VI_LOAD(st + (e / 16) * LANES);
                    isum = VI_ADD(isum, VI_MUL(VI_SUB(dot, VI_MUL(sx, VI_SET1(off))), VI_SET1(r->sc[e / 4])));
                    jsum = VI_SUB(jsum, VI_MUL(sx, VI_SET1(r->mn[e / 4])));
                }
            }
            vf dx = VF_LOAD(dt + b * LANES);
            vf pb = VF_MUL(VF_CVT(isum), VF_MUL(VF_SET1(r->dw[b]), dx));
            if (mins) pb = VF_ADD(pb, VF_MUL(VF_CVT(jsum), VF_MUL(VF_SET1(r->mw[b]), dx)));
            p[i] = pb;
        }
        acc = VF_ADD(acc, VF_ADD(VF_ADD(VF_ADD(p[0], p[1]), VF_ADD(p[2], p[3])),
                                 VF_ADD(VF_ADD(p[4], p[5]), VF_ADD(p[6], p[7]))));
    }
    VF_STORE(out, acc);
}
#endif /* SIMD */

/* 1 where this level has a vectorized unpacker for the type (the others run, correctly, at scalar speed) */
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
    int bad = (need32 && xq_make(&x32, x, M, K, 32, 32)) || (needk && xq_make(&xk, x, M, K, 256, 16));
    int64_t nbp = (K / 32 + 7) / 8 * 8;
    if (!bad) {
        #pragma omp parallel num_threads(n_threads)
        {
            Row r;
            r.codes = malloc((size_t)K + 64);
            r.dw = calloc((size_t)nbp, sizeof(float));
            r.mw = calloc((size_t)nbp, sizeof(float));
            r.sc = malloc(sizeof(int32_t) * (size_t)(K / 4 + 16));
            r.mn = malloc(sizeof(int32_t) * (size_t)(K / 4 + 16));
            int ok = r.codes && r.dw && r.mw && r.sc && r.mn;
            int64_t off = 0;
            for (int p = 0; p < n_parts && ok; p++) {
                int t = types[p];
                int64_t rb = row_bytes(t, K);
                const XQ *xq = is_k(t) ? &xk : &x32;
                #pragma omp for schedule(static) nowait
                for (int64_t n = 0; n < N[p]; n++) {
                    const uint8_t *wr = w[p] + n * rb;
#ifdef SIMD
                    if (!unpack_simd(t, wr, K, &r)) unpack_scalar(t, wr, K, &r);
                    if (M == 1) {
                        y[off + n] = row1_simd(t, &r, K, xq->q, xq->d, xq->s);
                    } else {
                        float lanes[LANES];
                        for (int64_t c = 0; c * LANES < M; c++) {
                            rows_simd(t, &r, K, xq, c, lanes);
                            for (int64_t l = 0; l < LANES && c * LANES + l < M; l++)
                                y[(c * LANES + l) * n_total + off + n] = lanes[l];
                        }
                    }
#else
                    unpack_scalar(t, wr, K, &r);
                    for (int64_t m = 0; m < M; m++)
                        y[m * n_total + off + n] = row1_scalar(t, &r, K, xq->q + m * K, xq->d + m * xq->nbp,
                                                               xq->s + m * xq->ns);
#endif
                }
                off += N[p];
            }
            free(r.codes); free(r.dw); free(r.mw); free(r.sc); free(r.mn);
            if (!ok) bad = 1;
        }
    }
    xq_free(&x32);
    xq_free(&xk);
    return bad ? -1 : 0;
}
