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
/* from a tile's block tb (q8_tiles.h) where there are no rows p (NULL), else from the LN rows at p: the callers pass
 * NULL or their own array, so the compiler keeps one side (a runtime test of tb kept both, and Q6_K's 1-row tile
 * ran 20 % slower) */
#define TILE_OR(p, from_tile, from_rows) do { if (!(p)) { from_tile; } else { from_rows; } } while (0)

static inline int lanes_type(int t) { return t == Q4_0 || t == Q5_0 || t == Q8_0 || t == Q4_K || t == Q6_K; }

/* Q4_K superblock b for every row of x: out[m * stride]. Its 4 runs of 32 bytes transposed (LV_T8); sub-block j's
 * integer sum times its 6-bit scale (VNNI: vpmulld; AVX2: the int16 sums by vpmaddwd with the scale pair), the mins
 * through x's sums per 32 in int16 pairs (vpdpwssd / vpmaddwd); the 12 scale bytes decoded per lane (LV_T4 of the
 * first 16 bytes), as k_scale_min reads them (q4k_scale_bytes in vectors). */
static inline __attribute__((always_inline)) void lanes_q4k(const uint8_t *const p[LN], const uint8_t *tb,
                                                           int64_t b, int64_t K, int64_t M, const XQ *xq, lvf *out,
                                                           int stride) {
    lvi H[4];  /* the first 16 bytes: d | dmin, then the 12 scale bytes */
    TILE_OR(p, LV_TILE_GROUPS(tb, 0, H, 4), LV_T4(p, 144 * b, H));
    lvf dw = LV_HALF(H[0], 0), mw = LV_HALF(H[0], 1);
    lvi u0 = H[1], u1 = H[2], u2 = H[3];
    const lvi m6 = LV_SET1(0x3F3F3F3F), m4 = LV_SET1(0x0F0F0F0F), top = LV_SET1(0x30303030), byte = LV_SET1(0xFF);
    lvi sc4[2] = {LV_AND(u0, m6), LV_OR(LV_AND(u2, m4), LV_AND(LV_SRLI(u0, 2), top))};
    lvi mn4[2] = {LV_AND(u1, m6), LV_OR(LV_AND(LV_SRLI(u2, 4), m4), LV_AND(LV_SRLI(u1, 2), top))};
    lvi SC[8], SC16[8], MNP[4], isum[MAX_M];
    for (int j = 0; j < 8; j++) {
        SC[j] = LV_AND(LV_SRLI(sc4[j / 4], 8 * (j % 4)), byte);
        SC16[j] = LV_PAIR(SC[j]);
    }
    for (int i = 0; i < 4; i++) {  /* bytes 2q, 2q + 1 as two int16 */
        lvi u = LV_SRLI(mn4[i / 2], 16 * (i % 2));
        MNP[i] = LV_OR(LV_AND(u, byte), LV_AND(LV_SLLI(u, 8), LV_SET1(0xFF0000)));
    }
    for (int m = 0; m < M; m++) isum[m] = LV_ZERO;
    const lvi low = LV_SET1_8(0x0F);
    for (int g = 0; g < 4; g++) {  /* 32 bytes: sub-block 2g in the low nibbles, 2g + 1 in the high ones */
        lvi T[8], lo[8], hi[8];
        TILE_OR(p, LV_TILE_GROUPS(tb, 4 + 8 * g, T, 8), LV_T8(p, 144 * b + 16 + 32 * g, T));
        for (int k = 0; k < 8; k++) {
            lo[k] = LV_AND(T[k], low);
            hi[k] = LV_AND(LV_SRLI(T[k], 4), low);
        }
        for (int m = 0; m < M; m++) {
            const int8_t *x = xq->q + m * K + 256 * b + 64 * g;
            isum[m] = LV_ADD(isum[m], LV_ADD(LV_SUB_DOT(lo, x, 8, 8, SC[2 * g], SC16[2 * g]),
                                             LV_SUB_DOT(hi, x + 32, 8, 8, SC[2 * g + 1], SC16[2 * g + 1])));
        }
    }
    for (int m = 0; m < M; m++) {
        const int16_t *h = xq->h32 + m * (K / 32) + 8 * b;
        lvi jsum = LV_ZERO;
        for (int i = 0; i < 4; i++) jsum = LV_MADD(jsum, MNP[i], LV_SET1(ld32(h + 2 * i)));
        lvf dx = LVF_SET1(xq->d[m * xq->nbp + b]);
        lvf pb = LVF_MUL(LVF_CVT(isum[m]), LVF_MUL(dw, dx));
        out[m * stride] = LVF_ADD(pb, LVF_MUL(LVF_CVT(LV_SUB(LV_ZERO, jsum)), LVF_MUL(mw, dx)));
    }
}

/* Q6_K superblock b for every row of x: out[m * stride]. Per half, ql's two 32-byte runs and qh's are transposed and
 * the 4 kinds of codes (q6_k_codes' order) built from them; each sub-block of 16 times its int8 scale, the codes'
 * offset 32 through x's sums per 16 and the scales in int16 pairs. */
static inline __attribute__((always_inline)) void lanes_q6k(const uint8_t *const p[LN], const uint8_t *tb,
                                                           int64_t b, int64_t K, int64_t M, const XQ *xq, lvf *out,
                                                           int stride) {
    lvi D[4];  /* bytes 194..209, d the last two (16 bytes from 208 would read past the row) */
    lvf dw;
    lvi SC[16], SC16[16], SCP[8], isum[MAX_M];
    lvi G[4];  /* bytes 192..207: the 16 int8 scales */
    TILE_OR(p, (dw = LV_TILE_HALF(tb), LV_TILE_GROUPS(tb + 2 * LN, 48, G, 4)),
            (LV_T4(p, 210 * b + 194, D), dw = LV_HALF(D[3], 1), LV_T4(p, 210 * b + 192, G)));
    for (int q = 0; q < 4; q++) {  /* sign-extended per lane */
        lvi g = G[q];
        for (int j = 0; j < 4; j++) {
            SC[4 * q + j] = LV_SRAI(LV_SLLI(g, 24 - 8 * j), 24);
            SC16[4 * q + j] = LV_PAIR(SC[4 * q + j]);
        }
    }
    for (int i = 0; i < 8; i++) SCP[i] = LV_OR(LV_AND(SC[2 * i], LV_SET1(0xFFFF)), LV_SLLI(SC[2 * i + 1], 16));
    for (int m = 0; m < M; m++) isum[m] = LV_ZERO;
    const lvi low = LV_SET1_8(0x0F), bits45 = LV_SET1_8(0x30);
    for (int h = 0; h < 2; h++) {
        lvi TA[8], TB[8], TH[8];
        TILE_OR(p, (LV_TILE_GROUPS(tb + 2 * LN, 16 * h, TA, 8), LV_TILE_GROUPS(tb + 2 * LN, 16 * h + 8, TB, 8),
                     LV_TILE_GROUPS(tb + 2 * LN, 32 + 8 * h, TH, 8)),
                (LV_T8(p, 210 * b + 64 * h, TA), LV_T8(p, 210 * b + 64 * h + 32, TB),
                 LV_T8(p, 210 * b + 128 + 32 * h, TH)));
        for (int c = 0; c < 4; c++) {  /* elements 128h + 32c + l: sub-blocks 8h + 2c (l < 16) and 8h + 2c + 1 */
            lvi C[8];
            for (int k = 0; k < 8; k++) {
                lvi src = c & 1 ? TB[k] : TA[k];
                lvi lo = c < 2 ? LV_AND(src, low) : LV_AND(LV_SRLI(src, 4), low);
                lvi hb = c == 0 ? LV_SLLI(TH[k], 4) : c == 1 ? LV_SLLI(TH[k], 2) : c == 2 ? TH[k] : LV_SRLI(TH[k], 2);
                C[k] = LV_OR(lo, LV_AND(hb, bits45));  /* qh's 2 bits of this kind at 4..5 */
            }
            int j = 8 * h + 2 * c;
            for (int m = 0; m < M; m++) {
                const int8_t *x = xq->q + m * K + 256 * b + 128 * h + 32 * c;
                isum[m] = LV_ADD(isum[m], LV_ADD(LV_SUB_DOT(C, x, 4, 2, SC[j], SC16[j]),
                                                 LV_SUB_DOT(C + 4, x + 16, 4, 2, SC[j + 1], SC16[j + 1])));
            }
        }
    }
    for (int m = 0; m < M; m++) {  /* - 32 sum_s sc_s sum(x)_s */
        const int16_t *h16 = xq->h16 + m * (K / 16) + 16 * b;
        lvi cor = LV_ZERO;
        for (int i = 0; i < 8; i++) cor = LV_MADD(cor, SCP[i], LV_SET1(ld32(h16 + 2 * i)));
        lvf dx = LVF_SET1(xq->d[m * xq->nbp + b]);
        out[m * stride] = LVF_MUL(LVF_CVT(LV_SUB(isum[m], LV_SLLI(cor, 5))), LVF_MUL(dw, dx));
    }
}

/* block (or superblock) b of the LN rows at p, or (p NULL) of a tile, its block at tb, for every row of x:
 * out[m * stride] (the width header's lanes_*) */
static inline __attribute__((always_inline)) void lanes_block(int t, const uint8_t *const p[LN], const uint8_t *tb,
                                                             int64_t b, int64_t K, int64_t M, const XQ *xq, lvf *out,
                                                             int stride) {
    if (t == Q4_K)
        lanes_q4k(p, tb, b, K, M, xq, out, stride);
    else if (t == Q6_K)
        lanes_q6k(p, tb, b, K, M, xq, out, stride);
    else if (!p)
        tile_q45(t, tb, b, K, M, xq, out, stride);
    else
        lanes_legacy(t, p, b, K, M, xq, out, stride);
}

/* R <= LN weight rows at w (rb bytes apart), or the tile at w (tiled: its R rows' blocks interleaved, rb bytes a row),
 * against M <= MAX_M rows of x: y[m * ystride + r]. The next LN rows (the next tile) are fetched a block's share per
 * block. */
static inline __attribute__((always_inline)) void lanes_t(int t, int tiled, const uint8_t *w, int64_t rb, int R,
                                                         int64_t K, int64_t M, const XQ *xq, float *y,
                                                         int64_t ystride) {
    const int64_t nb = K / block_len(t);
    /* a block (superblock) of the LN rows, GGUF or tiled: a constant, as the tiles' own loop had it */
    const int64_t bb = LN * (t == Q4_0 ? 18 : t == Q5_0 ? 22 : t == Q8_0 ? 34 : t == Q4_K ? 144 : 210);
    const uint8_t *p[LN], *nx = w + LN * rb;
    for (int r = 0; r < LN && !tiled; r++) {  /* rows past R repeat the last one (valid bytes; lanes not stored) */
        int rr = r < R ? r : R - 1;
        p[r] = w + rr * rb;
    }
    lvf acc[MAX_M], P[MAX_M][8];
    for (int m = 0; m < M; m++) acc[m] = LVF_ZERO;
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            if (b >= nb) {
                for (int m = 0; m < M; m++) P[m][i] = LVF_ZERO;
                continue;
            }
            /* the next tile (its LN rows are contiguous), a block's share in address order: per row at block b
             * (LN streams) the cold Q6_K verify product ran 35 % slower, its fetches serialized on the miss
             * buffers */
            for (int64_t o = bb * b & ~(int64_t)63; o < bb * (b + 1); o += 64) __builtin_prefetch(nx + o);
            lanes_block(t, tiled ? NULL : p, w + bb * b, b, K, M, xq, &P[0][i], 8);
        }
        for (int m = 0; m < M; m++) acc[m] = LVF_ADD(acc[m], LVF_TREE(P[m]));
    }
    for (int m = 0; m < M; m++) LVF_STORE_FIRST(y + m * ystride, R, acc[m]);
}

/* the tiles' instances apart from the rows' (in one function with them the 1-row Q5_0 tile ran ~25 % slower) */
static void lanes_tiles(int t, const uint8_t *w, int64_t rb, int R, int64_t K, int64_t M, const XQ *xq, float *y,
                        int64_t ystride) {
    switch (t) {  /* t a constant in each */
    case Q4_0: lanes_t(Q4_0, 1, w, rb, R, K, M, xq, y, ystride); break;
    case Q5_0: lanes_t(Q5_0, 1, w, rb, R, K, M, xq, y, ystride); break;
    case Q4_K: lanes_t(Q4_K, 1, w, rb, R, K, M, xq, y, ystride); break;
    default: lanes_t(Q6_K, 1, w, rb, R, K, M, xq, y, ystride); break;
    }
}

static void lanes_rows(int t, int tiled, const uint8_t *w, int64_t rb, int R, int64_t K, int64_t M, const XQ *xq,
                       float *y, int64_t ystride) {
    if (tiled) {
        lanes_tiles(t, w, rb, R, K, M, xq, y, ystride);
        return;
    }
    switch (t) {  /* t a constant in each */
    case Q4_0: lanes_t(Q4_0, 0, w, rb, R, K, M, xq, y, ystride); break;
    case Q5_0: lanes_t(Q5_0, 0, w, rb, R, K, M, xq, y, ystride); break;
    case Q4_K: lanes_t(Q4_K, 0, w, rb, R, K, M, xq, y, ystride); break;
    case Q6_K: lanes_t(Q6_K, 0, w, rb, R, K, M, xq, y, ystride); break;
    default: lanes_t(Q8_0, 0, w, rb, R, K, M, xq, y, ystride); break;
    }
}
#endif

#endif
