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

/* block b of the 16 rows (p: their first bytes, lane offsets vo = row * rb) -> W[k]: the unsigned codes 4k..4k+3 of
 * every row (lane = row), dw: the rows' scales */
static inline __attribute__((always_inline)) void w16_block(int t, const uint8_t *const p[16], const uint8_t *w,
                                                           __m512i vo, int64_t b, __m512i W[8], __m512 *dw) {
    const int bytes = t == Q4_0 ? 18 : t == Q5_0 ? 22 : 34;
    const int64_t o = bytes * b;
    __m512i d32 = _mm512_i32gather_epi32(vo, (const void *)(w + o), 1);  /* the fp16 scale in each low half */
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32));
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
    if (t == Q5_0) {  /* code c's fifth bit is bit c of qh: group k's 4 bits -> 0x10 in its bytes, by a table */
        const __m512i lut = _mm512_setr_epi32(0, 0x10, 0x1000, 0x1010, 0x100000, 0x100010, 0x101000, 0x101010,
                                              0x10000000, 0x10000010, 0x10001000, 0x10001010, 0x10100000,
                                              0x10100010, 0x10101000, 0x10101010);
        __m512i h = _mm512_i32gather_epi32(vo, (const void *)(w + o + 2), 1);
        for (int k = 0; k < 8; k++)
            W[k] = _mm512_or_si512(W[k], _mm512_permutexvar_epi32(_mm512_srli_epi32(h, 4 * k), lut));
    }
}

/* block b of a 32-block type for every row of x: p[m] (lanes: the 16 weight rows) */
static inline __attribute__((always_inline)) void lanes_legacy(int t, const uint8_t *const p[16], const uint8_t *w,
                                                            __m512i vo, int64_t b, int64_t K, int64_t M,
                                                            const XQ *xq, __m512 *out, int stride) {
    const int off = t == Q4_0 ? 8 : t == Q5_0 ? 16 : 128;
    __m512i W[8];
    __m512 dw;
    w16_block(t, p, w, vo, b, W, &dw);
    for (int m = 0; m < M; m++) {
        const int8_t *xb = xq->q + m * K + 32 * b;
        __m512i isum = _mm512_set1_epi32(-off * xq->s32[m * xq->n32p + b]);
        for (int k = 0; k < 8; k++)  /* x's 4 bytes broadcast: one load each, no shuffle */
            isum = _mm512_dpbusd_epi32(isum, W[k], _mm512_set1_epi32(ld32(xb + 4 * k)));
        __m512 dx = _mm512_set1_ps(xq->d[m * xq->nbp + b]);
        out[m * stride] = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx));
    }
}

/* byte q of every lane of v as int32 (shift 8q, mask) */
static inline __m512i byte_lane(__m512i v, int q) {
    return _mm512_and_si512(_mm512_srli_epi32(v, 8 * q), _mm512_set1_epi32(0xFF));
}

/* bytes 2q, 2q + 1 of every lane of v as two int16 (lo, hi): the pair vpdpwssd takes */
static inline __m512i byte_pair16(__m512i v, int q) {
    __m512i u = _mm512_srli_epi32(v, 16 * q);
    return _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32(0xFF)),
                           _mm512_and_si512(_mm512_slli_epi32(u, 8), _mm512_set1_epi32(0xFF0000)));
}

/* Q4_K superblock b for every row of x: p[m]. Sub-block j's integer sum times its 6-bit scale (vpmulld per pair of
 * sub-blocks and row of x), the mins through x's sums per 32 in int16 pairs (vpdpwssd), as k_block's lanes do. */
static inline __attribute__((always_inline)) void lanes_q4k(const uint8_t *const p[16], const uint8_t *w, __m512i vo,
                                                         int64_t b, int64_t K, int64_t M, const XQ *xq,
                                                         __m512 *out, int stride) {
    const uint8_t *wb = w + 144 * b;
    __m512i d32 = _mm512_i32gather_epi32(vo, (const void *)wb, 1);  /* d | dmin */
    __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32));
    __m512 mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d32, 16)));
    /* the 12 scale bytes as k_scale_min reads them, 4 at a time per lane (q4k_scale_bytes, in vectors) */
    __m512i u0 = _mm512_i32gather_epi32(vo, (const void *)(wb + 4), 1);
    __m512i u1 = _mm512_i32gather_epi32(vo, (const void *)(wb + 8), 1);
    __m512i u2 = _mm512_i32gather_epi32(vo, (const void *)(wb + 12), 1);
    const __m512i m6 = _mm512_set1_epi32(0x3F3F3F3F), m4 = _mm512_set1_epi32(0x0F0F0F0F);
    const __m512i top = _mm512_set1_epi32(0x30303030);
    __m512i sc4[2] = {_mm512_and_si512(u0, m6),
                      _mm512_or_si512(_mm512_and_si512(u2, m4), _mm512_and_si512(_mm512_srli_epi32(u0, 2), top))};
    __m512i mn4[2] = {_mm512_and_si512(u1, m6),
                      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
                                      _mm512_and_si512(_mm512_srli_epi32(u1, 2), top))};
    __m512i SC[8], MNP[4], isum[MAX_M];
    for (int j = 0; j < 8; j++) SC[j] = byte_lane(sc4[j / 4], j % 4);
    for (int i = 0; i < 4; i++) MNP[i] = byte_pair16(mn4[i / 2], i % 2);
    for (int m = 0; m < M; m++) isum[m] = _mm512_setzero_si512();
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int g = 0; g < 4; g++) {  /* 32 bytes: sub-block 2g in the low nibbles, 2g + 1 in the high ones */
        __m512i T[8], lo[8], hi[8];
        t16_8(p, 144 * b + 16 + 32 * g, T);
        for (int k = 0; k < 8; k++) {
            lo[k] = _mm512_and_si512(T[k], low);
            hi[k] = _mm512_and_si512(_mm512_srli_epi32(T[k], 4), low);
        }
        for (int m = 0; m < M; m++) {
            const int8_t *x = xq->q + m * K + 256 * b + 64 * g;
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            for (int k = 0; k < 8; k++) {
                s0 = _mm512_dpbusd_epi32(s0, lo[k], _mm512_set1_epi32(ld32(x + 4 * k)));
                s1 = _mm512_dpbusd_epi32(s1, hi[k], _mm512_set1_epi32(ld32(x + 32 + 4 * k)));
            }
            isum[m] = _mm512_add_epi32(isum[m], _mm512_add_epi32(_mm512_mullo_epi32(s0, SC[2 * g]),
                                                                 _mm512_mullo_epi32(s1, SC[2 * g + 1])));
        }
    }
    for (int m = 0; m < M; m++) {
        const int16_t *h = xq->h32 + m * (K / 32) + 8 * b;
        __m512i jsum = _mm512_setzero_si512();
        for (int i = 0; i < 4; i++) jsum = _mm512_dpwssd_epi32(jsum, MNP[i], _mm512_set1_epi32(ld32(h + 2 * i)));
        __m512 dx = _mm512_set1_ps(xq->d[m * xq->nbp + b]);
        __m512 pb = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[m]), _mm512_mul_ps(dw, dx));
        out[m * stride] = _mm512_add_ps(pb, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(),
                                                                                            jsum)),
                                                          _mm512_mul_ps(mw, dx)));
    }
}

/* Q6_K superblock b for every row of x: p[m]. Per half, ql's two 32-byte runs and qh's are transposed, and the 4
 * kinds of codes (q6_k_codes' order) built from them; each sub-block of 16 times its int8 scale (vpmulld), the
 * codes' offset 32 through x's sums per 16 and the scales in int16 pairs (vpdpwssd), as k_block's lanes do. */
static inline __attribute__((always_inline)) void lanes_q6k(const uint8_t *const p[16], const uint8_t *w, __m512i vo,
                                                         int64_t b, int64_t K, int64_t M, const XQ *xq,
                                                         __m512 *out, int stride) {
    const uint8_t *wb = w + 210 * b;
    /* d: the high half of bytes 206..209 (a gather at 208 would read 2 bytes past the last row) */
    __m512i d32 = _mm512_i32gather_epi32(vo, (const void *)(wb + 206), 1);
    __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d32, 16)));
    __m512i SC[16], SCP[8], isum[MAX_M];
    for (int q = 0; q < 4; q++) {  /* the 16 int8 scales, sign-extended per lane */
        __m512i g = _mm512_i32gather_epi32(vo, (const void *)(wb + 192 + 4 * q), 1);
        for (int j = 0; j < 4; j++) SC[4 * q + j] = _mm512_srai_epi32(_mm512_slli_epi32(g, 24 - 8 * j), 24);
    }
    for (int i = 0; i < 8; i++)
        SCP[i] = _mm512_or_si512(_mm512_and_si512(SC[2 * i], _mm512_set1_epi32(0xFFFF)),
                                 _mm512_slli_epi32(SC[2 * i + 1], 16));
    for (int m = 0; m < M; m++) isum[m] = _mm512_setzero_si512();
    const __m512i low = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        __m512i TA[8], TB[8], TH[8];
        t16_8(p, 210 * b + 64 * h, TA);
        t16_8(p, 210 * b + 64 * h + 32, TB);
        t16_8(p, 210 * b + 128 + 32 * h, TH);
        for (int c = 0; c < 4; c++) {  /* elements 128h + 32c + l: sub-blocks 8h + 2c (l < 16) and 8h + 2c + 1 */
            __m512i C[8];
            for (int k = 0; k < 8; k++) {
                __m512i src = c & 1 ? TB[k] : TA[k];
                __m512i lo = c < 2 ? _mm512_and_si512(src, low) : _mm512_and_si512(_mm512_srli_epi32(src, 4), low);
                __m512i hb = c == 0 ? _mm512_slli_epi32(TH[k], 4) : c == 1 ? _mm512_slli_epi32(TH[k], 2)
                           : c == 2 ? TH[k] : _mm512_srli_epi32(TH[k], 2);  /* qh's 2 bits of this kind at 4..5 */
                C[k] = _mm512_or_si512(lo, _mm512_and_si512(hb, bits45));
            }
            int j = 8 * h + 2 * c;
            for (int m = 0; m < M; m++) {
                const int8_t *x = xq->q + m * K + 256 * b + 128 * h + 32 * c;
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                for (int k = 0; k < 4; k++) {
                    s0 = _mm512_dpbusd_epi32(s0, C[k], _mm512_set1_epi32(ld32(x + 4 * k)));
                    s1 = _mm512_dpbusd_epi32(s1, C[k + 4], _mm512_set1_epi32(ld32(x + 16 + 4 * k)));
                }
                isum[m] = _mm512_add_epi32(isum[m], _mm512_add_epi32(_mm512_mullo_epi32(s0, SC[j]),
                                                                     _mm512_mullo_epi32(s1, SC[j + 1])));
            }
        }
    }
    for (int m = 0; m < M; m++) {  /* - 32 sum_s sc_s sum(x)_s */
        const int16_t *h16 = xq->h16 + m * (K / 16) + 16 * b;
        __m512i cor = _mm512_setzero_si512();
        for (int i = 0; i < 8; i++) cor = _mm512_dpwssd_epi32(cor, SCP[i], _mm512_set1_epi32(ld32(h16 + 2 * i)));
        __m512i is = _mm512_sub_epi32(isum[m], _mm512_slli_epi32(cor, 5));
        __m512 dx = _mm512_set1_ps(xq->d[m * xq->nbp + b]);
        out[m * stride] = _mm512_mul_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, dx));
    }
}

/* the vector width's part of q8_lanes.h: 16 lanes of a zmm */
#define LN 16
typedef __m512 lvf;
typedef __m512i lvi;
#define LVI_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define LVF_ZERO _mm512_setzero_ps()
#define LVF_ADD _mm512_add_ps
#define LVF_TREE tree8v
#define LVF_STORE_FIRST(y, R, v) _mm512_mask_storeu_ps(y, (__mmask16)((1u << (R)) - 1), v)  /* lanes < R */
#endif /* PAIR */

#endif
