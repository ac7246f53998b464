/* y = x @ W^T for a GGUF weight W [N, K] read in its own blocks and M <= 64 rows of x, with x quantized to int8 the
 * way llama.cpp (our numerical reference) does it: Q8_0 for the 32-blocks (Q4_0 .. Q8_0: one fp32 scale amax/127 per
 * 32), Q8_K for the K-quants (one scale per 256, sums per 16 and 32). Products are integer: vpmaddubsw + vpmaddwd on
 * AVX2, vpdpbusd with AVX-VNNI or AVX-512 VNNI. A K-quant superblock's sub-block scales multiply integer sums, so one
 * float conversion serves 256 weights.
 *
 * This file is compiled once per instruction-set level (native.py: LEVEL = portable, avx2, avxvnni, avx512vnni, each
 * with its own -m flags) and exports bolt_q8_parts_<LEVEL>; Python picks the level by the CPU's flags, or a lower one
 * by BOLT_CPU_LEVEL, so one machine can test every level it can run.
 *
 * One float order everywhere. Per block (superblock for K-quants) the integer isum = sum(q x) (q: the weight's signed
 * code after its offset; K-quants: sum over sub-blocks of sc * sum(q x)) and, for types with a min, jsum (sum(x), or
 * -sum(mn * sum(x)) for K-quants) are exact, however they are computed; the float side is fixed per row of x:
 * p = (float)isum * (d_w * d_x) [+ (float)jsum * (m_w * d_x)], then per group of 8 blocks
 * ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)) added to the row's sum. So a verify block's rows are the 1-row results bit for
 * bit (greedy DFlash == plain decoding), and every level equals the portable loop bit for bit (test_native_matmul.py).
 * -ffp-contract=off keeps the compiler from fusing.
 *
 * Two layouts, one per kind of call:
 * - One row of x (decode) runs along K, reading the weight bytes straight into registers: unsigned codes (u) times
 *   signed x, 32 per instruction; an offset (Q5_0: u - 16) comes off through x's block sums, which are computed once
 *   per call; 8 blocks' lane sums are reduced together.
 * - Several rows (a DFlash verify block, a prefill chunk of up to 64 tokens) of the vectorized types run weight rows
 *   as lanes (q8_lanes.h): 16 weight rows' blocks (8 on AVX2 / AVX-VNNI) transposed in registers so that one vector
 *   holds a 4-code group of every row, x's 4 bytes broadcast, one float tail per row of x for the whole tile.
 * - Q4_0, Q5_0, Q4_K and Q6_K are tiled at load (q8_tiles.h: 16 rows' blocks interleaved with AVX-512, 8 on AVX2 and
 *   AVX-VNNI) so that each part loads as one vector; every M runs weight rows as lanes over the tiles, the step and a
 *   verify block alike.
 * - The other types (Q4_1, Q5_1, Q5_K) at several rows run rows-as-lanes (q8_rows.h): each weight row unpacked once,
 *   x laid out [K/4][rows] in 4-byte groups so one broadcast group of codes meets 8 rows, each row's block sum in its
 *   own lane (with AVX-512 a zmm carries two weight rows interleaved per 4-byte group). */
/* the parts, each a header of static functions so that one level is one translation unit: q8_common.h (levels,
 * predicates, SIMD building blocks), q8_quant.h (x to int8), q8_unpack.h (weight rows, the portable loop),
 * q8_row1.h (one row), q8_rows.h (rows-as-lanes), q8_rows16.h / q8_rows8.h / q8_lanes.h (weight rows as lanes),
 * q8_tiles.h (tiles' Q4_0 / Q5_0 blocks) */
#include "q8_common.h"
#include "q8_quant.h"
#include "q8_unpack.h"
#include "q8_row1.h"
#include "q8_rows.h"
#include "q8_rows16.h"
#include "q8_rows8.h"
#include "q8_tiles.h"
#include "q8_lanes.h"

/* 1 where this level has a vectorized kernel for the type (the others run, correctly, at scalar speed) */
int CAT(bolt_q8_fast, LEVEL)(int t) {
#ifdef SIMD
    return t == Q4_0 || t == Q5_0 || t == Q8_0 || t == Q4_K || t == Q6_K || tiled(t);
#else
    (void)t;
    return 0;
#endif
}

static int supported(int t, int64_t K) {
    if (tiled(t)) t -= TILE_AT;  /* only this level's tiles */
    switch (t) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: return K % 32 == 0;
    case Q4_K: case Q5_K: case Q6_K: return K % 256 == 0;
    default: return 0;
    }
}

static int64_t row_bytes(int t, int64_t K) {  /* a tiled type: a tile's bytes per row */
    switch (t & 255) {
    case Q4_0: return K / 32 * 18;
    case Q4_1: return K / 32 * 20;
    case Q5_0: return K / 32 * 22;
    case Q5_1: return K / 32 * 24;
    case Q8_0: return K / 32 * 34;
    case Q4_K: return K / 256 * 144;
    case Q5_K: return K / 256 * 176;
    default: return K / 256 * 210;
    }
}

/* whether M rows against type t take weight rows as lanes (q8_lanes.h: 16 with AVX-512, 8 with AVX2 / AVX-VNNI);
 * else rows-as-lanes, or the 1-row path */
#ifdef LN
#define LANES_TILE LN
#else
#define LANES_TILE 8
#endif
static int lanes_path(int t, int64_t M) {
    if (tiled(t)) return 1;  /* every M (q8_tiles.h) */
#ifdef LN
    return M > 1 && M <= MAX_M && lanes_type(t);
#else
    (void)t, (void)M;
    return 0;
#endif
}

/* unpack buffers per thread: with PAIR two rows' staging, then NU units (pairs interleaved, or rows) */
#define UBUF (DUP == 2 ? 2 : 0)

/* R <= 8 weight rows (rb bytes apart) against all M rows of x: y[m * ystride + r]; r: this thread's unpack buffers
 * (r[0]: a row; with PAIR r[0], r[1] a pair's staging; then the NU units from r[UBUF]) */
static void weight_rows(int t, const uint8_t *w, int64_t rb, int R, int64_t K, int64_t M, const XQ *xq, Row *r,
                        float *y, int64_t ystride) {
#ifdef SIMD
    if (M == 1 && (t == Q4_0 || t == Q5_0 || t == Q8_0 || t == Q4_K || t == Q6_K)) {
        tile1(t, w, rb, R, K, xq, r->pbuf, y);
        return;
    }
#ifdef LN
    if (lanes_path(t, M)) {  /* a verify block, a short prefill chunk: LN weight rows as lanes */
        lanes_rows(tiled(t) ? t - TILE_AT : t, tiled(t), w, rb, R, K, M, xq, y, ystride);
        return;
    }
#endif
    if (M == 1) {
        for (int i = 0; i < R; i++) {
            unpack_scalar(t, w + i * rb, K, r);
            y[i] = row1_unpacked(t, r, K, xq->q, xq->d, xq->h32);
        }
        return;
    }
    for (int i0 = 0; i0 < R; i0 += NU * DUP) {  /* up to NU units of DUP weight rows, unpacked, then every chunk */
        int nu = 0;
        const Row *rr[NU];
        for (int i = i0; i < R && i < i0 + NU * DUP; i += DUP, nu++) {
            const uint8_t *wr = w + i * rb;
            Row *u = &r[UBUF + nu];
#ifdef PAIR  /* an odd last row goes with itself, its twin's lanes unused */
            unpack_scalar(t, wr, K, &r[0]);  /* only the types without a vectorized kernel come here */
            unpack_scalar(t, i + 1 < R ? wr + rb : wr, K, &r[1]);
            interleave_rows(t, K, &r[0], &r[1], u);
#else
            unpack_scalar(t, wr, K, u);
#endif
            rr[nu] = u;
        }
        for (int u = nu; u < NU; u++) rr[u] = rr[nu - 1];  /* a short last tile: NU units always (no unit count
                                                            * in the product's loops), the repeats' lanes unused */
        /* the next tile's rows (this thread's rows are contiguous): the unpack's first touch of its rows' bytes held a
         * quarter of a verify product's samples */
        Ahead pf = {w + (i0 + NU * DUP) * rb, rb, rb / (K / block_len(t)), NU * DUP};
        float lanes[NU * XLANES];
        for (int64_t c = 0; c * LANES < M; c++) {
            rows_simd(t, rr, K, xq, c, c == 0 ? &pf : NULL, lanes);
            for (int u = 0; u < nu; u++)
                for (int64_t l = 0; l < LANES && c * LANES + l < M; l++)
                    for (int d = 0; d < DUP && i0 + u * DUP + d < R; d++)
                        y[(c * LANES + l) * ystride + i0 + u * DUP + d] = lanes[u * XLANES + l * DUP + d];
        }
    }
#else
    for (int i = 0; i < R; i++) {
        unpack_scalar(t, w + i * rb, K, r);
        for (int64_t m = 0; m < M; m++)
            y[m * ystride + i] = row1_scalar(t, r, K, xq->q + m * K, xq->d + m * xq->nbp, xq->h32 + m * (K / 32));
    }
#endif
}

#define NBUF (UBUF + NU)

/* tile1's products for K (q8_row1.h: [groups][8 rows][8]) */
static float *pbuf_alloc(int64_t K) {
    return aligned_alloc(64, sizeof(float) * (size_t)((K / 256 + 8) * 64));
}

/* one thread's unpack buffers for K (n = 2: two rows interleaved); 1, or 0 for no memory */
static int row_alloc(Row *r, int64_t K, int64_t nbp, int n) {
    r->q = malloc((size_t)(n * K) + 128);
    r->dw = calloc((size_t)(n * nbp), sizeof(float));
    r->mw = calloc((size_t)(n * nbp), sizeof(float));
    r->sc = calloc((size_t)(n * (K / 16 + 16)), sizeof(int32_t));
    r->mn = calloc((size_t)(K / 32 + 8), sizeof(int32_t));
    r->mnp = calloc((size_t)(n * (K / 64 + 8)), sizeof(int32_t));
    r->scp = calloc((size_t)(n * (K / 32 + 8)), sizeof(int32_t));
    r->pbuf = pbuf_alloc(K);
    return r->q && r->dw && r->mw && r->sc && r->mn && r->mnp && r->scp && r->pbuf;
}

static void row_free(Row *r) {
    free(r->q); free(r->dw); free(r->mw); free(r->sc); free(r->mn); free(r->mnp); free(r->scp); free(r->pbuf);
}

/* y [M, sum N_p] = x [M, K] @ [W_0; W_1; ...]^T for n_parts weights side by side (q|k|v, gate|up), each [N_p, K] in
 * its own GGUF type at w[p], read where it lies (the GGUF mmap); x is quantized once per format the parts need.
 * Returns 0, or -1 for an unsupported type, a K that isn't whole blocks, M outside 1..MAX_M, or no memory. */
int CAT(bolt_q8_parts, LEVEL)(int n_parts, const int *types, const uint8_t *const *w, const int64_t *N, int64_t K,
                              const float *x, int64_t M, float *y, int n_threads) {
    if (n_parts < 1 || M < 1 || M > MAX_M || K < 32) return -1;
    int64_t n_total = 0;
    int need32 = 0, needk = 0;
    for (int p = 0; p < n_parts; p++) {
        if (!supported(types[p], K) || N[p] < 0) return -1;
        n_total += N[p];
        if (is_k(types[p])) needk = 1; else need32 = 1;
    }
    XQ x32, xk;
    memset(&x32, 0, sizeof x32);
    memset(&xk, 0, sizeof xk);
    /* the rows-as-lanes layouts only where a part goes that way (serial work: ~1 ms of a verify pass's 97 calls);
     * unpack buffers only where a part unpacks whole rows (the 1-row path needs its partial sums' buffer alone) */
    int lanes = 0, unpacks = 0;
    for (int p = 0; p < n_parts; p++) {
        int fast_row1 = M == 1 && CAT(bolt_q8_fast, LEVEL)(types[p]);
        lanes |= M > 1 && !lanes_path(types[p], M);
        unpacks |= !fast_row1 && !lanes_path(types[p], M);
    }
    int bad = (need32 && xq_alloc(&x32, M, K, 32, lanes)) || (needk && xq_alloc(&xk, M, K, 256, lanes));
    int64_t nbp = (K / 32 + 7) / 8 * 8;
    if (!bad) {
        #pragma omp parallel num_threads(n_threads)
        {
            /* x's rows quantized in parallel (each row's bytes are its own: the same whichever thread), then the
             * layouts built from all of them; the single's barrier holds the products until x is whole */
            #pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) {
                if (need32) xq_row(&x32, x, m, K, 32);
                if (needk) xq_row(&xk, x, m, K, 256);
            }
            #pragma omp single
            {
                if (need32) xq_finish(&x32, M, K, 32, lanes);
                if (needk) xq_finish(&xk, M, K, 256, lanes);
            }
            Row r[NBUF];
            memset(r, 0, sizeof r);
            int ok = 1;
            if (unpacks)
                for (int i = 0; i < NBUF; i++) ok &= row_alloc(&r[i], K, nbp, i >= UBUF ? DUP : 1);
            else if (M == 1)
                ok = (r[0].pbuf = pbuf_alloc(K)) != NULL;
            int64_t off = 0;
            for (int p = 0; p < n_parts && ok; p++) {
                int t = types[p];
                int64_t rb = row_bytes(t, K);
                const XQ *xq = is_k(t) ? &xk : &x32;
                /* weight rows a weight_rows call takes */
                int64_t tile = lanes_path(t, M) ? LANES_TILE : 8;
                #pragma omp for schedule(static) nowait
                for (int64_t n = 0; n < N[p]; n += tile)
                    weight_rows(t, w[p] + n * rb, rb, (int)(N[p] - n < tile ? N[p] - n : tile), K, M, xq, r,
                                y + off + n, n_total);
                off += N[p];
            }
            for (int i = 0; i < NBUF; i++) row_free(&r[i]);
            if (!ok) bad = 1;
        }
    }
    xq_free(&x32);
    xq_free(&xk);
    return bad ? -1 : 0;
}
