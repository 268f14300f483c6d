/* Float32 linear layers for the CPU over weights packed once into panels:
 * out[m, n] = x[m] · w[n] (+ bias[n]).
 *
 * panels: [ceil(n / NR)][k][NR] float32, panel p holding rows p * NR ... of w transposed
 * (w[n][i] at panels[n / NR][i][n % NR]), zeros past the last row; NR is the SIMD path's
 * panel width (linear_tile_shape). bias: NULL, or ceil(n / NR) * NR floats (zeros past n).
 * x: m rows of k floats, x_stride apart; out: [m, n], contiguous.
 *
 * One pass, no packing of x: the work items, (block of rows, panel), run on OpenMP threads
 * (torch's, see cpu_decode.c), rows-block major, a few panels at a time (take_size), so the
 * threads stream the panels while the block's rows stay in cache; the blocks are of M_BLOCK
 * rows or, where that would leave the threads unequal shares, of fewer (row_blocks,
 * cpu_common.h). Each item is register tiles of the path's MR rows by the panel's NR
 * columns, every sum kept in registers over all of k (cpu_linear_isa.h); the item's tiles
 * share the fetching of its next panel, so the memory streams while each tile reads the
 * current one. Against oneDNN's float32 path on the 134M
 * model's shapes (benchmarks/cpu-levers.md, levers 7, 12, 13 and 18): faster at decode batch
 * sizes; at prefill sizes level with torch's oneDNN, 0-13 % slower than vLLM's at 1,336 rows.
 * Returns 0, or -1 for an ISA this CPU lacks. */
#include <stddef.h>

#include "cpu_common.h"

#define M_BLOCK 128

#define ISA_BODY "cpu_linear_isa.h"
#include "cpu_targets.h"

typedef void (*tile_fn)(const float *, int64_t, const float *, int, int, float *, int64_t,
                        const float *, int, const char *, int);

/* The panel width NR of the SIMD path `isa` (and its tile's rows in *rows), or -1. */
int linear_tile_shape(int isa, int *rows) {
    if (!isa_usable(isa)) return -1;
    return PICK(tile_shape, isa)(rows);
}

int linear_f32(const float *x, const float *panels, const float *bias, float *out, int m, int n,
               int k, int64_t x_stride, int num_threads, int isa) {
    if (!isa_usable(isa)) return -1;
    int mr;
    const int nr = PICK(tile_shape, isa)(&mr);
    const tile_fn tile = PICK(linear_tile, isa);
    const int num_panels = (n + nr - 1) / nr, num_blocks = row_blocks(m, num_threads, M_BLOCK);
    const int64_t items = (int64_t)num_panels * num_blocks;
#pragma omp parallel for num_threads(num_threads) \
    schedule(dynamic, take_size(num_panels, num_threads))
    for (int64_t item = 0; item < items; item++) {
        const int p = item % num_panels, b = item / num_panels;
        const int m0 = block_start(b, num_blocks, m, mr);
        const int m1 = block_start(b + 1, num_blocks, m, mr);
        const int n0 = p * nr, cols = n - n0 < nr ? n - n0 : nr;
        const float *panel = panels + (int64_t)p * k * nr;
        const char *next = p + 1 < num_panels ? (const char *)(panel + (int64_t)k * nr) : NULL;
        /* each of the block's tiles fetches its share of the next panel, so the memory
         * stays busy while the later tiles re-read this one from cache */
        const int tiles = (m1 - m0 + mr - 1) / mr, pf_step = nr * (int)sizeof(float) / tiles;
        for (int r = m0, t = 0; r < m1; r += mr, t++)
            tile(x + r * x_stride, x_stride, panel, k, m1 - r < mr ? m1 - r : mr,
                 out + (int64_t)r * n + n0, n, bias != NULL ? bias + n0 : NULL, cols,
                 next != NULL ? next + (int64_t)t * k * pf_step : NULL, pf_step);
    }
    return 0;
}
