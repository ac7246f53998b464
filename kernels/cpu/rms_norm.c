/* RMSNorm of a few rows (a decode step's residual stream, a DFlash block) on the CPU in one call, optionally added
 * to a residual afterwards (Gemma's post-norms): y = norm(x) * w, or y = r + norm(x) * w.
 *
 * Why C: torch's RMSNorm is one dispatch of ~11 us for a 640-wide row on 2 cores, and a decode step runs 3-4 per
 * layer; the arithmetic is ~1 us. The sum of squares runs in double, so it is at least as close to the exact value as
 * the reference's fp32 sum; the products are the reference's, in its order. Built and loaded by kernels/cpu/native.py;
 * the reference is kernels/norm.py's torch form (test_native_norm.py). */
#include <math.h>
#include <stdint.h>

/* x, r, y [rows, D] fp32 (r NULL: no residual; y may be x: each element is read before it is written), w [D] or
 * NULL. Returns 0, or -1 for bad sizes. attention_step.c norms q and k heads with it in place. */
int bolt_rms_norm(const float *x, const float *w, const float *r, float *y, int64_t rows, int64_t D, float eps) {
    if (rows < 1 || D < 1) return -1;
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * D;
        float *yi = y + i * D;
        double ss = 0.0;
        for (int64_t j = 0; j < D; j++) ss += (double)xi[j] * xi[j];
        float s = 1.0f / sqrtf((float)(ss / (double)D) + eps);
        for (int64_t j = 0; j < D; j++) {
            float v = w ? (xi[j] * s) * w[j] : xi[j] * s;
            yi[j] = r ? r[i * D + j] + v : v;
        }
    }
    return 0;
}
