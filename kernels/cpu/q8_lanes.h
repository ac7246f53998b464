/* q8_matmul: weight rows as lanes, the part both vector widths share: a tile of LN weight rows (16 in a zmm,
 * q8_rows16.h; 8 in a ymm, q8_rows8.h) against 2..MAX_M rows of x (a verify block, a short prefill chunk), block by
 * block; each width header gives lanes_legacy / lanes_q4k / lanes_q6k (one block's products for every row of x)
 * and the LN / lv* names.
 * Each lane is one (x row, weight row) product: per block p = isum * (d_w * d_x) [+ the min term], per 8 blocks
 * ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)) added to the sum, q8_matmul.c's one float order.
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order. */
#ifndef BOLT_Q8_LANES_H
#define BOLT_Q8_LANES_H

#ifdef LN
static inline int lanes_type(int t) { return t == Q4_0 || t == Q5_0 || t == Q8_0 || t == Q4_K || t == Q6_K; }

/* block (or superblock) b of the LN rows for every row of x: out[m * stride] (the width header's lanes_*) */
static inline __attribute__((always_inline)) void lanes_block(int t, const uint8_t *const p[LN], const uint8_t *w,
                                                             lvi vo, int64_t b, int64_t K, int64_t M, const XQ *xq,
                                                             lvf *out, int stride) {
    if (t == Q4_K)
        lanes_q4k(p, w, vo, b, K, M, xq, out, stride);
    else if (t == Q6_K)
        lanes_q6k(p, w, vo, b, K, M, xq, out, stride);
    else
        lanes_legacy(t, p, w, vo, b, K, M, xq, out, stride);
}

/* R <= LN weight rows at w (rb bytes apart) against M <= MAX_M rows of x: y[m * ystride + r]. The next LN rows are
 * fetched a block's share per block (see Ahead in q8_rows.h). */
static inline __attribute__((always_inline)) void lanes_t(int t, const uint8_t *w, int64_t rb, int R, int64_t K,
                                                         int64_t M, const XQ *xq, float *y, int64_t ystride) {
    const int bytes = t == Q4_0 ? 18 : t == Q5_0 ? 22 : t == Q8_0 ? 34 : t == Q4_K ? 144 : 210;
    const int64_t nb = K / block_len(t);
    const uint8_t *p[LN];
    int32_t vo_s[LN];
    for (int r = 0; r < LN; r++) {  /* rows past R repeat the last one (valid bytes; their lanes are not stored) */
        int rr = r < R ? r : R - 1;
        p[r] = w + rr * rb;
        vo_s[r] = (int32_t)(rr * rb);
    }
    const lvi vo = LVI_LOAD(vo_s);  /* the rows' byte offsets, for gathers of their scales */
    lvf acc[MAX_M], P[MAX_M][8];
    for (int m = 0; m < M; m++) acc[m] = LVF_ZERO;
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            if (b >= nb) {
                for (int m = 0; m < M; m++) P[m][i] = LVF_ZERO;
                continue;
            }
            for (int r = 0; r < LN; r++)
                for (int o = 0; o < bytes; o += 64) __builtin_prefetch(p[r] + LN * rb + bytes * b + o);
            lanes_block(t, p, w, vo, b, K, M, xq, &P[0][i], 8);
        }
        for (int m = 0; m < M; m++) acc[m] = LVF_ADD(acc[m], LVF_TREE(P[m]));
    }
    for (int m = 0; m < M; m++) LVF_STORE_FIRST(y + m * ystride, R, acc[m]);
}

static void lanes_rows(int t, const uint8_t *w, int64_t rb, int R, int64_t K, int64_t M, const XQ *xq, float *y,
                       int64_t ystride) {
    switch (t) {  /* t a constant in each */
    case Q4_0: lanes_t(Q4_0, w, rb, R, K, M, xq, y, ystride); break;
    case Q5_0: lanes_t(Q5_0, w, rb, R, K, M, xq, y, ystride); break;
    case Q4_K: lanes_t(Q4_K, w, rb, R, K, M, xq, y, ystride); break;
    case Q6_K: lanes_t(Q6_K, w, rb, R, K, M, xq, y, ystride); break;
    default: lanes_t(Q8_0, w, rb, R, K, M, xq, y, ystride); break;
    }
}
#endif

#endif
