/* q8_matmul: Q4_0, Q5_0, Q4_K and Q6_K tiled at load (gguf_blocks.h), LN weight rows as the lanes of a vector (16 in a zmm
 * with AVX-512, 8 in a ymm on AVX2 and AVX-VNNI), for every M: a decode step and a verify block read the same tiles in
 * the same float order, so a verify row is its step bit for bit, and both are the GGUF rows' bits.
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order.
 *
 * Why: from GGUF rows, an LN-row block's codes and scales take LN loads and a transpose in registers before the first
 * product (Q5_0 with AVX-512: 12 loads, 24 inserts and 24 permutes, ~52 cycles of a block's ~104 at 8 rows of x on a
 * Zen 5; Q6_K: 8 transposes a superblock). A tile holds each part in the order the lanes want: one load each. Q5_0
 * 4864x896, 1 thread, hot: 8 rows 229 -> 175 us, 1 row 148 -> 70 us. */
#ifndef BOLT_Q8_TILES_H
#define BOLT_Q8_TILES_H

#ifdef LN
/* Q4_0 / Q5_0 block tb of a tile for every row of x: out[m * stride]; its groups: Q5_0's qh, then qs 0..3 (byte j of
 * qs holds code j in its low nibble, code j + 16 in its high one) */
static inline __attribute__((always_inline)) void tile_q45(int t, const uint8_t *tb, int64_t b, int64_t K, int64_t M,
                                                          const XQ *xq, lvf *out, int stride) {
    const int q5 = t == Q5_0;
    lvi G[5], W[8];
    LV_TILE_GROUPS(tb + 2 * LN, 0, G, 4 + q5);
    const lvi low = LV_SET1_8(0x0F);
    for (int k = 0; k < 4; k++) {
        W[k] = LV_AND(G[q5 + k], low);
        W[k + 4] = LV_AND(LV_SRLI(G[q5 + k], 4), low);
    }
#if LN == 16
    if (q5) q5_fifth(W, G[0]);
    lanes_dots(q5 ? 16 : 8, W, LV_TILE_HALF(tb), b, K, M, xq, out, stride);
#else
    if (q5)
        for (int k = 0; k < 8; k++) W[k] = LV_OR(W[k], fifth8(G[0], k));
    lanes_dots8(t, W, LV_TILE_HALF(tb), b, K, M, xq, out, stride);
#endif
}

/* one tile of type t (R <= LN rows; its padding rows' lanes are not stored) against M <= MAX_M rows of x:
 * y[m * ystride + r]. The next tile is fetched a block's share per block, in address order (it is contiguous). */
static inline __attribute__((always_inline)) void tiled_t(int t, const uint8_t *tile, int R, int64_t K, int64_t M,
                                                         const XQ *xq, float *y, int64_t ystride) {
    const int64_t nb = K / block_len(t), tbytes = LN * (t == Q4_0 ? 18 : t == Q5_0 ? 22 : t == Q4_K ? 144 : 210);
    const uint8_t *next = tile + nb * tbytes;
    lvf acc[MAX_M], P[MAX_M][8];
    for (int m = 0; m < M; m++) acc[m] = LVF_ZERO;
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            if (b >= nb) {
                for (int m = 0; m < M; m++) P[m][i] = LVF_ZERO;
                continue;
            }
            for (int64_t o = 0; o < tbytes; o += 64) __builtin_prefetch(next + b * tbytes + o);
            const uint8_t *tb = tile + b * tbytes;
            if (t == Q4_0 || t == Q5_0)
                tile_q45(t, tb, b, K, M, xq, &P[0][i], 8);
            else if (t == Q4_K)
                lanes_q4k(NULL, tb, b, K, M, xq, &P[0][i], 8);
            else
                lanes_q6k(NULL, tb, b, K, M, xq, &P[0][i], 8);
        }
        for (int m = 0; m < M; m++) acc[m] = LVF_ADD(acc[m], LVF_TREE(P[m]));
    }
    for (int m = 0; m < M; m++) LVF_STORE_FIRST(y + m * ystride, R, acc[m]);
}

static void tiled_rows(int t, const uint8_t *tile, int R, int64_t K, int64_t M, const XQ *xq, float *y,
                       int64_t ystride) {
    switch (t) {  /* t a constant in each */
    case Q4_0: tiled_t(Q4_0, tile, R, K, M, xq, y, ystride); break;
    case Q5_0: tiled_t(Q5_0, tile, R, K, M, xq, y, ystride); break;
    case Q4_K: tiled_t(Q4_K, tile, R, K, M, xq, y, ystride); break;
    default: tiled_t(Q6_K, tile, R, K, M, xq, y, ystride); break;
    }
}
#endif

#endif
