/* bfloat16 linear layers on AMX tiles (Intel Xeon from Sapphire Rapids on):
 * out[m, n] = x[m] · w[n] (+ bias[n]), the sums in float32, rounded to bf16 once.
 *
 * panels: [n / 16][k / 32][16][16][2] bf16, AMX's pair layout: tile (nb, kb) holds
 * w[16 nb + j][32 kb + 2 i + e] at [i][j][e], so row i of a B tile is k pair i of its 16
 * columns. x: m rows of k bf16, x_stride elements apart; out: [m, n] bf16, contiguous;
 * bias: NULL or n floats. k must be a multiple of 32 and n of 16.
 *
 * The work items, (pair of 16-column blocks, block of 32 rows), run on OpenMP threads
 * (torch's, see cpu_decode.c) in chunks of CHUNK_ROWS rows, column major within a chunk, a
 * few pairs at a time (take_size), so the threads stream the weight once per chunk while the
 * chunk's rows stay in cache. An item is 2 x 2 tiles of sums (tiles 0-3) over all of
 * k, its rows' tiles (4, 5) and columns' tiles (6, 7) loaded per 32-wide step of k. A tile
 * configuration is per thread, set for an item's row count when it changes.
 *
 * amx_usable() asks the kernel for the tile state (arch_prctl) and says whether it may run:
 * 1, or 0 off x86-64, on CPUs without AMX-BF16 or AVX-512-BF16, or where Linux refuses. */
#include <stdint.h>
#include <string.h>

#include "cpu_common.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
/* Rows of x per chunk: a chunk's rows stay in L2 while the items stream every column tile
 * past them once (at 768 inputs, 384 KB of bf16). */
#define CHUNK_ROWS 256
#define PREFETCH_STEPS 4

int amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const int amx = (d >> 22 & 1) && (d >> 24 & 1); /* AMX-BF16, AMX-TILE */
    if (!amx || !__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a >> 5 & 1)) /* AVX512-BF16 */
        return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Tiles for items of rows0 (1-16) + rows1 (0-16) rows: sums 0, 1 and rows 4 of the first
 * 16, sums 2, 3 and rows 5 of the rest, columns 6, 7; every row 64 bytes. */
static void configure(int rows0, int rows1) {
    struct tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
    for (int t = 0; t < 8; t++)
        if (rows[t] > 0) {
            cfg.rows[t] = (uint8_t)rows[t];
            cfg.colsb[t] = 64;
        }
    _tile_loadconfig(&cfg);
}

/* Rows [m0, m0 + rows) of x times column blocks nb and, if two, nb + 1, into out; with
 * fetch, the column tiles PREFETCH_STEPS steps of k ahead are requested early (the first
 * rows to read them stream them from memory). */
static void item(const uint16_t *x, int64_t x_stride, const uint16_t *panels, const float *bias,
                 uint16_t *out, int n, int k, int m0, int rows, int nb, int two, int fetch) {
    const int steps = k / 32;
    const uint16_t *b0 = panels + (int64_t)nb * steps * 512, *b1 = b0 + (int64_t)steps * 512;
    const uint16_t *a0 = x + (int64_t)m0 * x_stride, *a1 = a0 + 16 * x_stride;
    const int64_t stride = x_stride * 2;
    _tile_zero(0);
    if (two) _tile_zero(1);
    if (rows > 16) {
        _tile_zero(2);
        if (two) _tile_zero(3);
    }
    for (int s = 0; s < steps; s++) {
        if (fetch) /* past this item's columns: the next item's, or no address (harmless) */
            for (int line = 0; line < 16; line++) {
                __builtin_prefetch(b0 + 512 * (s + PREFETCH_STEPS) + 32 * line);
                if (two) __builtin_prefetch(b1 + 512 * (s + PREFETCH_STEPS) + 32 * line);
            }
        _tile_loadd(4, a0 + 32 * s, stride);
        _tile_loadd(6, b0 + 512 * s, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two) {
            _tile_loadd(7, b1 + 512 * s, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (rows > 16) {
            _tile_loadd(5, a1 + 32 * s, stride);
            _tile_dpbf16ps(2, 5, 6);
            if (two) _tile_dpbf16ps(3, 5, 7);
        }
    }
    float sums[32][32];
    _tile_stored(0, sums[0], 128);
    if (two) _tile_stored(1, sums[0] + 16, 128);
    if (rows > 16) {
        _tile_stored(2, sums[16], 128);
        if (two) _tile_stored(3, sums[16] + 16, 128);
    }
    const int n0 = 16 * nb;
    const __m512 zero = _mm512_setzero_ps();
    const __m512 bias0 = bias != NULL ? _mm512_loadu_ps(bias + n0) : zero;
    const __m512 bias1 = bias != NULL && two ? _mm512_loadu_ps(bias + n0 + 16) : zero;
    for (int r = 0; r < rows; r++) {
        uint16_t *o = out + (int64_t)(m0 + r) * n + n0;
        const __m512 lo = _mm512_add_ps(_mm512_loadu_ps(sums[r]), bias0);
        if (two) {
            const __m512 hi = _mm512_add_ps(_mm512_loadu_ps(sums[r] + 16), bias1);
            _mm512_storeu_si512(o, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        } else {
            _mm256_storeu_si256((__m256i *)o, (__m256i)_mm512_cvtneps_pbh(lo));
        }
    }
}

int linear_bf16_amx(const uint16_t *x, const uint16_t *panels, const float *bias, uint16_t *out,
                    int m, int n, int k, int64_t x_stride, int num_threads) {
    if (k % 32 != 0 || n % 16 != 0) return -1;
    const int pairs = (n / 16 + 1) / 2, blocks = (m + 31) / 32;
    const int chunk_blocks = CHUNK_ROWS / 32, chunks = (blocks + chunk_blocks - 1) / chunk_blocks;
    const int64_t per_chunk = (int64_t)pairs * chunk_blocks, items = per_chunk * chunks;
    /* whole pairs at a time: a pair's row blocks are consecutive items */
    const int take = take_size(pairs, num_threads) * chunk_blocks;
#pragma omp parallel num_threads(num_threads)
    {
        int configured = -1; /* the rows of the configuration loaded */
#pragma omp for schedule(dynamic, take)
        for (int64_t i = 0; i < items; i++) {
            const int chunk = i / per_chunk, pair = i % per_chunk / chunk_blocks;
            const int block = chunk * chunk_blocks + i % chunk_blocks, m0 = 32 * block;
            if (block >= blocks) continue; /* the last chunk's missing blocks */
            const int rows = m - m0 < 32 ? m - m0 : 32;
            if (rows != configured) {
                configure(rows < 16 ? rows : 16, rows > 16 ? rows - 16 : 0);
                configured = rows;
            }
            item(x, x_stride, panels, bias, out, n, k, m0, rows, 2 * pair, 2 * pair + 1 < n / 16,
                 i % chunk_blocks == 0);
        }
        if (configured >= 0) _tile_release();
    }
    return 0;
}
#pragma GCC pop_options

#else
int amx_usable(void) { return 0; }

int linear_bf16_amx(const uint16_t *x, const uint16_t *panels, const float *bias, uint16_t *out,
                    int m, int n, int k, int64_t x_stride, int num_threads) {
    return -1;
}
#endif
