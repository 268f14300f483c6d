/* Fused elementwise ops of the decoder for the CPU, one pass over each row instead of
 * torch's several (each a full read and write of the activations):
 *   add_rms_norm: residual += x (if residual), out = weight * rmsnorm(residual or x);
 *   silu_and_mul: out = silu(gate) * up, gate_up = [gate | up] per row;
 *   rope: q and k rotated in place by each token's position (cos/sin table rows).
 * Elements are float32 or bfloat16 bits (is_bf16); rows may be strided (row_stride, in
 * elements). Math is float32, rounded to bf16 exactly where the torch reference rounds, so
 * float32 agrees with it to rounding and bf16 to one unit in the last place at most (silu's
 * e^x, a polynomial in the lanes (cpu_exp_isa.h; silu_and_mul took up to 1.4x longer with
 * libmvec's expf on an AMD EPYC Zen 4), and 1/sqrtf may differ from torch's by a float32 ulp
 * or two). Rows run on OpenMP threads and each function takes the SIMD path `isa`
 * (cpu_targets.h). They return 0, or -1 for an ISA this CPU lacks. */
#include <math.h>
#include <stddef.h>

#include "cpu_common.h"

/* silu_and_mul works through a row in pieces this long, in a stack buffer. */
#define SILU_CHUNK 256

#define ISA_BODY "cpu_fused_isa.h"
#include "cpu_targets.h"

/* Row r of x is row r % heads of token r / heads, whose rows of n lie one after another
 * from x_token_stride * (r / heads) elements on (heads = 1, x_token_stride = n: plain rows;
 * Qwen3's per-head norms: the heads of a token inside its qkv row). out and residual are
 * plain rows. */
int add_rms_norm(void *x, void *residual, const void *weight, void *out, int rows, int n,
                 int heads, int64_t x_token_stride, float eps, int is_bf16, int num_threads,
                 int isa) {
    if (!isa_usable(isa)) return -1;
    const int size = is_bf16 ? 2 : 4;
    void (*row)(void *, void *, const void *, void *, int, float, int) = PICK(rms_norm_row, isa);
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int r = 0; r < rows; r++) {
        const int64_t offset = (int64_t)r * n * size;
        const int64_t x_offset = ((r / heads) * x_token_stride + (int64_t)(r % heads) * n) * size;
        row((char *)x + x_offset, residual != NULL ? (char *)residual + offset : NULL, weight,
            (char *)out + offset, n, eps, is_bf16);
    }
    return 0;
}

int silu_and_mul(const void *gate_up, void *out, int rows, int n, int is_bf16, int num_threads,
                 int isa) {
    if (!isa_usable(isa)) return -1;
    const int size = is_bf16 ? 2 : 4;
    void (*row)(const void *, void *, int, int) = PICK(silu_and_mul_row, isa);
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int r = 0; r < rows; r++)
        row((const char *)gate_up + (int64_t)r * 2 * n * size, (char *)out + (int64_t)r * n * size,
            n, is_bf16);
    return 0;
}

/* cos_sin: [2, max_positions, head_dim] (cos then sin); q, k: [tokens, heads, head_dim] rows
 * at q_stride / k_stride elements apart. */
int rope(void *q, void *k, const int64_t *positions, const void *cos_sin, int tokens,
         int q_heads, int k_heads, int head_dim, int64_t q_stride, int64_t k_stride,
         int max_positions, int is_bf16, int num_threads, int isa) {
    if (!isa_usable(isa)) return -1;
    const int size = is_bf16 ? 2 : 4;
    void (*row)(void *, int, int, const void *, const void *, int) = PICK(rope_row, isa);
    const int64_t table = (int64_t)max_positions * head_dim * size;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int t = 0; t < tokens; t++) {
        const char *cos = (const char *)cos_sin + positions[t] * head_dim * size;
        row((char *)q + t * q_stride * size, q_heads, head_dim, cos, cos + table, is_bf16);
        row((char *)k + t * k_stride * size, k_heads, head_dim, cos, cos + table, is_bf16);
    }
    return 0;
}
