/* The register tile shared by the per-ISA bodies of cpu_linear.c and cpu_prefill.c (each
 * includes it once per SIMD target, inside cpu_targets.h's loop): MR rows of x times one
 * panel's NR columns (NR_VECS vectors of VEC floats): MR * NR_VECS accumulators, the panel
 * row's NR_VECS vectors and one broadcast of x fit the target's VEC_REGS registers (8 x 48
 * on AVX-512; 6 x 16 on AVX2; 6 x 8 on the baseline). The including body #undefs MR, NR
 * and NR_VECS at its end. */
#define NR_VECS (VEC_REGS >= 32 ? 3 : 2)
#define MR (VEC_REGS >= 32 ? 8 : 6)
#define NR (NR_VECS * VEC)

/* out[r][0, cols) = x[r] · panel (+ bias) for `rows` rows, the sums in registers over all
 * k; with `accumulate`, out[r] += x[r] · panel instead (cols == vecs * VEC); only the
 * panel's first `vecs` vectors (1..NR_VECS; cols <= vecs * VEC). `panel_bf16`: the panel
 * is bfloat16 (widened as read), `out_bf16`: so is out (the sums rounded once as stored),
 * else float32; out_bf16 never with `accumulate`. rows, vecs and both flags are constants
 * once inlined (they size the registers and pick the loads).
 * prefetch, if not NULL, is this tile's share of the next panel: pf_step bytes of it are
 * fetched with each k, so the panel after streams from cache. */
static inline __attribute__((always_inline)) void FN(tile)(const float *x, int64_t x_stride,
                                                           const void *panel, int k, int rows,
                                                           void *out, int64_t out_stride,
                                                           const float *bias, int cols,
                                                           const char *prefetch, int pf_step,
                                                           int accumulate, int vecs,
                                                           int panel_bf16, int out_bf16) {
    vec acc[MR][NR_VECS];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < vecs; c++) {
            if (accumulate)
                LOADV(acc[r][c], (const float *)out + r * out_stride + VEC * c);
            else
                acc[r][c] = (vec){0};
        }
#pragma GCC unroll 4
    for (int i = 0; i < k; i++) {
        vec b[NR_VECS];
        for (int c = 0; c < vecs; c++) {
            b[c] = FN(load_one)(panel, (int64_t)i * NR + VEC * c, panel_bf16);
#if defined(__x86_64__)
            __asm__("" : "+v"(b[c])); /* in a register: not reloaded for every row */
#endif
        }
        if (prefetch != NULL)
            for (int c = 0; c < pf_step; c += 64)
                __builtin_prefetch(prefetch + (int64_t)i * pf_step + c);
        for (int r = 0; r < rows; r++) {
            const float a = x[r * x_stride + i];
            for (int c = 0; c < vecs; c++) acc[r][c] += a * b[c];
        }
    }
    if (bias != NULL)
        for (int c = 0; c < vecs; c++) {
            vec v;
            LOADV(v, bias + VEC * c);
            for (int r = 0; r < rows; r++) acc[r][c] += v;
        }
    if (cols == vecs * VEC) {
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < vecs; c++) FN(store_one)(out, r * out_stride + VEC * c, out_bf16, acc[r][c]);
        return;
    }
    for (int r = 0; r < rows; r++) {
        float row[NR];
        for (int c = 0; c < vecs; c++) STOREV(row + VEC * c, acc[r][c]);
        for (int j = 0; j < cols; j++) store(out, r * out_stride + j, out_bf16, row[j]);
    }
}

