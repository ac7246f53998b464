/* fp32 vectors for the C kernels built with -march=native (attention_step.c, layer_step.c): AW lanes of AVX-512
 * (16) or AVX2 + FMA (8) behind one set of AV_* names, and a vector exp; AW undefined on other CPUs (portable loops).
 * Hashed with the sources by kernels/cpu/native.py (every *.h of kernels/cpu). */
#ifndef BOLT_VEC_F32_H
#define BOLT_VEC_F32_H

#include <math.h>
#include <stdint.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define AW 16
typedef __m512 av;
#define AV_LOAD _mm512_loadu_ps
#define AV_STORE _mm512_storeu_ps
#define AV_SET1 _mm512_set1_ps
#define AV_ZERO _mm512_setzero_ps()
#define AV_FMA _mm512_fmadd_ps
#define AV_ADD _mm512_add_ps
#define AV_MUL _mm512_mul_ps
#define AV_SUB _mm512_sub_ps
#define AV_MAX _mm512_max_ps
#define AV_ROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define AV_HSUM _mm512_reduce_add_ps
#define AV_DIV _mm512_div_ps
#define AV_ABS _mm512_abs_ps
#define AV_GE_MASK(a, b) ((unsigned)_mm512_cmp_ps_mask(a, b, _CMP_GE_OQ))  /* lane i: a[i] >= b[i] */
#define AV_WHERE_NEG(x, a, b) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, AV_ZERO, _CMP_LT_OQ), a, b)  /* x < 0 ? b : a */
static inline av av_pow2(av y, av n) { return _mm512_scalef_ps(y, n); }
static inline av av_zero_where_neg_inf(av e, av x) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, AV_SET1(-INFINITY), _CMP_NEQ_OQ), e);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define AW 8
typedef __m256 av;
#define AV_LOAD _mm256_loadu_ps
#define AV_STORE _mm256_storeu_ps
#define AV_SET1 _mm256_set1_ps
#define AV_ZERO _mm256_setzero_ps()
#define AV_FMA _mm256_fmadd_ps
#define AV_ADD _mm256_add_ps
#define AV_MUL _mm256_mul_ps
#define AV_SUB _mm256_sub_ps
#define AV_MAX _mm256_max_ps
#define AV_ROUND(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define AV_DIV _mm256_div_ps
#define AV_ABS(x) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x)
#define AV_GE_MASK(a, b) ((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GE_OQ)))  /* lane i: a[i] >= b[i] */
#define AV_WHERE_NEG(x, a, b) _mm256_blendv_ps(a, b, _mm256_cmp_ps(x, AV_ZERO, _CMP_LT_OQ))  /* x < 0 ? b : a */
static inline float AV_HSUM(av v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
static inline av av_pow2(av y, av n) {  /* y * 2^n, n integral in [-127, 127] */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
static inline av av_zero_where_neg_inf(av e, av x) {
    return _mm256_and_ps(e, _mm256_cmp_ps(x, AV_SET1(-INFINITY), _CMP_NEQ_OQ));
}
#endif

#ifdef AW
/* exp(x), x <= 0 (a score minus the row's max): 2^n e^r with |r| <= ln2/2 and Cephes' degree-6 expf polynomial (rel.
 * error ~1e-7, the float rounding of expf); x = -inf gives 0 */
static inline av av_exp(av x) {
    av xc = AV_MAX(x, AV_SET1(-87.0f));
    av n = AV_ROUND(AV_MUL(xc, AV_SET1(1.44269504088896341f)));
    av r = AV_SUB(AV_SUB(xc, AV_MUL(n, AV_SET1(0.693359375f))), AV_MUL(n, AV_SET1(-2.12194440e-4f)));
    av p = AV_SET1(1.9875691500e-4f);
    p = AV_FMA(p, r, AV_SET1(1.3981999507e-3f));
    p = AV_FMA(p, r, AV_SET1(8.3334519073e-3f));
    p = AV_FMA(p, r, AV_SET1(4.1665795894e-2f));
    p = AV_FMA(p, r, AV_SET1(1.6666665459e-1f));
    p = AV_FMA(p, r, AV_SET1(5.0000001201e-1f));
    av y = AV_ADD(AV_FMA(AV_MUL(p, r), r, r), AV_SET1(1.0f));
    return av_zero_where_neg_inf(av_pow2(y, n), x);
}
#endif /* AW */

#endif
