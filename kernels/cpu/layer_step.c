/* One decoder layer of a few new tokens (a decode step, a DFlash verify block) on the CPU, in one call: norm, the
 * QKV projection, the attention step, the output projection and the residual, norm, the gate|up projection, the
 * gated activation, the down projection and the residual (Gemma's post-norms where the layer has them).
 *
 * Why one call: the same layer as kernels.ops calls from Python is ~8 ctypes calls and torch ops (~60 us of Python,
 * argument conversion and dispatch per layer), ~1.5-2.5 ms of a 12-18 ms decode step on 2 cores; the arithmetic in
 * between (norms, adds, the activation) is a few microseconds. The matmuls and the attention are the very same C
 * functions the op-by-op path calls (bolt_q8_parts_<level>, bolt_attention_step, bolt_rms_norm), so the layer's
 * output equals that path's but for the activation: exp comes from vec_f32.h's polynomial (rel. error ~1e-7) where
 * torch uses its own vectorized exp, so the two differ by float rounding. Each row's arithmetic is its own, whatever
 * T is: a verify block's row still equals the decode step at that position, bit for bit.
 *
 * Built and loaded by kernels/cpu/native.py (the layout of BoltLayer is mirrored by kernels/cpu/layer.py); the
 * reference is the op-by-op Block.mix / Block.ffn of bolt_ros/engine/model/transformer.py (test_native_layer.py). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec_f32.h"

/* the leveled int8 matmul (q8_matmul.c), as native.py hands over the level this CPU runs */
typedef int (*q8_parts_fn)(int n_parts, const int *types, const uint8_t *const *w, const int64_t *N, int64_t K,
                           const float *x, int64_t M, float *y, int n_threads);

int bolt_rms_norm(const float *x, const float *w, const float *r, float *y, int64_t rows, int64_t D, float eps);
int bolt_attention_step(const float *qkv, int64_t T, int64_t n_head, int64_t n_kv, int64_t hd, const float *bias,
                        const float *q_norm, const float *k_norm, int v_norm, float eps, const float *cos,
                        const float *sin, int64_t P, int neox, float *kc, float *vc, int64_t *pos, int64_t S,
                        int write, const int64_t *positions, int ring, int64_t n_scan, int64_t window,
                        float scale, float *out, int n_threads);

/* GGUF weights side by side (one part, or q|k|v, gate|up), as bolt_q8_parts takes them */
typedef struct {
    int32_t n_parts;
    const int32_t *types;
    const uint8_t *const *w;
    const int64_t *rows;
    int64_t n_out;
} BoltLinear;

typedef struct {
    q8_parts_fn matmul;
    int64_t n_embd, n_ff;
    float eps;
    int32_t act;                                  /* 0: silu (llama, Qwen), 1: gelu, tanh form (Gemma) */
    const float *attn_norm, *ffn_norm;
    const float *post_attn_norm, *post_ffn_norm;  /* NULL: the plain residual add */
    BoltLinear qkv, o, gate_up, down;
    int64_t n_head, n_kv, head_dim, window;
    const float *bias, *q_norm, *k_norm;
    int32_t v_norm, writes_kv;
    float head_eps, scale;
} BoltLayer;

/* up[j] * act(gate[j]) for n values; sigmoid and tanh from exp(-|.|) <= 1, so nothing overflows */
static void act_mul(int act, const float *gate, const float *up, float *out, int64_t n) {
    const float c = 0.7978845608028654f, k = 0.044715f;  /* sqrt(2/pi), the cubic's weight */
    int64_t j = 0;
#ifdef AW
    const av one = AV_SET1(1.0f), half = AV_SET1(0.5f);
    for (; j + AW <= n; j += AW) {
        av x = AV_LOAD(gate + j), y;
        if (act == 0) {  /* x * sigmoid(x): e = exp(-|x|); sigmoid = 1 / (1 + e) for x >= 0, e / (1 + e) below */
            av e = av_exp(AV_SUB(AV_ZERO, AV_ABS(x)));
            y = AV_MUL(x, AV_DIV(AV_WHERE_NEG(x, one, e), AV_ADD(one, e)));
        } else {         /* x/2 (1 + tanh(u)), u = c (x + k x^3); tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2|u|) */
            av u = AV_MUL(AV_SET1(c), AV_ADD(x, AV_MUL(AV_SET1(k), AV_MUL(x, AV_MUL(x, x)))));
            av e = av_exp(AV_MUL(AV_SET1(-2.0f), AV_ABS(u)));
            av t = AV_DIV(AV_SUB(one, e), AV_ADD(one, e));
            y = AV_MUL(AV_MUL(half, x), AV_ADD(one, AV_WHERE_NEG(u, t, AV_SUB(AV_ZERO, t))));
        }
        AV_STORE(out + j, AV_MUL(y, AV_LOAD(up + j)));
    }
#endif
    for (; j < n; j++) {
        float x = gate[j], y;
        if (act == 0) {
            float e = expf(-fabsf(x));
            y = x * ((x < 0.0f ? e : 1.0f) / (1.0f + e));
        } else {
            float u = c * (x + k * (x * (x * x)));
            float e = expf(-2.0f * fabsf(u));
            float t = (1.0f - e) / (1.0f + e);
            y = (0.5f * x) * (1.0f + (u < 0.0f ? -t : t));
        }
        out[j] = y * up[j];
    }
}

/* gu [T, 2F] (gate | up per row) -> out [T, F] = act(gate) * up; also what the tests check against torch */
int bolt_act_mul(int act, const float *gu, float *out, int64_t T, int64_t F) {
    if ((act != 0 && act != 1) || T < 1 || F < 1) return -1;
    for (int64_t t = 0; t < T; t++) act_mul(act, gu + t * 2 * F, gu + t * 2 * F + F, out + t * F, F);
    return 0;
}

static int linear(const BoltLayer *L, const BoltLinear *l, const float *x, int64_t K, int64_t T, float *y,
                  int threads) {
    return L->matmul(l->n_parts, l->types, l->w, l->rows, K, x, T, y, threads);
}

/* h + norm(x) * w (a post-norm), or h + x, into out (out may be h) */
static int residual(const float *h, const float *x, const float *post_norm, float *out, int64_t T, int64_t D,
                    float eps) {
    if (post_norm) return bolt_rms_norm(x, post_norm, h, out, T, D, eps);
    for (int64_t i = 0; i < T * D; i++) out[i] = h[i] + x[i];
    return 0;
}

/* h [T, n_embd] -> out [T, n_embd] (out != h); the cache and the step's angles as bolt_attention_step takes them.
 * Returns 0, or -1 (bad sizes, no memory, or a kernel's refusal: then nothing of the cache beyond this step's slots
 * was touched, as with the op-by-op path). */
int bolt_layer_step(const BoltLayer *L, const float *h, float *out, int64_t T, const float *cos, const float *sin,
                    int64_t P, int neox, float *kc, float *vc, int64_t *pos, int64_t S, int ring,
                    const int64_t *positions, int64_t n_scan, int threads) {
    int64_t D = L->n_embd, F = L->n_ff, nq = L->n_head * L->head_dim;
    if (T < 1 || D < 1 || F < 1 || L->gate_up.n_out != 2 * F || L->o.n_out != D || L->down.n_out != D) return -1;
    size_t n = (size_t)(T * (D + L->qkv.n_out + nq + D + 2 * F + F));
    float *xn = malloc(sizeof(float) * n);
    if (!xn) return -1;
    float *qkv = xn + T * D, *att = qkv + T * L->qkv.n_out, *y = att + T * nq, *gu = y + T * D, *a = gu + T * 2 * F;
    int rc = bolt_rms_norm(h, L->attn_norm, NULL, xn, T, D, L->eps)
          || linear(L, &L->qkv, xn, D, T, qkv, threads)
          || bolt_attention_step(qkv, T, L->n_head, L->n_kv, L->head_dim, L->bias, L->q_norm, L->k_norm, L->v_norm,
                                 L->head_eps, cos, sin, P, neox, kc, vc, pos, S, L->writes_kv, positions, ring, n_scan,
                                 L->window, L->scale, att, threads)
          || linear(L, &L->o, att, nq, T, y, threads)
          || residual(h, y, L->post_attn_norm, out, T, D, L->eps)
          || bolt_rms_norm(out, L->ffn_norm, NULL, xn, T, D, L->eps)
          || linear(L, &L->gate_up, xn, D, T, gu, threads);
    if (!rc) {
        bolt_act_mul(L->act, gu, a, T, F);
        rc = linear(L, &L->down, a, F, T, y, threads) || residual(out, y, L->post_ffn_norm, out, T, D, L->eps);
    }
    free(xn);
    return rc ? -1 : 0;
}
