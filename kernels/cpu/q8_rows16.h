/* q8_matmul: a verify block (2..8 rows of x) against 16 weight rows of a 32-block type (Q4_0, Q5_0, Q8_0) at once,
 * weight rows as lanes (the AVX-512 VNNI levels).
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order.
 *
 * Why: rows-as-lanes (q8_rows.h) stores each unpacked weight pair and broadcasts its codes from memory, one load per
 * vpdpbusd, and every pair pays its own float tail: ~18 instructions per weight row and block at 8 rows, a third of
 * them the unpack (Q5_0 4864x896, 1 thread: ~200 us of products, ~110 us of unpacking). Here 16 rows' blocks are
 * transposed in registers (vpermt2d) so that one zmm holds group k (4 codes) of all 16 rows; each x row's 4 bytes
 * come in as the instruction's own broadcast operand, so a vpdpbusd is one instruction, and a row of x's float tail
 * serves 16 weight rows: ~10 instructions per weight row and block. Each lane is one (x row, weight row) product
 * with the one float order of q8_matmul.c, so the bits equal the other paths'. */
#ifndef BOLT_Q8_ROWS16_H
#define BOLT_Q8_ROWS16_H

#ifdef PAIR

/* acc + w (unsigned codes) . the 4 signed bytes at x broadcast to every lane, as the instruction's own {1to16}
 * operand: GCC keeps _mm512_set1_epi32(load) a separate vpbroadcastd, an extra uop per product */
static inline __attribute__((always_inline)) __m512i dpbusd_b(__m512i acc, __m512i w, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x));
    return acc;
}

/* Z[i]: rows 4i..4i+3 x dwords 0..3 (lane 4r + d) -> T[d]: dword d of rows 0..15 (lane = row) */
static inline void t16_4x4(const __m512i Z[4], __m512i T[4]) {
    const __m512i ia = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
    const __m512i ib = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2);
    /* E: rows 0..7 (or 8..15) x dwords {0, 1} (or {2, 3}), lane 2r + j */
    __m512i e0 = _mm512_permutex2var_epi32(Z[0], ia, Z[1]);
    __m512i e1 = _mm512_permutex2var_epi32(Z[0], _mm512_add_epi32(ia, two), Z[1]);
    __m512i e2 = _mm512_permutex2var_epi32(Z[2], ia, Z[3]);
    __m512i e3 = _mm512_permutex2var_epi32(Z[2], _mm512_add_epi32(ia, two), Z[3]);
    T[0] = _mm512_permutex2var_epi32(e0, ib, e2);
    T[1] = _mm512_permutex2var_epi32(e0, _mm512_add_epi32(ib, one), e2);
    T[2] = _mm512_permutex2var_epi32(e1, ib, e3);
    T[3] = _mm512_permutex2var_epi32(e1, _mm512_add_epi32(ib, one), e3);
}

/* 16 bytes at p[4i + r] + o -> Z[i] (rows 4i..4i+3 x 4 dwords) */
static inline void load16x16(const uint8_t *const p[16], int64_t o, __m512i Z[4]) {
    for (int i = 0; i < 4; i++) {
        __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p[4 * i] + o)));
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p[4 * i + 1] + o)), 1);
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p[4 * i + 2] + o)), 2);
        Z[i] = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p[4 * i + 3] + o)), 3);
    }
}

/* 16 bytes at p[r] + o for the 16 rows -> T[d]: dword d of every row (lane = row). The blocks' scales and Q5_0's
 * qh come this way, not by vpgatherdd: a 16-lane gather takes ~22 cycles on a Zen 5, 16 loads and 8 permutes ~10,
 * and two gathers were a third of a Q5_0 block's time at 8 rows of x */
static inline void t16_4(const uint8_t *const p[16], int64_t o, __m512i T[4]) {
    __m512i Z[4];
    load16x16(p, o, Z);
    t16_4x4(Z, T);
}

/* 32 bytes at p[r] + o for the 16 rows -> T[k]: dword k of every row (lane = row) */
static inline void t16_8(const uint8_t *const p[16], int64_t o, __m512i T[8]) {
    /* Z[i]: rows 2i, 2i + 1 x 8 dwords; then A[j] / B[j]: rows 4j..4j+3 x dwords 0..3 / 4..7, as t16_4x4 takes */
    __m512i Z[8], A[4], B[4];
    for (int i = 0; i < 8; i++)
        Z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p[2 * i] + o))),
                                  _mm256_loadu_si256((const __m256i *)(p[2 * i + 1] + o)), 1);
    const __m512i ia = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i ib = _mm512_add_epi32(ia, _mm512_set1_epi32(4));
    for (int j = 0; j < 4; j++) {
        A[j] = _mm512_permutex2var_epi32(Z[2 * j], ia, Z[2 * j + 1]);
        B[j] = _mm512_permutex2var_epi32(Z[2 * j], ib, Z[2 * j + 1]);
    }
    t16_4x4(A, T);
    t16_4x4(B, T + 4);
}

/* Q5_0: code c's fifth bit is bit c of the lane's qh h: group k's 4 bits -> 0x10 in its bytes, by a table */
static inline __attribute__((always_inline)) void q5_fifth(__m512i W[8], __m512i h) {
    const __m512i lut = _mm512_setr_epi32(0, 0x10, 0x1000, 0x1010, 0x100000, 0x100010, 0x101000, 0x101010,
                                          0x10000000, 0x10000010, 0x10001000, 0x10001010, 0x10100000,
                                          0x10100010, 0x10101000, 0x10101010);
    for (int k = 0; k < 8; k++)
        W[k] = _mm512_or_si512(W[k], _mm512_permutexvar_epi32(_mm512_srli_epi32(h, 4 * k), lut));
}

/* a tile's block tb (gguf_blocks.h): dword groups g0..g0+n-1 (lane = row) -> T; its rows' fp16 d -> floats */
static inline void tile_groups(const uint8_t *tb, int g0, __m512i *T, int n) {
    for (int k = 0; k < n; k++) T[k] = _mm512_loadu_si512(tb + 64 * (g0 + k));
}

static inline __m512 tile_half(const uint8_t *tb) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tb));
}

/* block b of the 16 rows (p: their first bytes) -> W[k]: the unsigned codes 4k..4k+3 of
 * every row (lane = row), dw: the rows' scales */
static inline __attribute__((always_inline)) void w16_block(int t, const uint8_t *const p[16], int64_t b,
                                                           __m512i W[8], __m512 *dw) {
    const int bytes = t == Q4_0 ? 18 : t == Q5_0 ? 22 : 34;
    const int64_t o = bytes * b;
    __m512i H[4];  /* the block's first 16 bytes: d (fp16) in dword 0's low half, Q5_0's qh after it */
    t16_4(p, o, H);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(H[0]));
    if (t == Q8_0) {
        t16_8(p, o + 2, W);
        const __m512i flip = _mm512_set1_epi8((char)0x80);  /* signed codes as q + 128 (off 128) */
        for (int k = 0; k < 8; k++) W[k] = _mm512_xor_si512(W[k], flip);
        return;
    }
    __m512i Z[4], T[4];
    load16x16(p, o + (t == Q4_0 ? 2 : 6), Z);
    t16_4x4(Z, T);
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; k++) {  /* byte j holds code j (low nibble) and code j + 16 (high) */
        W[k] = _mm512_and_si512(T[k], low);
        W[k + 4] = _mm512_and_si512(_mm512_srli_epi32(T[k], 4), low);
    }
    if (t == Q5_0)  /* qh: bytes 2..5 */
        q5_fifth(W, _mm512_or_si512(_mm512_srli_epi32(H[0], 16), _mm512_slli_epi32(H[1], 16)));
}

/* block b's codes W (16 weight rows as lanes, unsigned: the signed code + off) and scales dw for every row of x:
 * out[m * stride] */
static inline __attribute__((always_inline)) void lanes_dots(int off, const __m512i W[8], __m512 dw, int64_t b,
                                                          int64_t K, int64_t M, const XQ *xq, __m512 *out,
                                                          int stride) {
    for (int m = 0; m < M; m++) {
        const int8_t *xb = xq->q + m * K + 32 * b;
        /* x's 4 bytes broadcast: one load each, no shuffle; two chains of 4 (the instruction's latency is 4
         * cycles, its throughput 2 a cycle; integer sums, so the split changes no bit) */
        __m512i i0 = _mm512_set1_epi32(-off * xq->s32[m * xq->n32p + b]), i1 = _mm512_setzero_si512();
        for (int k = 0; k < 8; k += 2) {
            i0 = dpbusd_b(i0, W[k], xb + 4 * k);
            i1 = dpbusd_b(i1, W[k + 1], xb + 4 * k + 4);
        }
        __m512i isum = _mm512_add_epi32(i0, i1);
        __m512 dx = _mm512_set1_ps(xq->d[m * xq->nbp + b]);
        out[m * stride] = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx));
    }
}

/* block b of a 32-block type for every row of x: p[m] (lanes: the 16 weight rows) */
static inline __attribute__((always_inline)) void lanes_legacy(int t, const uint8_t *const p[16], int64_t b,
                                                            int64_t K, int64_t M, const XQ *xq, __m512 *out,
                                                            int stride) {
    __m512i W[8];
    __m512 dw;
    w16_block(t, p, b, W, &dw);
    lanes_dots(t == Q4_0 ? 8 : t == Q5_0 ? 16 : 128, W, dw, b, K, M, xq, out, stride);
}

/* 16 lanes' fp16 in the low (hi = 0) or high half of v -> floats */
static inline __m512 half16(__m512i v, int hi) {
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hi ? _mm512_srli_epi32(v, 16) : v));
}

/* sub-block sum of n4 groups of codes c against x's groups at x, times the lanes' int32 scale sc (q8_lanes.h's
 * LV_SUB_DOT: the scale pair sc16 is AVX2's) */
static inline __attribute__((always_inline)) __m512i sub16(const __m512i *c, const int8_t *x, int n4, __m512i sc,
                                                          __m512i sc16) {
    (void)sc16;
    __m512i s = _mm512_setzero_si512();
    for (int k = 0; k < n4; k++) s = dpbusd_b(s, c[k], x + 4 * k);
    return _mm512_mullo_epi32(s, sc);
}

/* the vector width's part of q8_lanes.h: 16 lanes of a zmm */
#define LN 16
typedef __m512 lvf;
typedef __m512i lvi;
#define LVF_ZERO _mm512_setzero_ps()
#define LVF_ADD _mm512_add_ps
#define LVF_TREE tree8v
#define LVF_STORE_FIRST(y, R, v) _mm512_mask_storeu_ps(y, (__mmask16)((1u << (R)) - 1), v)  /* lanes < R */
#define LVF_CVT _mm512_cvtepi32_ps
#define LVF_MUL _mm512_mul_ps
#define LVF_SET1 _mm512_set1_ps
#define LV_SET1 _mm512_set1_epi32
#define LV_SET1_8 _mm512_set1_epi8
#define LV_ZERO _mm512_setzero_si512()
#define LV_AND _mm512_and_si512
#define LV_OR _mm512_or_si512
#define LV_ADD _mm512_add_epi32
#define LV_SUB _mm512_sub_epi32
#define LV_SRLI _mm512_srli_epi32
#define LV_SLLI _mm512_slli_epi32
#define LV_SRAI _mm512_srai_epi32
#define LV_HALF half16
#define LV_T8 t16_8
#define LV_T4 t16_4
#define LV_TILE_GROUPS tile_groups  /* q8_tiles.h: this width reads tiles */
#define LV_TILE_HALF tile_half
#define LV_MADD _mm512_dpwssd_epi32
#define LV_PAIR(s) (s)  /* VNNI: sub-block sums times the int32 scale (vpmulld) */
#define LV_SUB_DOT(c, x, n4, run, sc, sc16) sub16(c, x, n4, sc, sc16)
#endif /* PAIR */

#endif
