/* The output head's exact logits for its top candidates (QuantLinear._refine_top's C form).
 *
 * The head's int8 product (q8_matmul.c, as llama.cpp computes it) rounds x to 8 bits per block, so near-ties between
 * the top tokens can order differently than in exact arithmetic. Every logit within `margin` of its row's best (in a
 * flat row, only the best max_cand of those) is recomputed from the GGUF row, dequantized as gguf_dequant.c does (the
 * reference's values bit for bit), against x in double, and rounded once to fp32: at least as exact as the torch
 * form's fp32 sum. In torch this was ~1 ms a step (a compare and `nonzero` over the 150-260k logits, a row gather,
 * the dequantization in torch ops); here a scan and a few hundred short dots, ~0.05 ms. Built and loaded by
 * kernels/cpu/native.py. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "vec_f32.h"

int bolt_dequant_rows(int type, const uint8_t *src, int64_t row0, int64_t row1, int64_t n_cols, void *dst,
                      int out_bf16);

/* the k-th largest of a[0..n) (1 <= k <= n; a is reordered): quickselect, Hoare's partition, descending */
static float kth_largest(float *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float p = a[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > p) i++;
            while (a[j] < p) j--;
            if (i <= j) {
                float t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (want <= j) hi = j;  /* a[lo..j] >= p >= a[i..hi], a[j+1..i-1] == p */
        else if (want >= i) lo = i;
        else return p;
    }
    return a[want];
}

/* row yt's max and the sum of yt - yt (NaN where a logit is NaN or infinite) */
static float row_max(const float *yt, int64_t N, float *bad) {
    float m = -INFINITY, b = 0.0f;
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
    b = AV_HSUM(bv);
#endif
    for (; n < N; n++) {
        m = yt[n] > m ? yt[n] : m;
        b += yt[n] - yt[n];
    }
    *bad = b;
    return m;
}

/* the columns of yt at or above floor, in order, into idx; their count */
static int64_t at_least(const float *yt, int64_t N, float floor, int64_t *idx) {
    int64_t c = 0, n = 0;
#ifdef AW
    for (; n + AW <= N; n += AW)
        for (unsigned hit = AV_GE_MASK(AV_LOAD(yt + n), AV_SET1(floor)), i = 0; hit; i++, hit >>= 1)
            if (hit & 1) idx[c++] = n + i;
#endif
    for (; n < N; n++)
        if (yt[n] >= floor) idx[c++] = n;
    return c;
}

/* y [T, N] (the approximate logits, refined in place), x [T, K], w: the head's GGUF bytes (N rows of row_bytes
 * holding K values each). A row's candidates are its logits within `margin` of its best; where they are more than
 * max_cand (a flat distribution), its max_cand best (ties at the last place by column). Each row's candidates
 * depend on that row alone, so a row of a DFlash verify block gets the values a decode step gets for it.
 * Returns 0; 1 without touching y when a row holds a NaN or an infinity (the torch form then refines nothing
 * either); -1 for no memory or a bad type. */
int bolt_head_refine(const float *x, float *y, int64_t T, const uint8_t *w, int type, int64_t N, int64_t K,
                     int64_t row_bytes, float margin, int64_t max_cand) {
    if (T < 1 || N < 1 || K < 1 || row_bytes < 1 || max_cand < 1) return -1;
    float *best = malloc(sizeof(float) * (size_t)T);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)N);  /* one row's candidates */
    float *vals = malloc(sizeof(float) * (size_t)N), *row = malloc(sizeof(float) * (size_t)K);
    int rc = best && idx && vals && row ? 0 : -1;
    for (int64_t t = 0; t < T && !rc; t++) {  /* y is touched only once every row is known to be finite */
        float bad;
        best[t] = row_max(y + t * N, N, &bad);
        if (bad != 0.0f) rc = 1;
    }
    for (int64_t t = 0; t < T && !rc; t++) {
        float *yt = y + t * N;
        const float *xt = x + t * K;
        int64_t nc = at_least(yt, N, best[t] - margin, idx);
        if (nc > max_cand) {  /* keep the max_cand best: those above the max_cand-th value, then its ties in order */
            for (int64_t i = 0; i < nc; i++) vals[i] = yt[idx[i]];
            float kth = kth_largest(vals, nc, max_cand);
            int64_t above = 0, kept = 0;
            for (int64_t i = 0; i < nc; i++) above += yt[idx[i]] > kth;
            for (int64_t i = 0, ties = max_cand - above; i < nc; i++)
                if (yt[idx[i]] > kth || (yt[idx[i]] == kth && ties-- > 0)) idx[kept++] = idx[i];
            nc = kept;
        }
        for (int64_t i = 0; i < nc; i++) {
            if (bolt_dequant_rows(type, w + idx[i] * row_bytes, 0, 1, K, row, 0)) {
                rc = -1;
                break;
            }
            double acc[8] = {0};  /* 8 partial sums in double (vectorized): their order moves the double's last bits */
            int64_t k = 0;
            for (; k + 8 <= K; k += 8)
                for (int j = 0; j < 8; j++) acc[j] += (double)row[k + j] * xt[k + j];
            for (; k < K; k++) acc[0] += (double)row[k] * xt[k];
            vals[i] = (float)(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
        }
        for (int64_t i = 0; i < nc && !rc; i++) yt[idx[i]] = vals[i];  /* after the row's ranking is done */
    }
    free(best);
    free(idx);
    free(vals);
    free(row);
    return rc;
}
