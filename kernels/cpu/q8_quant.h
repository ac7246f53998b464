/* q8_matmul: x quantized to int8 per block (Q8_0, Q8_K), also laid out rows-as-lanes.
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order. */
#ifndef BOLT_Q8_QUANT_H
#define BOLT_Q8_QUANT_H

/* ---- x -> int8 -------------------------------------------------------------------------------------------- */

/* x [n] in blocks of bs: d = amax / 127, q = nearest(x / d) in -127..127 */
static void quantize_row(const float *x, int64_t n, int bs, int8_t *q, float *d) {
    for (int64_t b = 0; b < n / bs; b++) {
        const float *xb = x + b * bs;
        float amax = 0.0f;
        for (int j = 0; j < bs; j++) {  /* not fmaxf: a libm call per element, 2 % of a verify product */
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        for (int j = 0; j < bs; j++) {
            float v = nearbyintf(xb[j] * id);
            q[b * bs + j] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
    }
}

/* One quantized x (blocks of bs = 32 or 256). Per row: q [M][K], d [M][nbp] (nbp: blocks rounded up to 8, padding
 * zero), sums of q per 32 s32 [M][n32p] (int32, padded like d) and as int16 h32 [M][K/32], per 16 h16 [M][K/16].
 * With lanes (several rows on the rows-as-lanes path) also rows-as-lanes, padded rows zero: qt [chunks][K/4][XLANES]
 * (4 bytes per int32), dt [chunks][nbp][XLANES], s32t [chunks][K/32][XLANES], and h32t [chunks][K/64][XLANES] (two
 * int16 sums per int32). h16t [chunks][K/32][XLANES] holds the sums per 16 the same way. Row l of a chunk is lane
 * l, or lanes 2l and 2l + 1 where a zmm meets two weight rows (DUP = 2). */
typedef struct {
    int64_t nbp, n32p;
    int8_t *q, *qp;
    float *d;
    int32_t *s32;
    int16_t *h32, *h16;
    int32_t *qt, *s32t, *h32t, *h16t;
    float *dt;
} XQ;

/* A quantized x in three steps, so that its rows can be quantized in parallel: xq_alloc (0, or -1 for no memory),
 * xq_row for each row m of x (independent of the others), then xq_finish (the layouts built from all rows) */
static int xq_alloc(XQ *o, int64_t M, int64_t K, int bs, int lanes) {
    memset(o, 0, sizeof *o);
    o->nbp = (K / bs + 7) / 8 * 8;
    o->n32p = (K / 32 + 7) / 8 * 8;
    int64_t ch = (M + LANES - 1) / LANES;
    o->q = aligned_alloc(64, (size_t)(M * K + 63) / 64 * 64);  /* a 32-byte load never splits a cache line */
    o->d = calloc((size_t)(M * o->nbp), sizeof(float));
    o->s32 = calloc((size_t)(M * o->n32p), sizeof(int32_t));
    o->h32 = malloc(sizeof(int16_t) * (size_t)(M * (K / 32)));
    o->h16 = malloc(sizeof(int16_t) * (size_t)(M * (K / 16)));
    if (lanes) {
        o->qt = calloc((size_t)(ch * (K / 4) * XLANES), sizeof(int32_t));
        o->dt = calloc((size_t)(ch * o->nbp * XLANES), sizeof(float));
        o->s32t = calloc((size_t)(ch * (K / 32) * XLANES), sizeof(int32_t));
        o->h32t = calloc((size_t)(ch * (K / 64 + 1) * XLANES), sizeof(int32_t));
        o->h16t = calloc((size_t)(ch * (K / 32) * XLANES), sizeof(int32_t));
    }
    if (M == 1 && bs == 32) o->qp = calloc((size_t)((K / 32 + NIBG - 1) / NIBG * NIBG * 32), 1);
    if (!o->q || !o->d || !o->s32 || !o->h32 || !o->h16
        || (lanes && (!o->qt || !o->dt || !o->s32t || !o->h32t || !o->h16t))
        || (M == 1 && bs == 32 && !o->qp))
        return -1;
    return 0;
}

static void xq_row(XQ *o, const float *x, int64_t m, int64_t K, int bs) {
    int8_t *q = o->q + m * K;
    quantize_row(x + m * K, K, bs, q, o->d + m * o->nbp);
    for (int64_t i = 0; i < K / 16; i++) {
        int32_t t = 0;
        for (int j = 0; j < 16; j++) t += q[16 * i + j];
        o->h16[m * (K / 16) + i] = (int16_t)t;  /* |t| <= 16 * 127 */
    }
    for (int64_t i = 0; i < K / 32; i++) {
        int32_t t = o->h16[m * (K / 16) + 2 * i] + o->h16[m * (K / 16) + 2 * i + 1];
        o->s32[m * o->n32p + i] = t;
        o->h32[m * (K / 32) + i] = (int16_t)t;
    }
}

static void xq_finish(XQ *o, int64_t M, int64_t K, int bs, int lanes) {
    /* groups of NIBG blocks b, b + 1, ...: [b 0..15 | b+1 0..15 ...][b 16..31 | b+1 16..31 ...], as the blocks'
     * nibble halves meet them side by side */
    if (o->qp)
        for (int64_t b = 0; b < K / 32; b++)
            for (int j = 0; j < 32; j++)
                o->qp[NIBG * 32 * (b / NIBG) + NIBG * 16 * (j / 16) + 16 * (b % NIBG) + j % 16] = o->q[32 * b + j];
    if (lanes)
        for (int64_t m = 0; m < M; m++)
            for (int64_t l = m % LANES * DUP; l < (m % LANES + 1) * DUP; l++) {
                int64_t c = m / LANES;
                for (int64_t k4 = 0; k4 < K / 4; k4++) {
                    uint32_t v;
                    memcpy(&v, o->q + m * K + 4 * k4, 4);
                    o->qt[(c * (K / 4) + k4) * XLANES + l] = (int32_t)v;
                }
                for (int64_t b = 0; b < K / bs; b++) o->dt[(c * o->nbp + b) * XLANES + l] = o->d[m * o->nbp + b];
                for (int64_t i = 0; i < K / 32; i++)
                    o->s32t[(c * (K / 32) + i) * XLANES + l] = o->s32[m * o->n32p + i];
                for (int64_t i = 0; i < K / 64; i++) {
                    const int16_t *h = o->h32 + m * (K / 32) + 2 * i;
                    o->h32t[(c * (K / 64) + i) * XLANES + l] = pair16(h[0], h[1]);
                }
                for (int64_t i = 0; i < K / 32; i++) {
                    const int16_t *h = o->h16 + m * (K / 16) + 2 * i;
                    o->h16t[(c * (K / 32) + i) * XLANES + l] = pair16(h[0], h[1]);
                }
            }
}

static void xq_free(XQ *o) {
    free(o->q); free(o->qp); free(o->d); free(o->s32); free(o->h32); free(o->h16);
    free(o->qt); free(o->dt); free(o->s32t);
    free(o->h32t); free(o->h16t);
}

#endif
