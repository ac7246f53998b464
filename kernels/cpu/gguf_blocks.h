/* What the GGUF block kernels share: the type ids they read, fp16 scales, the K-quants' packed 6-bit scales. */
#ifndef BOLT_GGUF_BLOCKS_H
#define BOLT_GGUF_BLOCKS_H
#include <stdint.h>
#include <string.h>

enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
/* Q5_0 repacked at load in tiles of 16 rows (gguf_dequant.c: bolt_tile16): per tile and block of 32, the 16 rows'
 * d (fp16), then their qh (4 bytes each), then qs in 4 groups, each the 16 rows' 4 bytes 4k..4k+3. A weight-rows-as-
 * lanes kernel loads each of those as one vector (q8_tiles.h) where the GGUF layout needs 16 loads and 8 permutes. */
enum { Q5_0_T16 = 256 + Q5_0, T16_ROWS = 16, T16_BLOCK = 16 * 22 };

/* fp16 at p (little-endian) -> fp32, exactly: subnormals, inf and NaN included */
static inline float f16(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);  /* inf / NaN */
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) {  /* subnormal: normalize */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* the 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K superblock */
static inline void k_scale_min(int j, const uint8_t *q, int *sc, int *m) {  /* the 6-bit scales of Q4_K / Q5_K */
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

#endif
