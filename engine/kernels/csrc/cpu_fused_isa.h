/* The per-ISA rows of cpu_fused.c (included by cpu_targets.h once per SIMD target). Each
 * function does one token's row; results are rounded where torch's unfused ops round. */
#include "cpu_exp_isa.h"

static void FN(rms_norm_row)(void *x, void *residual, const void *weight, void *out, int n,
                             float eps, int is_bf16) {
    float sum = 0.0f;
    if (residual != NULL) {
        for (int i = 0; i < n; i++) {
            float v = round_to(load(residual, i, is_bf16) + load(x, i, is_bf16), is_bf16);
            store(residual, i, is_bf16, v);
            sum += v * v;
        }
    } else {
        for (int i = 0; i < n; i++) {
            float v = load(x, i, is_bf16);
            sum += v * v;
        }
    }
    const float inv = 1.0f / sqrtf(sum / n + eps);
    const void *src = residual != NULL ? residual : x;
    for (int i = 0; i < n; i++) {
        float normed = round_to(load(src, i, is_bf16) * inv, is_bf16);
        store(out, i, is_bf16, load(weight, i, is_bf16) * normed);
    }
}

/* silu(x) = x / (1 + e^-x) in each lane, from e = e^-|x| (<= 1, so never overflowing): x / (1
 * + e) for x >= 0, x e / (1 + e) below. */
static inline __attribute__((always_inline)) vec FN(silu_lanes)(vec x) {
    const vec e = FN(exp_lanes)((vec)((veci)x | (int)0x80000000)); /* -|x| */
    const veci below = x < (vec){0};
    const vec scaled = x * e;
    return (vec)(((veci)scaled & below) | ((veci)x & ~below)) / (1.0f + e);
}

static void FN(silu_and_mul_row)(const void *gate_up, void *out, int n, int is_bf16) {
    float g[SILU_CHUNK];
    for (int start = 0; start < n; start += SILU_CHUNK) {
        const int m = n - start < SILU_CHUNK ? n - start : SILU_CHUNK;
        const int whole = (m + VEC - 1) / VEC * VEC;
        for (int i = 0; i < m; i++) g[i] = load(gate_up, start + i, is_bf16);
        for (int i = m; i < whole; i++) g[i] = 0.0f;
        for (int i = 0; i < whole; i += VEC) {
            vec x;
            LOADV(x, g + i);
            STOREV(g + i, FN(silu_lanes)(x));
        }
        for (int i = 0; i < m; i++)
            store(out, start + i, is_bf16,
                  round_to(g[i], is_bf16) * load(gate_up, n + start + i, is_bf16));
    }
}

/* Every head of one token's row, rotated in place by the half-split layout. The two dtypes
 * get a loop each: with the dtype test inside, the bf16 loop does not vectorise. */
static void FN(rope_row)(void *x, int heads, int head_dim, const void *cos, const void *sin,
                         int is_bf16) {
    const int half = head_dim / 2;
    if (is_bf16) {
        uint16_t *xb = (uint16_t *)x;
        const uint16_t *cb = (const uint16_t *)cos, *sb = (const uint16_t *)sin;
        for (int h = 0; h < heads; h++) {
            uint16_t *lo = xb + (int64_t)h * head_dim, *hi = lo + half;
            for (int i = 0; i < half; i++) {
                float a = bf16_to_f32(lo[i]), b = bf16_to_f32(hi[i]);
                float first = round_to(a * bf16_to_f32(cb[i]), 1) +
                              round_to(-b * bf16_to_f32(sb[i]), 1);
                float second = round_to(b * bf16_to_f32(cb[half + i]), 1) +
                               round_to(a * bf16_to_f32(sb[half + i]), 1);
                lo[i] = f32_to_bf16(first);
                hi[i] = f32_to_bf16(second);
            }
        }
    } else {
        float *xf = (float *)x;
        const float *cf = (const float *)cos, *sf = (const float *)sin;
        for (int h = 0; h < heads; h++) {
            float *lo = xf + (int64_t)h * head_dim, *hi = lo + half;
            for (int i = 0; i < half; i++) {
                float a = lo[i], b = hi[i];
                lo[i] = a * cf[i] - b * sf[i];
                hi[i] = b * cf[half + i] + a * sf[half + i];
            }
        }
    }
}
