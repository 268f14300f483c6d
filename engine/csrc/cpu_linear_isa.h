/* The per-ISA part of cpu_linear.c (included by cpu_targets.h once per SIMD target): the
 * register tile of cpu_tile_isa.h, MR rows of x times one panel's NR columns. */
#include "cpu_tile_isa.h"

/* tile() with its row count a constant, 1..MR. */
static void FN(linear_tile)(const float *x, int64_t x_stride, const float *panel, int k, int rows,
                            float *out, int64_t out_stride, const float *bias, int cols,
                            const char *prefetch, int pf_step) {
    switch (rows) {
#define ROWS(n) \
    case n:                                                                               \
        FN(tile)(x, x_stride, panel, k, n, out, out_stride, bias, cols, prefetch, pf_step, 0, NR_VECS); \
        break;
        ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6)
#if MR > 6
        ROWS(7) ROWS(8)
#endif
#undef ROWS
    }
}

static int FN(tile_shape)(int *rows) {
    *rows = MR;
    return NR;
}

#undef NR
#undef MR
#undef NR_VECS
