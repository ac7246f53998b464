/* q8_matmul: one row of x (decode), along K, from the weight bytes.
 * Part of q8_matmul.c's one translation unit per level, which includes the parts in order. */
#ifndef BOLT_Q8_ROW1_H
#define BOLT_Q8_ROW1_H

#ifdef SIMD
/* ---- one row of x, along K, from the weight bytes ---------------------------------------------------------- */

/* 8 vectors of 8 block products (lanes: blocks) -> per vector ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), one per lane
 * (lanes: the vectors); float addition commutes, so hadd's pairs are the scalar tree's */
static inline __m256 tree8x8(const __m256 P[8]) {
    __m256 a = _mm256_hadd_ps(P[0], P[1]), b = _mm256_hadd_ps(P[2], P[3]);
    __m256 c = _mm256_hadd_ps(P[4], P[5]), d = _mm256_hadd_ps(P[6], P[7]);
    a = _mm256_hadd_ps(a, b);
    c = _mm256_hadd_ps(c, d);
    return _mm256_add_ps(_mm256_permute2f128_ps(a, c, 0x20), _mm256_permute2f128_ps(a, c, 0x31));
}

/* 8 vectors, lanes: rows -> the same tree per lane */
static inline __m256 tree8_rows(const __m256 P[8]) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(P[0], P[1]), _mm256_add_ps(P[2], P[3])),
                         _mm256_add_ps(_mm256_add_ps(P[4], P[5]), _mm256_add_ps(P[6], P[7])));
}

static const uint8_t ZERO_BLOCK[64];  /* past a row's last block: codes, scale and x all zero, so its product is 0 */

/* Q8_0, the 8 blocks of group g of one weight row: their products (lanes: blocks). With VNNI the codes go in as
 * q + 128 (unsigned), the 128 coming off through x's sums per 32; AVX2 multiplies them signed */
static inline __m256 q8_0_p(const uint8_t *w, int64_t g, int64_t nb, const int8_t *x, const float *d,
                            const int32_t *s32) {
    __m256i v[8];
    __m128i dh = _mm_setzero_si128();  /* the 8 fp16 scales, converted at once (8 scalar stores then one vector load
                                          would stall on store forwarding) */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        int in = g + i < nb;
        const uint8_t *wb = in ? w + (g + i) * 34 : ZERO_BLOCK;
        const int8_t *xb = in ? x + 32 * (g + i) : (const int8_t *)ZERO_BLOCK;
        uint16_t h16;
        memcpy(&h16, wb, 2);
        dh = _mm_insert_epi16(dh, h16, i);
        __m256i q = _mm256_loadu_si256((const __m256i *)(wb + 2)), xv = _mm256_loadu_si256((const __m256i *)xb);
        v[i] = SIGNED_Q8 ? dot_ss(_mm256_setzero_si256(), q, xv)
                         : dot_us(_mm256_setzero_si256(), _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), xv);
    }
    __m256i isum = hsum8x8(v);
    if (!SIGNED_Q8)  /* the codes went in as q + 128 */
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(s32 + g)), 7));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_cvtph_ps(dh), _mm256_loadu_ps(d + g)));
}

/* Q4_0, Q5_0: the 8 blocks of group g, two blocks per instruction: their nibble halves loaded side by side meet x
 * in pairs (xp, XQ.qp), so one vpdpbusd covers 2 x 16 codes and 4 vectors hold the 8 blocks' lane sums (a third
 * fewer vector instructions than a block at a time: the 4-bit unpack bounds this product) */
static inline __m256 nib_p(int t, const uint8_t *w, int64_t g, int64_t nb, const int8_t *xp, const float *d,
                           const int32_t *s32) {
    int bytes = t == Q4_0 ? 18 : 22, qs = t == Q4_0 ? 2 : 6, off = t == Q4_0 ? 8 : 16;
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i v[4];
    __m128i dh = _mm_setzero_si128();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        int64_t b0 = g + 2 * i, b1 = b0 + 1;
        const uint8_t *w0 = b0 < nb ? w + b0 * bytes : ZERO_BLOCK, *w1 = b1 < nb ? w + b1 * bytes : ZERO_BLOCK;
        const int8_t *xb = b0 < nb ? xp + 32 * b0 : (const int8_t *)ZERO_BLOCK;
        uint16_t h0, h1;
        memcpy(&h0, w0, 2);
        memcpy(&h1, w1, 2);
        dh = _mm_insert_epi16(dh, h0, 2 * i);
        dh = _mm_insert_epi16(dh, h1, 2 * i + 1);
        __m256i raw = _mm256_loadu2_m128i((const __m128i *)(w1 + qs), (const __m128i *)(w0 + qs));
        __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
        if (t == Q5_0) {
            uint32_t q0, q1;
            memcpy(&q0, w0 + 2, 4);
            memcpy(&q1, w1 + 2, 4);
            lo = _mm256_or_si256(lo, fifth_bits_word((q0 & 0xFFFF) | (q1 << 16)));
            hi = _mm256_or_si256(hi, fifth_bits_word((q0 >> 16) | (q1 & 0xFFFF0000u)));
        }
        v[i] = dot_us(dot_us(_mm256_setzero_si256(), lo, _mm256_loadu_si256((const __m256i *)xb)), hi,
                      _mm256_loadu_si256((const __m256i *)(xb + 32)));
    }
    /* v[i]: lanes 0-3 block 2i, 4-7 block 2i+1 -> [0, 2, 4, 6 | 1, 3, 5, 7] -> blocks in order */
    __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i isum = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(s32 + g)),
                                                     _mm256_set1_epi32(off)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_cvtph_ps(dh), _mm256_loadu_ps(d + g)));
}

#if defined(PAIR) && defined(__AVX512VBMI__)
/* where a group of 4 contiguous Q4_0 (18-byte) / Q5_0 (22-byte) blocks keeps, for vpermt2b over its bytes: QS, the 4
 * blocks' 16 code bytes side by side; META, Q5_0's fifth bits (bytes 0-7: each block's low 16, 8-15: its high 16, as
 * the masks of the low and high nibbles) and the 4 scales (bytes 16-23) */
static const uint8_t VBMI_QS_Q4_0[64] = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 20, 21, 22, 23, 24, 25,
    26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 56, 57, 58,
    59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71};
static const uint8_t VBMI_META_Q4_0[64] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 18, 19, 36, 37, 54,
    55};
static const uint8_t VBMI_QS_Q5_0[64] = {6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 28, 29, 30, 31,
    32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 72,
    73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87};
static const uint8_t VBMI_META_Q5_0[64] = {2, 3, 24, 25, 46, 47, 68, 69, 4, 5, 26, 27, 48, 49, 70, 71, 0, 1, 22, 23,
    44, 45, 66, 67};
#endif

#ifdef PAIR
/* nib_p with a zmm: four blocks per instruction (their nibble halves side by side against x laid out in fours), the
 * fifth bits by one masked byte move per half; the same integer sums, so the same products */
static inline __m256 nib_p4(int t, const uint8_t *w, int64_t g, int64_t nb, const int8_t *xp, const float *d,
                            const int32_t *s32) {
    int bytes = t == Q4_0 ? 18 : 22, qs = t == Q4_0 ? 2 : 6, off = t == Q4_0 ? 8 : 16;
    const __m512i low = _mm512_set1_epi8(0x0F), five = _mm512_set1_epi8(0x10);
    __m512i v[2];
    __m128i dh = _mm_setzero_si128();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const uint8_t *wb[4];
        uint64_t m_lo = 0, m_hi = 0;
        __m512i raw;
#ifdef __AVX512VBMI__
        if (g + 4 * h + 4 <= nb) {  /* the 4 blocks are 4 * bytes contiguous bytes: two loads, two byte permutes */
            const uint8_t *base = w + (g + 4 * h) * bytes;
            __m512i A = _mm512_loadu_si512(base);
            __m512i B = _mm512_maskz_loadu_epi8((__mmask64)((1ULL << (4 * bytes - 64)) - 1), base + 64);
            raw = _mm512_permutex2var_epi8(A, _mm512_loadu_si512(t == Q4_0 ? VBMI_QS_Q4_0 : VBMI_QS_Q5_0), B);
            __m512i meta = _mm512_permutex2var_epi8(A, _mm512_loadu_si512(t == Q4_0 ? VBMI_META_Q4_0 : VBMI_META_Q5_0),
                                                    B);
            long long d4 = _mm_cvtsi128_si64(_mm512_extracti32x4_epi32(meta, 1));
            dh = h == 0 ? _mm_insert_epi64(dh, d4, 0) : _mm_insert_epi64(dh, d4, 1);
            if (t == Q5_0) {
                m_lo = (uint64_t)_mm_cvtsi128_si64(_mm512_castsi512_si128(meta));
                m_hi = (uint64_t)_mm_extract_epi64(_mm512_castsi512_si128(meta), 1);
            }
        } else
#endif
        {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            int64_t b = g + 4 * h + i;
            wb[i] = b < nb ? w + b * bytes : ZERO_BLOCK;
            uint16_t h16;
            memcpy(&h16, wb[i], 2);
            dh = _mm_insert_epi16(dh, h16, 4 * h + i);
            if (t == Q5_0) {
                uint32_t q5;
                memcpy(&q5, wb[i] + 2, 4);
                m_lo |= (uint64_t)(q5 & 0xFFFF) << (16 * i);
                m_hi |= (uint64_t)(q5 >> 16) << (16 * i);
            }
        }
        raw = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(wb[0] + qs)));
        raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(wb[1] + qs)), 1);
        raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(wb[2] + qs)), 2);
        raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(wb[3] + qs)), 3);
        }
        __m512i lo = _mm512_and_si512(raw, low), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
        if (t == Q5_0) {
            lo = _mm512_mask_mov_epi8(lo, (__mmask64)m_lo, _mm512_or_si512(lo, five));
            hi = _mm512_mask_mov_epi8(hi, (__mmask64)m_hi, _mm512_or_si512(hi, five));
        }
        int64_t b0 = g + 4 * h;
        const int8_t *xb = b0 < nb ? xp + 32 * b0 : (const int8_t *)ZERO_BLOCK;
        v[h] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xb)), hi,
                                   _mm512_loadu_si512(b0 < nb ? xb + 64 : (const int8_t *)ZERO_BLOCK));
    }
    /* each 128-bit lane (a block) summed into all its 4 int32, then lane 0 of each block in block order */
    for (int h = 0; h < 2; h++) {
        v[h] = _mm512_add_epi32(v[h], _mm512_shuffle_epi32(v[h], (_MM_PERM_ENUM)0x4E));
        v[h] = _mm512_add_epi32(v[h], _mm512_shuffle_epi32(v[h], (_MM_PERM_ENUM)0xB1));
    }
    __m512i c = _mm512_permutex2var_epi32(v[0], _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0,
                                                                   0), v[1]);
    __m256i isum = _mm512_castsi512_si256(c);
    isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(s32 + g)),
                                                     _mm256_set1_epi32(off)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_cvtph_ps(dh), _mm256_loadu_ps(d + g)));
}
#define NIB_P nib_p4
#else
#define NIB_P nib_p
#endif

/* Q4_K superblock b: nibbles times x (vpmaddubsw), the 6-bit scales onto the int16 pair sums (vpmaddwd), the mins
 * through x's sums per 32 */
static inline float q4_k_p(const uint8_t *wb, const int8_t *xb, float dx, const int16_t *h32b) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    /* the 12 bytes of 6-bit scales and mins -> 8 scale bytes then 8 min bytes, by 32-bit masks and shifts (bits laid
     * out as k_scale_min reads them) */
    uint32_t u[4];
    memcpy(u, wb + 4, 12);
    uint32_t mins_hi = ((u[2] >> 4) & 0x0F0F0F0F) | (((u[1] >> 6) & 0x03030303) << 4);
    uint32_t mins_lo = u[1] & 0x3F3F3F3F;
    uint32_t sc_hi = (u[2] & 0x0F0F0F0F) | (((u[0] >> 6) & 0x03030303) << 4);
    uint32_t sc_lo = u[0] & 0x3F3F3F3F;
    __m256i sm = _mm256_cvtepu8_epi16(_mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mins_lo, (int)mins_hi));
    __m128i sc8 = _mm256_castsi256_si128(sm);  /* int16 scales 0..7 */
    __m256i scb = _mm256_broadcastsi128_si256(sc8);
    __m256i a = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(wb + 16 + 32 * k));
        __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(v, low), _mm256_loadu_si256((const __m256i *)(xb + 64 * k)));
        __m256i p1 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                                          _mm256_loadu_si256((const __m256i *)(xb + 64 * k + 32)));
        /* int16 scale 2k (then 2k + 1) in every lane: bytes 4k, 4k + 1 (4k + 2, 4k + 3) of the scales */
        __m256i s0 = _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)(0x0100 * (4 * k + 1) + 4 * k)));
        __m256i s1 = _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)(0x0100 * (4 * k + 3) + 4 * k + 2)));
        a = madd_acc(a, p0, s0);
        a = madd_acc(a, p1, s1);
    }
    int32_t js = -hsum_i32_128(_mm_madd_epi16(_mm256_extracti128_si256(sm, 1), _mm_loadu_si128((const __m128i *)h32b)));
    return block_p(1, hsum_i32(a), js, f16c(wb), f16c(wb + 2), dx);
}

/* Q6_K superblock: 6-bit codes (0..63) times x, the int8 scales per 16 onto the pair sums, the -32 through x's sums
 * per 16 */
static inline float q6_k_p(const uint8_t *wb, const int8_t *xb, float dx, const int16_t *h16b) {
    const int8_t *s8 = (const int8_t *)(wb + 192);
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)s8));  /* the 16 scales */
    __m256i a = _mm256_setzero_si256();
    for (int half = 0; half < 2; half++) {
        __m256i codes[4];
        q6_k_codes(wb, half, codes);
        for (int k = 0; k < 4; k++) {
            int j = 4 * half + k;  /* 32 codes: sub-blocks 2j (int16 lanes 0-7) and 2j+1 (8-15) */
            __m256i u = codes[k];
            __m256i pr = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(xb + 32 * j)));
            __m256i scales = _mm256_set_m128i(_mm_set1_epi16((short)s8[2 * j + 1]), _mm_set1_epi16((short)s8[2 * j]));
            a = madd_acc(a, pr, scales);
        }
    }
    int32_t cor = hsum_i32(_mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)h16b)));
    return block_p(0, hsum_i32(a) - 32 * cor, 0, f16c(wb + 208), 0.0f, dx);
}

/* R <= 8 weight rows (rb bytes apart) against one row of x, along K: out[r]. Each weight row is read through in turn
 * (one memory stream: interleaving the 8 rows' bytes tripled the time of the cold Q8_0 head), its products kept in
 * pbuf [groups][8 rows][8]; then the rows' trees run side by side as lanes, so their float tails overlap instead of
 * queueing (one row at a time, the chain of group sums was a quarter of a Q5_0 decode product's time). */
static inline __attribute__((always_inline)) void tile1(int t, const uint8_t *w, int64_t rb, int R, int64_t K,
                                                        const XQ *xq, float *pbuf, float *out) {
    __m256 acc = _mm256_setzero_ps(), P[8];
    if (!is_k(t)) {
        int64_t nb = K / 32, ng = (nb + 7) / 8;
        for (int r = 0; r < 8; r++) {
            for (int64_t g = 0; g < ng; g++)
                _mm256_storeu_ps(pbuf + (g * 8 + r) * 8,
                                 r >= R ? _mm256_setzero_ps()
                                 : t == Q8_0 ? q8_0_p(w + r * rb, 8 * g, nb, xq->q, xq->d, xq->s32)
                                             : NIB_P(t, w + r * rb, 8 * g, nb, xq->qp, xq->d, xq->s32));
        }
        for (int64_t g = 0; g < ng; g++) {
            for (int r = 0; r < 8; r++) P[r] = _mm256_loadu_ps(pbuf + (g * 8 + r) * 8);
            acc = _mm256_add_ps(acc, tree8x8(P));
        }
    } else {
        int64_t nb = K / 256, nbp = (nb + 7) / 8 * 8;
        int bytes = t == Q4_K ? 144 : 210;
        memset(pbuf, 0, sizeof(float) * (size_t)(nbp * 8));
        for (int r = 0; r < R; r++) {
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *wb = w + r * rb + b * bytes;
                pbuf[b * 8 + r] = t == Q4_K ? q4_k_p(wb, xq->q + 256 * b, xq->d[b], xq->h32 + 8 * b)
                                            : q6_k_p(wb, xq->q + 256 * b, xq->d[b], xq->h16 + 16 * b);
            }
        }
        for (int64_t g = 0; g < nbp; g += 8) {
            for (int i = 0; i < 8; i++) P[i] = _mm256_loadu_ps(pbuf + (g + i) * 8);
            acc = _mm256_add_ps(acc, tree8_rows(P));
        }
    }
    float o[8];
    _mm256_storeu_ps(o, acc);
    memcpy(out, o, (size_t)R * sizeof(float));
}

/* the other types: from the unpacked row, signed codes times x */
static float row1_unpacked(int t, const Row *r, int64_t K, const int8_t *x, const float *d, const int16_t *h32) {
    int64_t nb = K / block_len(t);
    int sl = is_k(t) ? sub_len(t) : 32, mins = has_min(t);
    float acc = 0.0f, p[8];
    for (int64_t g = 0; g < nb; g += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t b = g + i;
            if (b >= nb) {
                p[i] = 0.0f;
                continue;
            }
            int32_t is = 0, js = 0;
            for (int64_t e = block_len(t) * b; e < block_len(t) * (b + 1); e += 32) {
                __m256i dot = dot_ss(_mm256_setzero_si256(), _mm256_loadu_si256((const __m256i *)(r->q + e)),
                                     _mm256_loadu_si256((const __m256i *)(x + e)));
                if (!is_k(t)) {
                    is += hsum_i32(dot);
                } else if (sl == 32) {
                    is += r->sc[e / 32] * hsum_i32(dot);
                } else {  /* lanes 0-3: the first 16, 4-7: the next 16 */
                    __m256i sv = _mm256_set_m128i(_mm_set1_epi32(r->sc[e / 16 + 1]), _mm_set1_epi32(r->sc[e / 16]));
                    is += hsum_i32(_mm256_mullo_epi32(dot, sv));
                }
            }
            if (t == Q4_1 || t == Q5_1) js = h32[b];
            if (t == Q4_K || t == Q5_K)
                for (int j = 0; j < 8; j++) js -= r->mn[8 * b + j] * h32[8 * b + j];
            p[i] = block_p(mins, is, js, r->dw[b], r->mw[b], d[b]);
        }
        acc = acc + tree8(p);
    }
    return acc;
}

#endif /* SIMD */

#endif
