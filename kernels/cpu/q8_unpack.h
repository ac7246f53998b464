/* q8_matmul: a weight row unpacked into codes and integer scales, the per-block integers every level computes,
 * and the portable loop.
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order. */
#ifndef BOLT_Q8_UNPACK_H
#define BOLT_Q8_UNPACK_H

/* ---- a weight row, unpacked (several rows of x, and the portable loop) ---------------------------------------- */

/* q: signed codes [K] (after the offset: Q4_0 n - 8, Q5_0 n - 16, Q6_K n - 32; the types with a min keep n); per
 * block (nbp, padding zero) dw and mw (the min's scale, or dmin); K-quants: the integer scale sc per sub-block
 * (K / sub_len) and mn per 32, with mnp the pairs (mn[2i], mn[2i+1]) and scp the pairs (sc[2i], sc[2i+1]) of a
 * per-16 scale, each as two int16.
 * The rows-as-lanes product (the types without a vectorized kernel) takes these codes as they are: unsigned, with
 * their min. */
typedef struct {
    int8_t *q;
    float *dw, *mw;
    int32_t *sc, *mn, *mnp, *scp;
    float *pbuf;  /* tile1's products: (K / 256 + 8) * 64 floats */
} Row;

/* Q4_K / Q5_K superblock sb at w: its 6-bit scales and mins per 32, and the mins in pairs for vpmaddwd */
static inline __attribute__((always_inline)) void k_scales(const uint8_t *w, int64_t sb, Row *r) {
#pragma GCC unroll 8  /* j constant: no branch per scale (out of line and rolled it was a third of Q4_K's verify) */
    for (int j = 0; j < 8; j++) {
        int s, m;
        k_scale_min(j, w + 4, &s, &m);
        r->sc[8 * sb + j] = s;
        r->mn[8 * sb + j] = m;
    }
    for (int i = 0; i < 4; i++) r->mnp[4 * sb + i] = pair16(r->mn[8 * sb + 2 * i], r->mn[8 * sb + 2 * i + 1]);
}

static void unpack_scalar(int t, const uint8_t *w, int64_t K, Row *r) {
    int8_t *u = r->q;
    if (!is_k(t)) {
        int bytes = t == Q4_0 ? 18 : t == Q4_1 ? 20 : t == Q5_0 ? 22 : t == Q5_1 ? 24 : 34;
        for (int64_t b = 0; b < K / 32; b++, w += bytes, u += 32) {
            r->dw[b] = f16(w);
            r->mw[b] = (t == Q4_1 || t == Q5_1) ? f16(w + 2) : 0.0f;
            if (t == Q8_0) {
                memcpy(u, w + 2, 32);
            } else if (t == Q4_0 || t == Q4_1) {
                const uint8_t *qs = w + (t == Q4_0 ? 2 : 4);
                int off = t == Q4_0 ? 8 : 0;
                for (int j = 0; j < 16; j++) {
                    u[j] = (int8_t)((qs[j] & 0xF) - off);
                    u[j + 16] = (int8_t)((qs[j] >> 4) - off);
                }
            } else {
                const uint8_t *h = w + (t == Q5_0 ? 2 : 4), *qs = w + (t == Q5_0 ? 6 : 8);
                uint32_t qh = (uint32_t)h[0] | ((uint32_t)h[1] << 8) | ((uint32_t)h[2] << 16) | ((uint32_t)h[3] << 24);
                int off = t == Q5_0 ? 16 : 0;
                for (int j = 0; j < 16; j++) {
                    u[j] = (int8_t)(((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - off);
                    u[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off);
                }
            }
        }
        return;
    }
    int bytes = t == Q4_K ? 144 : t == Q5_K ? 176 : 210;
    for (int64_t sb = 0; sb < K / 256; sb++, w += bytes, u += 256) {
        if (t == Q6_K) {
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *s8 = (const int8_t *)(w + 192);
            r->dw[sb] = f16(w + 208);
            r->mw[sb] = 0.0f;
            for (int n = 0; n < 256; n += 128, ql += 64, qh += 32)
                for (int l = 0; l < 32; l++) {
                    u[n + l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                    u[n + l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    u[n + l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    u[n + l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            for (int i = 0; i < 16; i++) r->sc[16 * sb + i] = s8[i];
        } else {
            const uint8_t *qh = w + 16, *ql = t == Q4_K ? w + 16 : w + 48;
            r->dw[sb] = f16(w);
            r->mw[sb] = f16(w + 2);
            for (int g = 0; g < 4; g++, ql += 32)
                for (int l = 0; l < 32; l++) {
                    u[64 * g + l] = (int8_t)(ql[l] & 0xF);
                    u[64 * g + 32 + l] = (int8_t)(ql[l] >> 4);
                    if (t == Q5_K) {
                        u[64 * g + l] |= (int8_t)(((qh[l] >> (2 * g)) & 1) << 4);
                        u[64 * g + 32 + l] |= (int8_t)(((qh[l] >> (2 * g + 1)) & 1) << 4);
                    }
                }
            k_scales(w, sb, r);
        }
    }
}

/* per block: isum and jsum from the unpacked row (the definition every level computes) */
static void block_ints(int t, const Row *r, int64_t b, const int8_t *q, const int16_t *h32, int32_t *isum,
                       int32_t *jsum) {
    int bl = block_len(t), sl = is_k(t) ? sub_len(t) : 32;
    int32_t is = 0, js = 0;
    for (int s = 0; s < bl / sl; s++) {
        int64_t e = bl * b + sl * s;
        int32_t dot = 0;
        for (int j = 0; j < sl; j++) dot += (int32_t)r->q[e + j] * q[e + j];
        is += is_k(t) ? r->sc[e / sl] * dot : dot;
    }
    if (t == Q4_1 || t == Q5_1) js = h32[b];
    if (t == Q4_K || t == Q5_K)
        for (int j = 0; j < 8; j++) js -= r->mn[8 * b + j] * h32[8 * b + j];
    *isum = is;
    *jsum = js;
}

static inline float tree8(const float *p) { return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])); }

/* the float side of one block, as every path computes it */
static inline float block_p(int mins, int32_t isum, int32_t jsum, float dw, float mw, float dx) {
    float p = (float)isum * (dw * dx);
    return mins ? p + (float)jsum * (mw * dx) : p;
}

__attribute__((unused)) static float row1_scalar(int t, const Row *r, int64_t K, const int8_t *q, const float *d,
                                                 const int16_t *h32) {
    int64_t nb = K / block_len(t);
    float acc = 0.0f, p[8];
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            int32_t is, js;
            if (b < nb) block_ints(t, r, b, q, h32, &is, &js);
            p[i] = b < nb ? block_p(has_min(t), is, js, r->dw[b], r->mw[b], d[b]) : 0.0f;
        }
        acc = acc + tree8(p);
    }
    return acc;
}



#endif
