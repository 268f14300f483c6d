/* The per-ISA part of cpu_linear.c (included by cpu_targets.h once per SIMD target): the
 * register tile of cpu_tile_isa.h, MR rows of x times one panel's NR columns. */
#include "cpu_tile_isa.h"

/* tile() with its row count (1..MR) and dtypes constants: `dtypes` is one of the
 * TILE_* of cpu_linear.c. */
static void FN(linear_tile)(const float *x, int64_t x_stride, const void *panel, int k, int rows,
                            void *out, int64_t out_stride, const float *bias, int cols,
                            const char *prefetch, int pf_step, int dtypes) {
#define TILE(n, p, o) \
    FN(tile)(x, x_stride, panel, k, n, out, out_stride, bias, cols, prefetch, pf_step, 0, NR_VECS, p, o)
    switch (rows) {
#define ROWS(n)                         \
    case n:                             \
        if (dtypes == TILE_BF16)        \
            TILE(n, 1, 1);              \
        else if (dtypes == TILE_WIDE_BF16) \
            TILE(n, 0, 1);              \
        else                            \
            TILE(n, 0, 0);              \
        break;
        ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6)
#if MR > 6
        ROWS(7) ROWS(8)
#endif
#undef ROWS
#undef TILE
    }
}

/* dst[0, n) = src[0, n) widened from bf16 (n a multiple of VEC). */
static void FN(widen)(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i += VEC) STOREV(dst + i, FN(load_one)(src, i, 1));
}

static int FN(tile_shape)(int *rows) {
    *rows = MR;
    return NR;
}

#undef NR
#undef MR
#undef NR_VECS
