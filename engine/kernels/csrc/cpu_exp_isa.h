/* e^x in vector lanes, for the per-ISA bodies of cpu_prefill.c and cpu_fused.c (included
 * once per SIMD target, inside cpu_targets.h's loop). */

/* e^x in each lane, for x <= 0. Inline, not libmvec's expf (a call per vector): e^x = 2^t =
 * 2^n 2^f with t = x log2 e, n = round(t), |f| <= 1/2, and 2^f by a degree-6 polynomial
 * fitted to its relative error on [-1/2, 1/2] (1.0e-7 in float32 arithmetic, as close as
 * float32 Horner gets). t is clamped at -115, so e^x >= 2^-115 (~2e-35, a normal float: no
 * subnormal reaches a product; what a masked key weighs in cpu_prefill.c). */
static inline __attribute__((always_inline)) vec FN(exp_lanes)(vec x) {
    const vec lowest = (vec){0} - 115.0f, half = (vec){0} + 0.5f;
    vec t = x * 1.44269504f; /* log2 e */
    const veci low = t < lowest;
    t = (vec)(((veci)t & ~low) | ((veci)lowest & low));
    const veci n = __builtin_convertvector(t - half, veci); /* t <= 0: to nearest */
    const vec f = t - __builtin_convertvector(n, vec);
    vec y = f * 1.5345807e-4f + 1.3399931e-3f;
    y = y * f + 9.6184891e-3f;
    y = y * f + 5.5503286e-2f;
    y = y * f + 2.4022646e-1f;
    y = y * f + 6.9314718e-1f;
    y = y * f + 1.0f;
    return (vec)((veci)y + (n << 23)); /* times 2^n: n >= -115, the result stays normal */
}
