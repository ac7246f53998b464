/* q8_matmul: Q4_0, Q5_0, Q4_K and Q6_K tiled at load (gguf_blocks.h), LN weight rows as the lanes of a vector (16 in
 * a zmm with AVX-512, 8 in a ymm on AVX2 and AVX-VNNI), for every M: a decode step and a verify block read the same
 * tiles in the same float order (q8_lanes.h's lanes_t, which takes a tile where it takes LN GGUF rows), so a verify
 * row is its step bit for bit, and both are the GGUF rows' bits. Here: a Q4_0 / Q5_0 tile block's codes; the K-quants'
 * are lanes_q4k / lanes_q6k's, from a tile block or from rows.
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
#endif

#endif
