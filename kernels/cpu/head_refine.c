/* The output head's exact logits for its top candidates (QuantLinear._refine_top's C form).
 *
 * The head's int8 product (q8_matmul.c, as llama.cpp computes it) rounds x to 8 bits per block, so near-ties between
 * the top tokens can order differently than in exact arithmetic. Every logit within `margin` of its row's best is
 * recomputed from the GGUF row, dequantized as gguf_dequant.c does (the reference's values bit for bit), against x
 * in double, and rounded once to fp32: at least as exact as the torch form's fp32 sum. In torch this was ~1 ms a step
 * (a compare and `nonzero` over the 150-260k logits, a row gather, the dequantization in torch ops); here a scan
 * and a few hundred short dots, ~0.05 ms. Built and loaded by kernels/cpu/native.py. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "vec_f32.h"

int bolt_dequant_rows(int type, const uint8_t *src, int64_t row0, int64_t row1, int64_t n_cols, void *dst,
                      int out_bf16);

/* y [T, N] (the approximate logits, refined in place), x [T, K], w: the head's GGUF bytes (N rows of row_bytes
 * holding K values each). Returns 0;
 * 1 without touching y when more than max_cand * T logits are candidates (a flat distribution: the caller ranks
 * them), or when a row holds a NaN (the torch form then refines nothing either); -1 for no memory or a bad type. */
int bolt_head_refine(const float *x, float *y, int64_t T, const uint8_t *w, int type, int64_t N, int64_t K,
                     int64_t row_bytes, float margin, int64_t max_cand) {
    if (T < 1 || N < 1 || K < 1 || row_bytes < 1 || max_cand < 1) return -1;
    int64_t cap = max_cand * T, nc = 0;
    int64_t *cand = malloc(sizeof(int64_t) * (size_t)cap);  /* t * N + n of each candidate */
    float *row = malloc(sizeof(float) * (size_t)K);
    int rc = cand && row ? 0 : -1;
    for (int64_t t = 0; t < T && !rc; t++) {
        const float *yt = y + t * N;
        float m = -INFINITY, bad = 0.0f;  /* bad: the sum of y - y, NaN where a logit is NaN or infinite */
        int64_t n = 0;
#ifdef AW
        av mv = AV_SET1(-INFINITY), bv = AV_ZERO;
        for (; n + AW <= N; n += AW) {
            av v = AV_LOAD(yt + n);
            mv = AV_MAX(mv, v);
            bv = AV_ADD(bv, AV_SUB(v, v));
        }
        float lanes[AW];
        AV_STORE(lanes, mv);
        for (int i = 0; i < AW; i++) m = lanes[i] > m ? lanes[i] : m;
        bad = AV_HSUM(bv);
#endif
        for (; n < N; n++) {
            m = yt[n] > m ? yt[n] : m;
            bad += yt[n] - yt[n];
        }
        if (bad != 0.0f) {  /* a NaN or an infinity: the torch form decides */
            rc = 1;
            break;
        }
        float floor = m - margin;
        n = 0;
#ifdef AW
        for (; n + AW <= N && !rc; n += AW) {
            unsigned hit = AV_GE_MASK(AV_LOAD(yt + n), AV_SET1(floor));
            for (int i = 0; hit && !rc; i++, hit >>= 1) {
                if (!(hit & 1)) continue;
                if (nc == cap) rc = 1;  /* a flat distribution */
                else cand[nc++] = t * N + n + i;
            }
        }
#endif
        for (; n < N && !rc; n++) {
            if (yt[n] < floor) continue;
            if (nc == cap) rc = 1;
            else cand[nc++] = t * N + n;
        }
    }
    for (int64_t i = 0; i < nc && !rc; i++) {  /* y is touched only once every candidate is known */
        int64_t t = cand[i] / N, n = cand[i] % N;
        const float *xt = x + t * K;
        if (bolt_dequant_rows(type, w + n * row_bytes, 0, 1, K, row, 0)) {
            rc = -1;
            break;
        }
        double acc[8] = {0};  /* 8 partial sums in double (vectorized): their order moves the double's last bits only */
        int64_t k = 0;
        for (; k + 8 <= K; k += 8)
            for (int j = 0; j < 8; j++) acc[j] += (double)row[k + j] * xt[k + j];
        for (; k < K; k++) acc[0] += (double)row[k] * xt[k];
        y[cand[i]] = (float)(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
    }
    free(cand);
    free(row);
    return rc;
}
