/* GGUF block dequantization on the CPU: rows of one quantized tensor to fp32 or bf16.
 *
 * The reference is bolt_ros.engine.gguf.quants (torch ops, llama.cpp's dequantize_row_* formulas). This file computes
 * the same values in the same order - every product and difference rounded to fp32 on its own, never fused (built
 * with -ffp-contract=off) - so the fp32 output equals the reference bit for bit, and the bf16 output equals torch's
 * round-to-nearest-even of it. It exists because the reference makes a dozen full-size temporaries per tensor: a
 * 4864x896 Q5_0 weight takes 17 ms there, which made every prefill chunk dequantize slower than it multiplies.
 *
 * Built and loaded by kernels/cpu/native.py (ctypes); the caller splits rows across threads. */
#include "gguf_blocks.h"

static uint16_t bf16(float f) {  /* round to nearest even, as torch's float -> bfloat16 */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);  /* NaN stays NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* One block of `type` at b -> 32 or 256 floats at y. */
static void block(int type, const uint8_t *b, float *y) {
    switch (type) {
    case Q4_0: {
        float d = f16(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 0xF) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
        break;
    }
    case Q4_1: {
        float d = f16(b), m = f16(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(b[4 + j] & 0xF) + m;
            y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
        break;
    }
    case Q5_0: {
        float d = f16(b);
        uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
        for (int j = 0; j < 16; j++) {
            int lo = (b[6 + j] & 0xF) | (((qh >> j) & 1) << 4), hi = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
        break;
    }
    case Q5_1: {
        float d = f16(b), m = f16(b + 2);
        uint32_t qh = (uint32_t)b[4] | ((uint32_t)b[5] << 8) | ((uint32_t)b[6] << 16) | ((uint32_t)b[7] << 24);
        for (int j = 0; j < 16; j++) {
            int lo = (b[8 + j] & 0xF) | (((qh >> j) & 1) << 4), hi = (b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            y[j] = d * (float)lo + m;
            y[j + 16] = d * (float)hi + m;
        }
        break;
    }
    case Q8_0: {
        float d = f16(b);
        for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
        break;
    }
    case Q4_K:
    case Q5_K: {
        float d = f16(b), dmin = f16(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *ql = type == Q4_K ? b + 16 : b + 48;
        for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32) {
            int sc, m;
            k_scale_min(is, scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            k_scale_min(is + 1, scales, &sc, &m);
            float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int q1 = ql[l] & 0xF, q2 = ql[l] >> 4;
                if (type == Q5_K) {
                    q1 |= ((qh[l] >> (is)) & 1) << 4;
                    q2 |= ((qh[l] >> (is + 1)) & 1) << 4;
                }
                y[j + l] = d1 * (float)q1 - m1;
                y[j + 32 + l] = d2 * (float)q2 - m2;
            }
        }
        break;
    }
    case Q6_K: {  /* element 128h + 32k + l: 4 low bits from ql, 2 high from qh, scale sc[8h + 2k + l/16] */
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = f16(b + 208), ds[16];
        for (int i = 0; i < 16; i++) ds[i] = d * (float)sc[i];
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, y += 128) {
            for (int k = 0; k < 4; k++) {
                const uint8_t *lo = ql + 32 * (k & 1);
                int shift = 4 * (k >> 1);
                for (int half = 0; half < 2; half++) {
                    float s = ds[8 * h + 2 * k + half];
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        int q = (int)(((lo[l] >> shift) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
                        y[32 * k + l] = s * (float)q;
                    }
                }
            }
        }
        break;
    }
    }
}

static int block_shape(int type, int *elems, int *bytes) {
    switch (type) {
    case Q4_0: *elems = 32; *bytes = 18; return 0;
    case Q4_1: *elems = 32; *bytes = 20; return 0;
    case Q5_0: *elems = 32; *bytes = 22; return 0;
    case Q5_1: *elems = 32; *bytes = 24; return 0;
    case Q8_0: *elems = 32; *bytes = 34; return 0;
    case Q4_K: *elems = 256; *bytes = 144; return 0;
    case Q5_K: *elems = 256; *bytes = 176; return 0;
    case Q6_K: *elems = 256; *bytes = 210; return 0;
    default: return -1;
    }
}

/* row l's block (GGUF bytes at g) to or from its place in a tile's block t (gguf_blocks.h): the fp16 d field, then
 * the other bytes in dword groups */
static void tile_block(int base, int bytes, int R, int l, uint8_t *t, uint8_t *g, int to_tile) {
    int h = tile_half_at(base), at = h >= 0 ? 2 * R : 0;
    if (h >= 0) {
        if (to_tile) memcpy(t + 2 * l, g + h, 2); else memcpy(g + h, t + 2 * l, 2);
    }
    for (int o = 0, k = 0; o < bytes; k++) {
        if (o == h) o += 2;
        if (o >= bytes) break;
        uint8_t *q = t + at + 4 * R * k + 4 * l;
        if (to_tile) memcpy(q, g + o, 4); else memcpy(g + o, q, 4);
        o += 4;
    }
}

static int tileable(int base) { return base == Q4_0 || base == Q5_0 || base == Q4_K || base == Q6_K; }

/* [n_rows, n_cols] GGUF rows of type & 255 (Q4_0, Q5_0, Q4_K, Q6_K) -> the tiles of `type` (TILED or TILED8 + it) at dst,
 * n_rows rounded up to the tile's rows (the padding rows zero: d = 0, so their lanes are 0). Returns 0, or -1 for
 * another type or a row that isn't whole blocks. */
int bolt_tile(int type, const uint8_t *src, int64_t n_rows, int64_t n_cols, uint8_t *dst) {
    int elems, bytes, base = type & 255, R = tile_rows(type);
    if (type < TILED || !tileable(base) || block_shape(base, &elems, &bytes) || n_cols % elems) return -1;
    int64_t nb = n_cols / elems, tiles = (n_rows + R - 1) / R, tb = (int64_t)R * bytes;
    memset(dst, 0, (size_t)(tiles * nb * tb));
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t b = 0; b < nb; b++)
            tile_block(base, bytes, R, (int)(r % R), dst + (r / R) * nb * tb + b * tb,
                       (uint8_t *)src + (r * nb + b) * bytes, 1);
    return 0;
}

/* Rows [row0, row1) of a [n_rows, n_cols] tensor of `type` (its bytes at src, rows contiguous) into dst, which holds
 * the same rows: fp32 when out_bf16 is 0, else bf16 bits. Returns 0, or -1 for a type this file doesn't read or a
 * row length that isn't whole blocks (the caller has already validated both; this is a second guard). */
int bolt_dequant_rows(int type, const uint8_t *src, int64_t row0, int64_t row1, int64_t n_cols, void *dst,
                      int out_bf16) {
    int elems, bytes, base = type & 255, R = tile_rows(type);
    if ((type >= TILED && !tileable(base)) || block_shape(base, &elems, &bytes) || n_cols % elems) return -1;
    int64_t per_row = n_cols / elems;
    float y[256];
    uint8_t g[256];
    for (int64_t r = row0; r < row1; r++) {
        const uint8_t *b = src + r * per_row * bytes;
        for (int64_t k = 0; k < per_row; k++, b += bytes) {
            if (type >= TILED) {  /* the block's bytes gathered from its tile */
                uint8_t *t = (uint8_t *)src + ((r / R) * per_row + k) * R * bytes;
                tile_block(base, bytes, R, (int)(r % R), t, g, 0);
                block(base, g, y);
            } else {
                block(type, b, y);
            }
            int64_t at = r * n_cols + k * elems;
            if (out_bf16) {
                uint16_t *o = (uint16_t *)dst + at;
                for (int j = 0; j < elems; j++) o[j] = bf16(y[j]);
            } else {
                memcpy((float *)dst + at, y, sizeof(float) * (size_t)elems);
            }
        }
    }
    return 0;
}
