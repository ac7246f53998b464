/* q8_matmul: levels, type predicates, and the SIMD building blocks (unpacking nibbles and fifth bits, u8 x s8 and
 * int16 dot products, horizontal sums).
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order. */
#ifndef BOLT_Q8_COMMON_H
#define BOLT_Q8_COMMON_H

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
/* rows per rows-as-lanes chunk: 8, the usual verify block; 16 rows are two chunks over one unpacked row. A zmm of 16
 * rows was slower for 8 rows on a Zen 5 EPYC (Q5_0 4864x896, 1 thread: 0.70 vs 0.55 ms): half its lanes idle. With
 * AVX-512 a zmm instead holds two weight rows (PAIR): lane 2l is x row l times weight row A, lane 2l + 1 the same x
 * row times row B, so one vpdpbusd does 64 multiply-adds for the same two loads (a broadcast 8-byte group of both
 * rows' codes, and x's group with each row twice) that a ymm spends on 32. */
#define LANES 8
#if defined(SIMD) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define PAIR 1
#define DUP 2
#else
#define DUP 1
#endif
#define XLANES (LANES * DUP)
/* weight units (a row, or a pair with PAIR) the rows-as-lanes product takes at once (q8_rows.h) */
#define NU 4  /* int32 lanes of one x group in the rows-as-lanes layout */
/* one row, Q4_0 / Q5_0: blocks whose nibble halves one instruction takes side by side (a ymm: 2, a zmm: 4) */
#ifdef PAIR
#define NIBG 4
#else
#define NIBG 2
#endif

/* the tiles this level reads (gguf_blocks.h): 16 rows with AVX-512 (a zmm's lanes), 8 on AVX2 / AVX-VNNI */
#ifdef PAIR
#define TILE_AT TILED
#elif defined(SIMD)
#define TILE_AT TILED8
#else
#define TILE_AT (-1000)  /* none */
#endif
/* a tiled type of this level (TILE_AT + Q4_0, Q5_0, Q4_K or Q6_K); is_k takes its GGUF type */
static int tiled(int t) {
    return t == TILE_AT + Q4_0 || t == TILE_AT + Q5_0 || t == TILE_AT + Q4_K || t == TILE_AT + Q6_K;
}
static int is_k(int t) {
    t &= 255;
    return t == Q4_K || t == Q5_K || t == Q6_K;
}
static int has_min(int t) { return t == Q4_1 || t == Q5_1 || t == Q4_K || t == Q5_K; }
static int sub_len(int t) { return t == Q6_K ? 16 : 32; }  /* K-quants: weights per integer sub-block scale */
static int block_len(int t) { return is_k(t) ? 256 : 32; }

/* two int16 in one int32 (lo in the low half): the operand of vpmaddwd over pairs of sub-blocks */
static inline int32_t pair16(int32_t lo, int32_t hi) {
    return (int32_t)((uint32_t)(uint16_t)lo | ((uint32_t)(uint16_t)hi << 16));
}


#ifdef SIMD
static inline float f16c(const uint8_t *p) { return _cvtsh_ss((uint16_t)(p[0] | (p[1] << 8))); }

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

/* Q6_K: the 128 6-bit codes (0..63) of half `half` (0, 1) of the superblock at w, as 4 vectors of 32 (elements
 * 128 half + 32 k + l: the low 4 bits from ql, bits 2k..2k+1 of qh[l] on top) */
static inline __attribute__((always_inline)) void q6_k_codes(const uint8_t *w, int half, __m256i u[4]) {
    const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
    const uint8_t *ql = w + 64 * half, *qh = w + 128 + 32 * half;
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    __m256i lo4[4] = {_mm256_and_si256(l0, low), _mm256_and_si256(l1, low),
                      _mm256_and_si256(_mm256_srli_epi16(l0, 4), low), _mm256_and_si256(_mm256_srli_epi16(l1, 4), low)};
    for (int k = 0; k < 4; k++)
        u[k] = _mm256_or_si256(lo4[k], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k), two), 4));
}

#endif /* SIMD */


/* Q8_0's codes are signed: with VNNI they go in as q + 128 (off 128; vpdpbusd does not saturate), while AVX2's
 * vpmaddubsw would saturate on 255 * 127 * 2, so there they are multiplied signed (|q| times x with q's sign) */
#ifdef VNNI
#define SIGNED_Q8 0
#else
#define SIGNED_Q8 1
#endif

#endif
