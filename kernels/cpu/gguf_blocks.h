/* What the GGUF block kernels share: the type ids they read, fp16 scales, the K-quants' packed 6-bit scales. */
#ifndef BOLT_GGUF_BLOCKS_H
#define BOLT_GGUF_BLOCKS_H
#include <stdint.h>
#include <string.h>

enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
/* Q4_0, Q5_0, Q4_K and Q6_K tiled at load (gguf_dequant.c: bolt_tile; type TILED + the GGUF type for tiles of 16
 * rows, the AVX-512 levels', TILED8 + it for 8, AVX2's and AVX-VNNI's): per block (superblock) the R rows' blocks
 * interleaved, so that a weight-rows-as-lanes kernel loads each part of a block as one vector (q8_tiles.h) where the
 * GGUF rows need R loads and a transpose. A tile's block: the rows' fp16 d first where the block has one on its own
 * (Q4_0, Q5_0: bytes 0..1, Q6_K: 208..209), R x 2 bytes; then the other bytes in their order as dword groups, group g the R
 * rows' 4 bytes 4g..4g+3 (4R bytes). */
enum { TILED = 256, TILED8 = 512 };
static inline int tile_rows(int t) { return t >= TILED8 ? 8 : 16; }
static inline int tile_half_at(int base) { return base == Q4_0 || base == Q5_0 ? 0 : base == Q6_K ? 208 : -1; }

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
