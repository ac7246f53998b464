/* q8_matmul: a verify block or a short prefill chunk (2..32 rows of x) against 8 weight rows (Q4_0, Q5_0, Q8_0,
 * Q4_K, Q6_K) at once, weight rows as the lanes of a ymm: the AVX2 and AVX-VNNI levels' form of
 * q8_rows16.h (which the AVX-512 levels take, with the reasons). 8 rows' blocks are transposed in registers, x's 4
 * bytes of a group are a broadcast load, and one float tail per row of x serves 8 weight rows. Products: vpdpbusd with
 * AVX-VNNI; on AVX2 vpmaddubsw, four groups summed in int16 (Q4_0 / Q5_0 codes <= 31: 4 * 2 * 31 * 127 < 2^15), then
 * vpmaddwd; Q8_0's signed codes as |q| times x with q's sign (q8_common.h's dot_ss), each group widened at once.
 * Each lane is one (x row, weight row) product in the one float order of q8_matmul.c: the portable loop's bits.
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order. */
#ifndef BOLT_Q8_ROWS8_H
#define BOLT_Q8_ROWS8_H

#if defined(SIMD) && !defined(PAIR)

/* r[i]: 8 dwords of row i -> T[k]: dword k of the 8 rows (lane = row) */
static inline void t8_8(const __m256i r[8], __m256i T[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);      /* [a0 b0 a1 b1 | a4 b4 a5 b5] */
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);  /* [a2 b2 a3 b3 | a6 b6 a7 b7] */
    }
    for (int h = 0; h < 2; h++)  /* rows 4h..4h+3: dwords {0, 4}, {1, 5}, {2, 6}, {3, 7} */
        for (int j = 0; j < 2; j++) {
            u[4 * h + 2 * j] = _mm256_unpacklo_epi64(t[4 * h + j], t[4 * h + 2 + j]);
            u[4 * h + 2 * j + 1] = _mm256_unpackhi_epi64(t[4 * h + j], t[4 * h + 2 + j]);
        }
    for (int k = 0; k < 4; k++) {  /* u[k]: rows 0..3 of dwords k | k + 4; u[4 + k]: rows 4..7 */
        T[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        T[k + 4] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

/* bits 4k..4k+3 of each lane's qh -> 0x10 in the bytes of the group's 4 codes */
static inline __m256i fifth8(__m256i h, int k) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                            0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i bit = _mm256_set1_epi32(0x08040201);
    __m256i b = _mm256_shuffle_epi8(_mm256_srli_epi32(h, 4 * k), spread);  /* each lane's low byte, 4 times */
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit), _mm256_set1_epi8(0x10));
}

/* 8 lanes' fp16 at the low (hi = 0) or high half of v -> floats */
static inline __m256 half8(__m256i v, int hi) {
    v = hi ? _mm256_srli_epi32(v, 16) : _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

/* 16 bytes at p[r] + o for the 8 rows -> T[d]: dword d of every row (lane = row); the scales and qh come this way
 * rather than by a gather (q8_rows16.h's t16_4 says why) */
static inline void t8_4(const uint8_t *const p[8], int64_t o, __m256i T[4]) {
    __m256i a[4], t0[4];
    for (int i = 0; i < 4; i++)  /* [row i | row i + 4], 4 dwords each */
        a[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p[i] + o))),
                                       _mm_loadu_si128((const __m128i *)(p[i + 4] + o)), 1);
    t0[0] = _mm256_unpacklo_epi32(a[0], a[1]);
    t0[1] = _mm256_unpackhi_epi32(a[0], a[1]);
    t0[2] = _mm256_unpacklo_epi32(a[2], a[3]);
    t0[3] = _mm256_unpackhi_epi32(a[2], a[3]);
    T[0] = _mm256_unpacklo_epi64(t0[0], t0[2]);  /* dword 0 of rows 0..3 | 4..7 */
    T[1] = _mm256_unpackhi_epi64(t0[0], t0[2]);
    T[2] = _mm256_unpacklo_epi64(t0[1], t0[3]);
    T[3] = _mm256_unpackhi_epi64(t0[1], t0[3]);
}

/* block b of the 8 rows (p: their first bytes) -> W[k] (codes 4k..4k+3 of every row; unsigned, AVX2's
 * Q8_0 signed), dw: the rows' scales */
static inline __attribute__((always_inline)) void w8_block(int t, const uint8_t *const p[8], int64_t b, __m256i W[8],
                                                          __m256 *dw) {
    const int bytes = t == Q4_0 ? 18 : t == Q5_0 ? 22 : 34;
    const int64_t o = bytes * b;
    __m256i H[4];  /* the block's first 16 bytes: d (fp16) in dword 0's low half, Q5_0's qh after it */
    t8_4(p, o, H);
    *dw = half8(H[0], 0);
    if (t == Q8_0) {
        __m256i r[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(p[i] + o + 2));
        t8_8(r, W);
        if (!SIGNED_Q8)  /* VNNI: signed codes as q + 128 (off 128) */
            for (int k = 0; k < 8; k++) W[k] = _mm256_xor_si256(W[k], _mm256_set1_epi8((char)0x80));
        return;
    }
    __m256i T[4];
    t8_4(p, o + (t == Q4_0 ? 2 : 6), T);
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int k = 0; k < 4; k++) {  /* byte j holds code j (low nibble) and code j + 16 (high) */
        W[k] = _mm256_and_si256(T[k], low);
        W[k + 4] = _mm256_and_si256(_mm256_srli_epi32(T[k], 4), low);
    }
    if (t == Q5_0) {  /* code c's fifth bit is bit c of qh */
        __m256i h = _mm256_or_si256(_mm256_srli_epi32(H[0], 16), _mm256_slli_epi32(H[1], 16));  /* bytes 2..5 */
        for (int k = 0; k < 8; k++) W[k] = _mm256_or_si256(W[k], fifth8(h, k));
    }
}

/* isum of one row of x (its 32 bytes at x) against W, from a (the offset's term) */
static inline __attribute__((always_inline)) __m256i dot8(int t, const __m256i W[8], const __m256i A[8],
                                                         const int8_t *x, __m256i a) {
#ifdef VNNI
    (void)t, (void)A;
    for (int k = 0; k < 8; k++) a = dot_us(a, W[k], _mm256_set1_epi32(ld32(x + 4 * k)));
    return a;
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (t == Q8_0) {  /* |q| (A) times x with q's sign: a pair reaches 2 * 128 * 127, widened per group */
        for (int k = 0; k < 8; k++)
            a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(
                    A[k], _mm256_sign_epi8(_mm256_set1_epi32(ld32(x + 4 * k)), W[k])), ones));
        return a;
    }
    for (int h = 0; h < 2; h++) {  /* four groups in int16, then widened */
        __m256i s = _mm256_maddubs_epi16(W[4 * h], _mm256_set1_epi32(ld32(x + 16 * h)));
        for (int k = 1; k < 4; k++)
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(W[4 * h + k], _mm256_set1_epi32(ld32(x + 16 * h + 4 * k))));
        a = _mm256_add_epi32(a, _mm256_madd_epi16(s, ones));
    }
    return a;
#endif
}

/* a lane's int32 scale s as the int16 pair (s, s): vpmaddwd of int16 sums with it is their sum times s */
static inline __m256i pair_of(__m256i s) {
    return _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(s, 16));
}

/* sub-block sum of n4 groups of codes c against x's groups at x, times the lanes' scale (sc: int32; sc16: as pairs).
 * AVX2: the groups' vpmaddubsw pairs summed in int16 in runs of `run` (codes <= 15: 8; <= 63: 2), then vpmaddwd
 * with the scale pair. */
static inline __attribute__((always_inline)) __m256i sub8(const __m256i *c, const int8_t *x, int n4, int run,
                                                         __m256i sc, __m256i sc16) {
#ifdef VNNI
    (void)run, (void)sc16;
    __m256i s = _mm256_setzero_si256();
    for (int k = 0; k < n4; k++) s = dot_us(s, c[k], _mm256_set1_epi32(ld32(x + 4 * k)));
    return _mm256_mullo_epi32(s, sc);
#else
    (void)sc;
    __m256i a = _mm256_setzero_si256();
    for (int k0 = 0; k0 < n4; k0 += run) {
        __m256i s = _mm256_maddubs_epi16(c[k0], _mm256_set1_epi32(ld32(x + 4 * k0)));
        for (int k = k0 + 1; k < k0 + run; k++)
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(c[k], _mm256_set1_epi32(ld32(x + 4 * k))));
        a = _mm256_add_epi32(a, _mm256_madd_epi16(s, sc16));
    }
    return a;
#endif
}

/* 32 bytes at p[r] + o for the 8 rows -> T[k]: dword k of every row (lane = row) */
static inline void t8_8p(const uint8_t *const p[8], int64_t o, __m256i T[8]) {
    __m256i r[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(p[i] + o));
    t8_8(r, T);
}

static inline __m256 tree8y(const __m256 p[8]) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3])),
                         _mm256_add_ps(_mm256_add_ps(p[4], p[5]), _mm256_add_ps(p[6], p[7])));
}

/* block b's codes W (8 weight rows as lanes) and scales dw of a 32-block type for every row of x: out[m * stride] */
static inline __attribute__((always_inline)) void lanes_dots8(int t, const __m256i W[8], __m256 dw, int64_t b,
                                                           int64_t K, int64_t M, const XQ *xq, __m256 *out,
                                                           int stride) {
    const int off = t == Q4_0 ? 8 : t == Q5_0 ? 16 : SIGNED_Q8 ? 0 : 128;
    __m256i A[8];
    for (int k = 0; k < 8; k++) A[k] = t == Q8_0 ? _mm256_abs_epi8(W[k]) : W[k];
    for (int m = 0; m < M; m++) {
        __m256i isum = dot8(t, W, A, xq->q + m * K + 32 * b, _mm256_set1_epi32(-off * xq->s32[m * xq->n32p + b]));
        __m256 dx = _mm256_set1_ps(xq->d[m * xq->nbp + b]);
        out[m * stride] = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx));
    }
}

/* block b of a 32-block type for every row of x: p[m] (lanes: the 8 weight rows) */
static inline __attribute__((always_inline)) void lanes_legacy(int t, const uint8_t *const p[8], int64_t b, int64_t K,
                                                           int64_t M, const XQ *xq, __m256 *out, int stride) {
    __m256i W[8];
    __m256 dw;
    w8_block(t, p, b, W, &dw);
    lanes_dots8(t, W, dw, b, K, M, xq, out, stride);
}

/* a tile's block tb (gguf_blocks.h): dword groups g0..g0+n-1 (lane = row) -> T; its rows' fp16 d -> floats */
static inline void tile_groups8(const uint8_t *tb, int g0, __m256i *T, int n) {
    for (int k = 0; k < n; k++) T[k] = _mm256_loadu_si256((const __m256i *)(tb + 32 * (g0 + k)));
}

static inline __m256 tile_half8(const uint8_t *tb) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tb));
}

/* the vector width's part of q8_lanes.h: 8 lanes of a ymm */
#define LN 8
typedef __m256 lvf;
typedef __m256i lvi;
#define LVF_ZERO _mm256_setzero_ps()
#define LVF_ADD _mm256_add_ps
#define LVF_TREE tree8y
#define LVF_STORE_FIRST(y, R, v) \
    _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(R), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), v)
#define LVF_CVT _mm256_cvtepi32_ps
#define LVF_MUL _mm256_mul_ps
#define LVF_SET1 _mm256_set1_ps
#define LV_SET1 _mm256_set1_epi32
#define LV_SET1_8 _mm256_set1_epi8
#define LV_ZERO _mm256_setzero_si256()
#define LV_AND _mm256_and_si256
#define LV_OR _mm256_or_si256
#define LV_ADD _mm256_add_epi32
#define LV_SUB _mm256_sub_epi32
#define LV_SRLI _mm256_srli_epi32
#define LV_SLLI _mm256_slli_epi32
#define LV_SRAI _mm256_srai_epi32
#define LV_HALF half8
#define LV_T8 t8_8p
#define LV_T4 t8_4
#define LV_TILE_GROUPS tile_groups8  /* q8_tiles.h: this width reads tiles of 8 rows */
#define LV_TILE_HALF tile_half8
#define LV_MADD madd_acc
#define LV_PAIR pair_of
#define LV_SUB_DOT sub8
#endif

#endif
