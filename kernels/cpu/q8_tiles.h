/* q8_matmul: Q5_0, Q4_K and Q6_K tiled at load (gguf_blocks.h: TILED + the type), 16 weight rows as the lanes of a
 * zmm (the AVX-512 VNNI levels), for every M: a decode step and a verify block read the same tiles in the same float
 * order, so a verify row is its step bit for bit, and both are the GGUF rows' bits.
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order.
 *
 * Why: from GGUF rows, a 16-row block's codes and scales take 16 loads and a transpose in registers before the first
 * product (Q5_0: 12 loads, 24 inserts and 24 permutes, ~52 cycles of a block's ~104 at 8 rows of x on a Zen 5; Q6_K:
 * 8 transposes a superblock). A tile holds each part in the order the lanes want: one load each. Q5_0 4864x896, 1
 * thread, hot: 8 rows 229 -> 175 us, 1 row 148 -> 70 us. */
#ifndef BOLT_Q8_TILES_H
#define BOLT_Q8_TILES_H

#ifdef PAIR
/* Q5_0 block q of a tile -> the 16 rows' unsigned codes W[k] (4k..4k+3, lane = row) and scales dw; its groups: qh,
 * then qs 0..3 */
static inline __attribute__((always_inline)) void t16_q5_block(const uint8_t *q, __m512i W[8], __m512 *dw) {
    *dw = tile_half(q);
    __m512i G[5];
    tile_groups(q + 32, 0, G, 5);
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; k++) {  /* byte j holds code j (low nibble) and code j + 16 (high) */
        W[k] = _mm512_and_si512(G[1 + k], low);
        W[k + 4] = _mm512_and_si512(_mm512_srli_epi32(G[1 + k], 4), low);
    }
    q5_fifth(W, G[0]);
}

/* one tile of type t (R <= 16 rows; its padding rows' lanes are not stored) against M <= MAX_M rows of x:
 * y[m * ystride + r]. The next tile is fetched a block's share per block, in address order (it is contiguous). */
static inline __attribute__((always_inline)) void tiled_t(int t, const uint8_t *tile, int R, int64_t K, int64_t M,
                                                         const XQ *xq, float *y, int64_t ystride) {
    const int64_t nb = K / block_len(t), tbytes = T16_ROWS * (t == Q5_0 ? 22 : t == Q4_K ? 144 : 210);
    const uint8_t *next = tile + nb * tbytes;
    __m512 acc[MAX_M], P[MAX_M][8];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            if (b >= nb) {
                for (int m = 0; m < M; m++) P[m][i] = _mm512_setzero_ps();
                continue;
            }
            for (int64_t o = 0; o < tbytes; o += 64) __builtin_prefetch(next + b * tbytes + o);
            const uint8_t *tb = tile + b * tbytes;
            if (t == Q5_0) {
                __m512i W[8];
                __m512 dw;
                t16_q5_block(tb, W, &dw);
                lanes_dots(16, W, dw, b, K, M, xq, &P[0][i], 8);
            } else if (t == Q4_K) {
                lanes_q4k(NULL, tb, b, K, M, xq, &P[0][i], 8);
            } else {
                lanes_q6k(NULL, tb, b, K, M, xq, &P[0][i], 8);
            }
        }
        for (int m = 0; m < M; m++) acc[m] = _mm512_add_ps(acc[m], tree8v(P[m]));
    }
    for (int m = 0; m < M; m++) _mm512_mask_storeu_ps(y + m * ystride, (__mmask16)((1u << R) - 1), acc[m]);
}

static void tiled_rows(int t, const uint8_t *tile, int R, int64_t K, int64_t M, const XQ *xq, float *y,
                       int64_t ystride) {
    switch (t) {  /* t a constant in each */
    case Q5_0: tiled_t(Q5_0, tile, R, K, M, xq, y, ystride); break;
    case Q4_K: tiled_t(Q4_K, tile, R, K, M, xq, y, ystride); break;
    default: tiled_t(Q6_K, tile, R, K, M, xq, y, ystride); break;
    }
}
#endif

#endif
