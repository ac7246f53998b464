/* q8_matmul: Q5_0 tiled at load (Q5_0_T16, gguf_blocks.h), 16 weight rows as the lanes of a zmm (the AVX-512 VNNI
 * levels), for every M: a decode step and a verify block read the same tiles in the same float order, so a verify row
 * is its step bit for bit.
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order.
 *
 * Why: from GGUF rows, a 16-row block's codes, scales and fifth bits take 12 loads, 24 inserts and 24 permutes before
 * the first product (w16_block), ~52 cycles of a block's ~104 at 8 rows of x on a Zen 5. A tile holds them in the
 * order the lanes want: 6 loads, no permutes but the fifth bits' table (Q5_0 4864x896, 8 rows, 1 thread, hot: 270 ->
 * 180 us). Q5_0 is 70 % of the default chat model's weight bytes. */
#ifndef BOLT_Q8_TILES_H
#define BOLT_Q8_TILES_H

#ifdef PAIR
/* block q (T16_BLOCK bytes) of a tile -> the 16 rows' unsigned codes W[k] (4k..4k+3, lane = row) and scales dw */
static inline __attribute__((always_inline)) void t16_q5_block(const uint8_t *q, __m512i W[8], __m512 *dw) {
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)q));
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; k++) {  /* byte j holds code j (low nibble) and code j + 16 (high) */
        __m512i g = _mm512_loadu_si512(q + 96 + 64 * k);
        W[k] = _mm512_and_si512(g, low);
        W[k + 4] = _mm512_and_si512(_mm512_srli_epi32(g, 4), low);
    }
    q5_fifth(W, _mm512_loadu_si512(q + 32));
}

/* one tile (R <= 16 rows; its padding rows' lanes are not stored) against M <= MAX_M rows of x: y[m * ystride + r].
 * The next tile is fetched a block's share per block, in address order (it is contiguous). */
static void tiled_rows(const uint8_t *tile, int R, int64_t K, int64_t M, const XQ *xq, float *y, int64_t ystride) {
    const int64_t nb = K / 32;
    const uint8_t *next = tile + nb * T16_BLOCK;
    __m512 acc[MAX_M], P[MAX_M][8];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            if (b >= nb) {
                for (int m = 0; m < M; m++) P[m][i] = _mm512_setzero_ps();
                continue;
            }
            for (int o = 0; o < T16_BLOCK; o += 64) __builtin_prefetch(next + b * T16_BLOCK + o);
            __m512i W[8];
            __m512 dw;
            t16_q5_block(tile + b * T16_BLOCK, W, &dw);
            lanes_dots(16, W, dw, b, K, M, xq, &P[0][i], 8);
        }
        for (int m = 0; m < M; m++) acc[m] = _mm512_add_ps(acc[m], tree8v(P[m]));
    }
    for (int m = 0; m < M; m++) _mm512_mask_storeu_ps(y + m * ystride, (__mmask16)((1u << R) - 1), acc[m]);
}
#endif

#endif
