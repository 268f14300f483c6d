/* Float32 linear layers for the CPU over weights packed once into panels:
 * out[m, n] = x[m] · w[n] (+ bias[n]); and bfloat16 ones computed the same way in float32
 * (linear_bf16), for CPUs without bf16 arithmetic (AVX2, AVX-512 before BF16).
 *
 * panels: [ceil(n / NR)][k][NR] float32 (bfloat16 for linear_bf16), panel p holding rows
 * p * NR ... of w transposed (w[n][i] at panels[n / NR][i][n % NR]), zeros past the last
 * row; NR is the SIMD path's panel width (linear_tile_shape). bias: NULL, or
 * ceil(n / NR) * NR floats (zeros past n). x: m rows of k elements, x_stride apart; out:
 * [m, n], contiguous. linear_bf16 widens x into float32 scratch first (a pass over m * k
 * elements, against the product's m * k * n), widens the panels (see linear()) and rounds
 * each sum to bf16 once, as torch's bf16 matmul does: the weight streams at half float32's
 * bytes, the arithmetic is float32's.
 *
 * One pass, no packing of x: the work items, (block of rows, panel), run on OpenMP threads
 * (torch's, see cpu_decode.c), rows-block major, a few panels at a time (take_size; shorter
 * runs at the end, take_run), so the threads stream the panels while the block's rows stay
 * in cache; the blocks are of M_BLOCK rows or, where that would leave the threads unequal
 * shares, of fewer (row_blocks, cpu_common.h). Each item is register tiles of the path's MR
 * rows by the panel's NR columns, every sum kept in registers over all of k
 * (cpu_linear_isa.h); the item's tiles share the fetching of its next panel, so the memory
 * streams while each tile reads the current one. Against oneDNN's float32 path on the 134M
 * model's shapes (benchmarks/cpu-levers.md, levers 7, 12, 13 and 18): faster at decode batch
 * sizes; at prefill sizes level with torch's oneDNN, 0-13 % slower than vLLM's at 1,336 rows.
 * Returns 0, -1 for an ISA this CPU lacks, or -2 if linear_bf16's scratch could not be had. */
#include <stddef.h>

#include "cpu_common.h"
#include "cpu_workspace.h"

#define M_BLOCK 128
/* The dtypes of a tile's panel and out: float32 and float32; bf16 and bf16; a bf16 panel
 * widened into float32 scratch first, and bf16. */
enum { TILE_F32, TILE_BF16, TILE_WIDE_BF16 };

#define ISA_BODY "cpu_linear_isa.h"
#include "cpu_targets.h"

typedef void (*tile_fn)(const float *, int64_t, const void *, int, int, void *, int64_t,
                        const float *, int, const char *, int, int);

/* The panel width NR of the SIMD path `isa` (and its tile's rows in *rows), or -1. */
int linear_tile_shape(int isa, int *rows) {
    if (!isa_usable(isa)) return -1;
    return PICK(tile_shape, isa)(rows);
}

typedef void (*widen_fn)(const uint16_t *, float *, int64_t);

/* linear_f32's product, or with `bf16` its panels and out in bfloat16 (x float32 either way);
 * 0, or -2 if a thread's scratch could not be had. An item of two or more tiles widens its
 * bf16 panel into float32 scratch once for all of them (widening as read costs each tile
 * ~45 % of its rate on AVX2); an item of one tile widens as it reads. */
static int linear(const float *x, const void *panels, const float *bias, void *out, int m,
                  int n, int k, int64_t x_stride, int num_threads, int isa, int bf16) {
    int mr, failed = 0;
    const int nr = PICK(tile_shape, isa)(&mr), size = bf16 ? 2 : 4;
    const tile_fn tile = PICK(linear_tile, isa);
    const widen_fn widen = PICK(widen, isa);
    const int num_panels = (n + nr - 1) / nr, num_blocks = row_blocks(m, num_threads, M_BLOCK);
    const int64_t items = (int64_t)num_panels * num_blocks, panel_bytes = (int64_t)k * nr * size;
    const int take = take_size(num_panels, num_threads);
    int64_t next_item = 0, run, run_len;
#pragma omp parallel num_threads(num_threads) private(run, run_len) reduction(| : failed)
    while ((run_len = take_run(&next_item, items, take, num_threads, &run)) > 0) {
        for (int64_t item = run; item < run + run_len; item++) {
            const int p = item % num_panels, b = item / num_panels;
            const int m0 = block_start(b, num_blocks, m, mr);
            const int m1 = block_start(b + 1, num_blocks, m, mr);
            const int n0 = p * nr, cols = n - n0 < nr ? n - n0 : nr;
            const char *panel = (const char *)panels + p * panel_bytes;
            const char *next = p + 1 < num_panels ? panel + panel_bytes : NULL;
            /* each of the block's tiles fetches its share of the next panel, so the memory
             * stays busy while the later tiles re-read this one from cache */
            const int tiles = (m1 - m0 + mr - 1) / mr, pf_step = nr * size / tiles;
            const void *read = panel;
            int dtypes = bf16 ? TILE_BF16 : TILE_F32;
            if (bf16 && tiles > 1) {
                float *wide = workspace(WORKSPACE_THREAD, sizeof(float) * (size_t)k * nr);
                if (wide == NULL) {
                    failed = 1;
                    continue;
                }
                widen((const uint16_t *)panel, wide, (int64_t)k * nr);
                read = wide;
                dtypes = TILE_WIDE_BF16;
            }
            for (int r = m0, t = 0; r < m1; r += mr, t++)
                tile(x + r * x_stride, x_stride, read, k, m1 - r < mr ? m1 - r : mr,
                     (char *)out + ((int64_t)r * n + n0) * size, n, bias != NULL ? bias + n0 : NULL,
                     cols, next != NULL ? next + (int64_t)t * k * pf_step : NULL, pf_step, dtypes);
        }
    }
    return failed ? -2 : 0;
}

int linear_f32(const float *x, const float *panels, const float *bias, float *out, int m, int n,
               int k, int64_t x_stride, int num_threads, int isa) {
    if (!isa_usable(isa)) return -1;
    return linear(x, panels, bias, out, m, n, k, x_stride, num_threads, isa, 0);
}

int linear_bf16(const uint16_t *x, const uint16_t *panels, const float *bias, uint16_t *out,
                int m, int n, int k, int64_t x_stride, int num_threads, int isa) {
    if (!isa_usable(isa)) return -1;
    float *wide = workspace(WORKSPACE_SHARED, sizeof(float) * (size_t)m * k);
    if (wide == NULL) return -2;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int r = 0; r < m; r++)
        for (int i = 0; i < k; i++) wide[(int64_t)r * k + i] = bf16_to_f32(x[r * x_stride + i]);
    return linear(wide, panels, bias, out, m, n, k, k, num_threads, isa, 1);
}
