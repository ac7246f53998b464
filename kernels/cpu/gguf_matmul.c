/* y = x @ W^T for a GGUF weight W [N, K] read in its own blocks, and a few rows of x [M, K]: the CPU decode (M = 1)
 * and DFlash verify (M = 8) product, where the weight's bytes are the cost.
 *
 * x is quantized per block of 32 to int16 with one fp32 scale (amax / 32767): a relative error of ~1e-5, far below
 * the bf16 rounding of the other fast paths (llama.cpp quantizes x to int8 here, ~4e-3). Each weight block is
 * unpacked once to int16 codes and dotted with every row of x in int32 (vpmaddwd / vpdpwssd); the block's scales
 * apply to the integer sums. Rows of W are split across OpenMP threads: the library resolves libgomp.so.1 to the one
 * torch already loaded, so both share one thread pool.
 *
 * Built and loaded by kernels/cpu/native.py; the torch reference is dequantize + matmul (test_native_matmul.py). */
#include <math.h>
#include <stdlib.h>

#include "gguf_blocks.h"
#define MAX_M 64
#define CHUNK_M 8  /* rows of x per pass over a weight row (the vectorized kernels' accumulators) */

static inline int32_t dot16(const int16_t *restrict a, const int16_t *restrict b) {  /* 16 products */
    int32_t s = 0;
    for (int i = 0; i < 16; i++) s += (int32_t)a[i] * (int32_t)b[i];
    return s;
}

static inline int32_t dot32(const int16_t *restrict a, const int16_t *restrict b) {
    int32_t s = 0;
    for (int i = 0; i < 32; i++) s += (int32_t)a[i] * (int32_t)b[i];
    return s;
}

/* One weight row (its blocks at w) against M quantized rows of x: acc[m] = sum_k W[k] x[m, k].
 * xq [M, K] int16, xd [M, K/32] scales, xs [M, K/32] sums of xq per 32 (for the types with a min). */
static void row_dot(int type, const uint8_t *w, int64_t K, int M, const int16_t *xq, const float *xd,
                    const int32_t *xs, float *acc) {
    int16_t q[256];
    int64_t nb32 = K / 32;
    for (int m = 0; m < M; m++) acc[m] = 0.0f;
    switch (type) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: {
        int bytes = type == Q4_0 ? 18 : type == Q4_1 ? 20 : type == Q5_0 ? 22 : type == Q5_1 ? 24 : 34;
        for (int64_t b = 0; b < nb32; b++, w += bytes) {
            float d = f16(w), mn = 0.0f;
            if (type == Q8_0) {
                for (int j = 0; j < 32; j++) q[j] = (int8_t)w[2 + j];
            } else if (type == Q4_0 || type == Q4_1) {
                const uint8_t *qs = w + (type == Q4_0 ? 2 : 4);
                int off = type == Q4_0 ? 8 : 0;
                for (int j = 0; j < 16; j++) {
                    q[j] = (int16_t)((qs[j] & 0xF) - off);
                    q[j + 16] = (int16_t)((qs[j] >> 4) - off);
                }
                if (type == Q4_1) mn = f16(w + 2);
            } else {
                const uint8_t *h = w + (type == Q5_0 ? 2 : 4), *qs = w + (type == Q5_0 ? 6 : 8);
                uint32_t qh = (uint32_t)h[0] | ((uint32_t)h[1] << 8) | ((uint32_t)h[2] << 16) | ((uint32_t)h[3] << 24);
                int off = type == Q5_0 ? 16 : 0;
                for (int j = 0; j < 16; j++) {
                    q[j] = (int16_t)(((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - off);
                    q[j + 16] = (int16_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off);
                }
                if (type == Q5_1) mn = f16(w + 2);
            }
            for (int m = 0; m < M; m++) {
                float s = (float)dot32(q, xq + (int64_t)m * K + b * 32);
                acc[m] += xd[m * nb32 + b] * (d * s + mn * (float)xs[m * nb32 + b]);
            }
        }
        break;
    }
    case Q4_K: case Q5_K: {
        int bytes = type == Q4_K ? 144 : 176;
        for (int64_t sb = 0; sb < K / 256; sb++, w += bytes) {
            float d = f16(w), dmin = f16(w + 2);
            const uint8_t *scales = w + 4, *qh = w + 16, *ql = type == Q4_K ? w + 16 : w + 48;
            for (int g = 0; g < 4; g++, ql += 32) {
                for (int l = 0; l < 32; l++) {
                    q[64 * g + l] = (int16_t)(ql[l] & 0xF);
                    q[64 * g + 32 + l] = (int16_t)(ql[l] >> 4);
                }
                if (type == Q5_K)
                    for (int l = 0; l < 32; l++) {
                        q[64 * g + l] |= (int16_t)(((qh[l] >> (2 * g)) & 1) << 4);
                        q[64 * g + 32 + l] |= (int16_t)(((qh[l] >> (2 * g + 1)) & 1) << 4);
                    }
            }
            float dl[8], ml[8];
            for (int j = 0; j < 8; j++) {
                int sc, mm;
                k_scale_min(j, scales, &sc, &mm);
                dl[j] = d * (float)sc;
                ml[j] = dmin * (float)mm;
            }
            for (int m = 0; m < M; m++) {
                const int16_t *xr = xq + (int64_t)m * K + sb * 256;
                const float *xdr = xd + m * nb32 + sb * 8;
                const int32_t *xsr = xs + m * nb32 + sb * 8;
                float a = 0.0f;
                for (int j = 0; j < 8; j++)
                    a += xdr[j] * (dl[j] * (float)dot32(q + 32 * j, xr + 32 * j) - ml[j] * (float)xsr[j]);
                acc[m] += a;
            }
        }
        break;
    }
    case Q6_K: {
        for (int64_t sb = 0; sb < K / 256; sb++, w += 210) {
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *sc = (const int8_t *)(w + 192);
            float d = f16(w + 208);
            for (int n = 0; n < 256; n += 128, ql += 64, qh += 32) {
                for (int l = 0; l < 32; l++) {
                    q[n + l] = (int16_t)((int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                    q[n + l + 32] = (int16_t)((int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    q[n + l + 64] = (int16_t)((int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    q[n + l + 96] = (int16_t)((int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
            /* sub-block s of 16 weights has scale sc[s] (element order: n*128 + l + 32*k, s = n/16... as llama.cpp:
             * y[n + l + 32k] uses sc[8*(n/128) + l/16 + 2k]) -> sub-block index of element e: e / 16 */
            for (int m = 0; m < M; m++) {
                const int16_t *xr = xq + (int64_t)m * K + sb * 256;
                const float *xdr = xd + m * nb32 + sb * 8;
                float a = 0.0f;
                for (int j = 0; j < 8; j++) {
                    float s = (float)sc[2 * j] * (float)dot16(q + 32 * j, xr + 32 * j)
                              + (float)sc[2 * j + 1] * (float)dot16(q + 32 * j + 16, xr + 32 * j + 16);
                    a += xdr[j] * s;
                }
                acc[m] += d * a;
            }
        }
        break;
    }
    }
}


#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define SIMD_TYPES(t) ((t) == Q5_0 || (t) == Q8_0 || (t) == Q4_K || (t) == Q6_K)

static inline float f16c(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline float hsum(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* 16 int16 codes times 16 int16 of x, pairwise summed into 8 int32 lanes (VNNI's vpdpwssd where there is one) */
static inline __m256i madd16(__m256i acc, __m256i q, const int16_t *x) {
    __m256i xv = _mm256_loadu_si256((const __m256i *)x);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, q, xv);
#elif defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, q, xv);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(q, xv));
#endif
}

/* bit i of the 32-bit little-endian word at p -> byte i of the result: 0x10 where set, 0 elsewhere (Q5_0's 5th bit) */
static inline __m256i fifth_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);  /* byte i = byte i/8 of the word */
    b = _mm256_cmpeq_epi8(_mm256_and_si256(b, mask), mask);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

/* 16 bytes of packed nibbles -> 32 bytes: the low nibbles (elements 0..15), then the high ones (16..31) */
static inline __m256i nibbles32(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* Q5_0's 32 codes (-16..15) at w straight as int16, elements 0..15 in *lo and 16..31 in *hi: the 16 bytes at w + 6
 * widened (byte j holds elements j and j + 16) and split into nibbles, the 5th bits (the 32-bit word at w + 2) added
 * as 16 through mask registers. About half the instructions of fifth_bits + nibbles32 + widen, whose count bounded a
 * decode GEMV: 4864x896 cold, one row, 0.160 -> 0.135 ms (interleaved A/B, the same sums bit for bit). A 512-bit
 * dot per block was no faster for one row and slower for 8 (Zen 4 splits 512-bit ops in two). */
static inline void q5_0_codes(const uint8_t *w, __m256i *lo, __m256i *hi) {
    uint32_t bits;
    memcpy(&bits, w + 2, 4);
    const __m256i sixteen = _mm256_set1_epi16(16);
    __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + 6)));
    __m256i l = _mm256_and_si256(v, _mm256_set1_epi16(0x0F)), h = _mm256_srli_epi16(v, 4);
    *lo = _mm256_sub_epi16(_mm256_mask_add_epi16(l, (__mmask16)bits, l, sixteen), sixteen);
    *hi = _mm256_sub_epi16(_mm256_mask_add_epi16(h, (__mmask16)(bits >> 16), h, sixteen), sixteen);
}
#endif

/* 32 signed int8 codes -> their two halves as int16 */
static inline void widen(__m256i q8, __m256i *lo, __m256i *hi) {
    *lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q8));
    *hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q8, 1));
}

/* Inlined with M a constant 1..CHUNK_M (row_dot_chunk): the accumulators then stay in registers; a loop over a
 * runtime M kept them in memory, a store-to-load chain per block that halved the speed. */
static inline __attribute__((always_inline)) void row_dot_simd(int type, const uint8_t *w, int64_t K, const int M,
                                                               const int16_t *xq, const float *xd, const int32_t *xs,
                                                               float *acc) {
    int64_t nb32 = K / 32;
    __m256 a[CHUNK_M];
    for (int m = 0; m < M; m++) a[m] = _mm256_setzero_ps();
    const __m256i zero = _mm256_setzero_si256();
    if (type == Q5_0 || type == Q8_0) {
        int bytes = type == Q5_0 ? 22 : 34;
        for (int64_t b = 0; b < nb32; b++, w += bytes) {
            float d = f16c(w);
            __m256i q0, q1;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
            if (type == Q5_0)
                q5_0_codes(w, &q0, &q1);
            else
                widen(_mm256_loadu_si256((const __m256i *)(w + 2)), &q0, &q1);
#else
            widen(type == Q8_0 ? _mm256_loadu_si256((const __m256i *)(w + 2))
                               : _mm256_sub_epi8(_mm256_or_si256(nibbles32(w + 6), fifth_bits(w + 2)),
                                                 _mm256_set1_epi8(16)), &q0, &q1);
#endif
            for (int m = 0; m < M; m++) {
                const int16_t *xr = xq + (int64_t)m * K + b * 32;
                __m256i s = madd16(madd16(zero, q0, xr), q1, xr + 16);
                a[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * xd[m * nb32 + b]), a[m]);
            }
        }
    } else if (type == Q4_K) {
        const __m256i low = _mm256_set1_epi8(0x0F);
        for (int64_t sb = 0; sb < K / 256; sb++, w += 144) {
            float d = f16c(w), dmin = f16c(w + 2);
            float dl[8], ml[8];
            for (int j = 0; j < 8; j++) {
                int sc, mm;
                k_scale_min(j, w + 4, &sc, &mm);
                dl[j] = d * (float)sc;
                ml[j] = dmin * (float)mm;
            }
            const uint8_t *ql = w + 16;
            for (int g = 0; g < 4; g++, ql += 32) {  /* 64 weights: low nibbles are group 2g, high ones 2g+1 */
                __m256i v = _mm256_loadu_si256((const __m256i *)ql), q[4];
                widen(_mm256_and_si256(v, low), &q[0], &q[1]);
                widen(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), &q[2], &q[3]);
                int j = 2 * g;
                for (int m = 0; m < M; m++) {
                    const int16_t *xr = xq + (int64_t)m * K + sb * 256 + 64 * g;
                    const float *xdr = xd + m * nb32 + sb * 8 + j;
                    __m256i s0 = madd16(madd16(zero, q[0], xr), q[1], xr + 16);
                    __m256i s1 = madd16(madd16(zero, q[2], xr + 32), q[3], xr + 48);
                    a[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(dl[j] * xdr[0]), a[m]);
                    a[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(dl[j + 1] * xdr[1]), a[m]);
                }
            }
            /* the mins, sum_j ml[j] xd[j] xs[j] over the 8 groups: one vector per row and superblock into the lanes
             * hsum adds up anyway (it was 8 scalar products per row per 64 weights: Q4_K M=8 cost 4.8x M=1) */
            __m256 mlv = _mm256_loadu_ps(ml);
            for (int m = 0; m < M; m++) {
                __m256 xsd = _mm256_mul_ps(_mm256_loadu_ps(xd + m * nb32 + sb * 8),
                                           _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(xs + m * nb32
                                                                                                  + sb * 8))));
                a[m] = _mm256_fnmadd_ps(mlv, xsd, a[m]);
            }
        }
    } else {  /* Q6_K: 6-bit codes (-32..31), one int8 scale per 16 weights */
        const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
        for (int64_t sb = 0; sb < K / 256; sb++, w += 210) {
            const int8_t *sc = (const int8_t *)(w + 192);
            float d = f16c(w + 208);
            for (int half = 0; half < 2; half++) {
                const uint8_t *ql = w + 64 * half, *qh = w + 128 + 32 * half;
                __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
                __m256i h = _mm256_loadu_si256((const __m256i *)qh);
                __m256i lo4[4] = {_mm256_and_si256(l0, low), _mm256_and_si256(l1, low),
                                  _mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                                  _mm256_and_si256(_mm256_srli_epi16(l1, 4), low)};
                for (int k = 0; k < 4; k++) {  /* element 32k + l of this half: bits 2k..2k+1 of qh[l] on top */
                    __m256i hi2 = _mm256_and_si256(_mm256_srli_epi16(h, 2 * k), two);
                    __m256i q8 = _mm256_sub_epi8(_mm256_or_si256(lo4[k], _mm256_slli_epi16(hi2, 4)), off);
                    __m256i q0, q1;
                    widen(q8, &q0, &q1);
                    int j = 4 * half + k;  /* the 32-group of the superblock: scales sc[2j] (first 16), sc[2j+1] */
                    /* the int8 sub-block scales go onto the codes once for all rows (|q sc| <= 32 * 128 fits int16;
                     * a lane's two pairs with x stay under 2 * 2 * 4096 * 32767 < 2^31): then one int32 sum per 32
                     * and one scaling per row, where two were (Q6_K M=8 was 4.1x M=1) */
                    q0 = _mm256_mullo_epi16(q0, _mm256_set1_epi16(sc[2 * j]));
                    q1 = _mm256_mullo_epi16(q1, _mm256_set1_epi16(sc[2 * j + 1]));
                    for (int m = 0; m < M; m++) {
                        const int16_t *xr = xq + (int64_t)m * K + sb * 256 + 32 * j;
                        __m256i s = madd16(madd16(zero, q0, xr), q1, xr + 16);
                        __m256 scale = _mm256_set1_ps(d * xd[m * nb32 + sb * 8 + j]);
                        a[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, a[m]);
                    }
                }
            }
        }
    }
    for (int m = 0; m < M; m++) acc[m] = hsum(a[m]);
}

/* xq, xd, xs and acc point at the chunk's first row of x; K and nb32 stay the whole row's */
static void row_dot_chunk(int type, const uint8_t *w, int64_t K, int M, const int16_t *xq, const float *xd,
                          const int32_t *xs, float *acc) {
    switch (M) {
#define CASE(n) case n: row_dot_simd(type, w, K, n, xq, xd, xs, acc); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
}
#else
#define SIMD_TYPES(t) 0
static void row_dot_chunk(int type, const uint8_t *w, int64_t K, int M, const int16_t *xq, const float *xd,
                          const int32_t *xs, float *acc) {
    row_dot(type, w, K, M, xq, xd, xs, acc);
}
#endif

/* x -> int16 per 32: d = amax / 32767, q = round-to-nearest-even(x / d) (lrintf's rounding), s = sum of q */
static inline void quantize_block(const float *xb, int16_t *q, float *d_out, int32_t *s_out) {
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    /* 8 lanes at a time, the same values as the scalar loop below (max_ps(|x|, acc) passes over a NaN as fmaxf does,
     * cvtps rounds to nearest even as lrintf does in the default mode): per call the scalar loop was a few us of a
     * small matrix's ~10 */
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(xb + 8 * k);
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), m);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    float d = amax / 32767.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    __m256i sum = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        __m256i qi = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
#if defined(__AVX512F__) && defined(__AVX512VL__)
        __m128i q16 = _mm256_cvtepi32_epi16(qi);  /* truncating, as the (int16_t) cast below */
        _mm_storeu_si128((__m128i *)(q + 8 * k), q16);
#else
        int32_t lanes[8];
        _mm256_storeu_si256((__m256i *)lanes, qi);
        for (int j = 0; j < 8; j++) q[8 * k + j] = (int16_t)lanes[j];  /* lrintf's value, then the same narrowing */
        __m128i q16 = _mm_loadu_si128((const __m128i *)(q + 8 * k));
#endif
        sum = _mm256_add_epi32(sum, _mm256_cvtepi16_epi32(q16));
    }
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    *d_out = d;
    *s_out = _mm_cvtsi128_si32(t);
#else
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
    float d = amax / 32767.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) {
        q[j] = (int16_t)lrintf(xb[j] * id);
        s += q[j];
    }
    *d_out = d;
    *s_out = s;
#endif
}

/* 1 where a type has a vectorized kernel in this build (the others run, correctly, at scalar speed) */
int bolt_gguf_matmul_fast(int type) { return SIMD_TYPES(type) ? 1 : 0; }

static int supported(int type, int64_t K) {
    switch (type) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: return K % 32 == 0;
    case Q4_K: case Q5_K: case Q6_K: return K % 256 == 0;
    default: return 0;
    }
}

static int64_t row_bytes(int type, int64_t K) {
    switch (type) {
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

/* y [M, sum N_p] = x [M, K] @ [W_0; W_1; ...]^T for n_parts weights side by side (q|k|v, gate|up), each [N_p, K]
 * in its own GGUF type at w[p]: one call and one quantization of x for layers whose parts differ in type, the parts'
 * bytes read where they lie (the GGUF mmap). scalar: the portable loops even where a vectorized kernel exists
 * (tests compare the two). Returns 0, or -1 for an unsupported type, a K that isn't whole blocks, M outside
 * 1..MAX_M, or no memory. */
int bolt_gguf_matmul_parts(int n_parts, const int *types, const uint8_t *const *w, const int64_t *N, int64_t K,
                           const float *x, int64_t M, float *y, int n_threads, int scalar) {
    if (n_parts < 1 || M < 1 || M > MAX_M) return -1;
    int64_t n_total = 0;
    for (int p = 0; p < n_parts; p++) {
        if (!supported(types[p], K) || N[p] < 0) return -1;
        n_total += N[p];
    }
    int64_t nb32 = K / 32;
    int16_t *xq = malloc(sizeof(int16_t) * (size_t)(M * K));
    float *xd = malloc(sizeof(float) * (size_t)(M * nb32));
    int32_t *xs = malloc(sizeof(int32_t) * (size_t)(M * nb32));
    if (!xq || !xd || !xs) {
        free(xq); free(xd); free(xs);
        return -1;
    }
    for (int64_t i = 0; i < M * nb32; i++) quantize_block(x + i * 32, xq + i * 32, xd + i, xs + i);
    #pragma omp parallel num_threads(n_threads)
    {
        int64_t off = 0;
        for (int p = 0; p < n_parts; p++) {
            int type = types[p];
            int64_t rb = row_bytes(type, K);
            const uint8_t *wp = w[p];
            #pragma omp for schedule(static) nowait
            for (int64_t n = 0; n < N[p]; n++) {
                float acc[MAX_M];
                if (SIMD_TYPES(type) && !scalar) {
                    for (int64_t m0 = 0; m0 < M; m0 += CHUNK_M)  /* the weight row stays in L1 across chunks */
                        row_dot_chunk(type, wp + n * rb, K, (int)(M - m0 < CHUNK_M ? M - m0 : CHUNK_M), xq + m0 * K,
                                      xd + m0 * nb32, xs + m0 * nb32, acc + m0);
                } else {
                    row_dot(type, wp + n * rb, K, (int)M, xq, xd, xs, acc);
                }
                for (int64_t m = 0; m < M; m++) y[m * n_total + off + n] = acc[m];
            }
            off += N[p];
        }
    }
    free(xq); free(xd); free(xs);
    return 0;
}

/* One weight: the parts call with one part. */
int bolt_gguf_matmul(int type, const uint8_t *w, int64_t N, int64_t K, const float *x, int64_t M, float *y,
                     int n_threads, int scalar) {
    return bolt_gguf_matmul_parts(1, &type, &w, &N, K, x, M, y, n_threads, scalar);
}
