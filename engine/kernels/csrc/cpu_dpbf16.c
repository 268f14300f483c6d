/* bfloat16 linear layers on AVX-512-BF16 dot products, for CPUs that have them without AMX
 * (AMD from Zen 4 on, Intel Cooper Lake): out[m, n] = x[m] · w[n] (+ bias[n]), the sums in
 * float32, rounded to bf16 once.
 *
 * panels: AMX's pair layout (cpu_amx.c), which is also vdpbf16ps's: [n / 16][k / 2][16][2]
 * bf16, w[16 nb + j][2 i + e] at [nb][i][j][e], so k pair i of a block of 16 columns is one
 * 64-byte vector and each column block one contiguous stream. x: m rows of k bf16, x_stride
 * elements apart; out: [m, n] bf16, contiguous; bias: NULL or n floats. k must be even and n
 * a multiple of 16.
 *
 * The plan of cpu_linear.c's float32 kernel: the work items, (block of rows (row_blocks,
 * cpu_common.h), group of GROUP column blocks), run on OpenMP threads (torch's, see
 * cpu_decode.c), rows-block major, a few groups at a time (take_size; shorter runs at the
 * end, take_run); an item is register tiles of MR rows by the group's columns, every sum
 * kept in registers over all of k (one vdpbf16ps per row, column block and k pair), and the
 * item's tiles share the fetching of its next group while they read the current one.
 *
 * The same register tile, with float32 sums kept or added to, gives paged prefill attention
 * its two products on bf16 (cpu_prefill_isa.h): dp_rows() over panels of query lanes in
 * pairs, which dp_pairs() makes of float32 rows.
 *
 * dpbf16_usable(): 1 where the CPU has AVX-512 F, BW, VL and BF16, else 0. */
#include <stdint.h>
#include <string.h>

#include "cpu_common.h"
#include "cpu_dpbf16.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define M_BLOCK 128
#define MR 8    /* MR x GROUP sums, GROUP column vectors and a row's pair: 28 of 32 zmm */
#define GROUP 3 /* column blocks of 16 */

int dpbf16_usable(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

/* out[r][0, 16 blocks) = x[r] · the group's columns for `rows` rows and `blocks` column
 * blocks (constants once inlined, as are the flags), the sums in registers over all k pairs;
 * block c's pair i is the 64 bytes at group + c * block_stride + i * pair_stride. out_f32:
 * float32 sums, added to out's if accumulate; else (+ bias) rounded to bf16 once. prefetch,
 * if not NULL, is this tile's share of the next group: pf_step bytes of it with each pair. */
static inline __attribute__((always_inline)) void tile(const uint16_t *x, int64_t x_stride,
                                                       const uint16_t *group,
                                                       int64_t block_stride,
                                                       int64_t pair_stride, int pairs,
                                                       int rows, int blocks, void *out,
                                                       int64_t out_stride, const float *bias,
                                                       const char *prefetch, int pf_step,
                                                       int out_f32, int accumulate) {
    __m512 acc[MR][GROUP];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < blocks; c++)
            acc[r][c] = accumulate ? _mm512_loadu_ps((float *)out + r * out_stride + 16 * c)
                                   : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < pairs; i++) {
        __m512bh b[GROUP];
        for (int c = 0; c < blocks; c++) {
            b[c] = (__m512bh)_mm512_loadu_si512(group + c * block_stride + pair_stride * i);
            __asm__("" : "+v"(b[c])); /* in a register: not reloaded for every row */
        }
        if (prefetch != NULL)
            for (int p = 0; p < pf_step; p += 64)
                __builtin_prefetch(prefetch + (int64_t)i * pf_step + p);
        for (int r = 0; r < rows; r++) {
            int32_t pair;
            memcpy(&pair, x + r * x_stride + 2 * i, sizeof pair);
            const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
            for (int c = 0; c < blocks; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a, b[c]);
        }
    }
    for (int c = 0; c < blocks; c++) {
        if (out_f32) {
            for (int r = 0; r < rows; r++)
                _mm512_storeu_ps((float *)out + r * out_stride + 16 * c, acc[r][c]);
            continue;
        }
        const __m512 add = bias != NULL ? _mm512_loadu_ps(bias + 16 * c) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++)
            _mm256_storeu_si256((__m256i *)((uint16_t *)out + r * out_stride + 16 * c),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][c], add)));
    }
}

/* tile() with its row count (1..MR) and block count (1..GROUP) constants. */
static void run_tile(const uint16_t *x, int64_t x_stride, const uint16_t *group,
                     int64_t block_stride, int pairs, int rows, int blocks, uint16_t *out,
                     int64_t out_stride, const float *bias, const char *prefetch, int pf_step) {
    switch (blocks * 16 + rows) {
#define TILE(r, b)                                                                            \
    case (b) * 16 + (r):                                                                      \
        tile(x, x_stride, group, block_stride, 32, pairs, r, b, out, out_stride, bias,       \
             prefetch, pf_step, 0, 0);                                                        \
        break;
#define BLOCKS(b) \
    TILE(1, b) TILE(2, b) TILE(3, b) TILE(4, b) TILE(5, b) TILE(6, b) TILE(7, b) TILE(8, b)
        BLOCKS(1) BLOCKS(2) BLOCKS(3)
#undef BLOCKS
#undef TILE
    }
}

void dp_rows(const uint16_t *x, int64_t x_stride, const uint16_t *panel, int lanes, int pairs,
             int rows, int vecs, float *out, int accumulate) {
    switch (vecs * 32 + rows * 2 + accumulate) {
#define TILE(r, v, acc)                                                                       \
    case (v) * 32 + (r) * 2 + (acc):                                                          \
        tile(x, x_stride, panel, 32, 2 * (int64_t)lanes, pairs, r, v, out, lanes, NULL, NULL, \
             0, 1, acc);                                                                      \
        break;
#define ROWS(v, acc)                                                                    \
    TILE(1, v, acc) TILE(2, v, acc) TILE(3, v, acc) TILE(4, v, acc) TILE(5, v, acc) \
        TILE(6, v, acc) TILE(7, v, acc) TILE(8, v, acc)
        ROWS(1, 0) ROWS(2, 0) ROWS(3, 0) ROWS(1, 1) ROWS(2, 1) ROWS(3, 1)
#undef ROWS
#undef TILE
    }
}

void dp_pairs(const float *rows, int count, int lanes, int vecs, uint16_t *pairs) {
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                           24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17,
                                           1, 16, 0);
    for (int i = 0; 2 * i < count; i++)
        for (int c = 0; c < vecs; c++) {
            const __m512 even = _mm512_loadu_ps(rows + 2 * i * (int64_t)lanes + 16 * c);
            const __m512 odd = 2 * i + 1 < count
                                   ? _mm512_loadu_ps(rows + (2 * i + 1) * (int64_t)lanes + 16 * c)
                                   : _mm512_setzero_ps();
            const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(odd, even);
            _mm512_storeu_si512(pairs + 2 * i * (int64_t)lanes + 32 * c,
                                _mm512_permutexvar_epi16(order, both));
        }
}

/* r[k] becomes what was lane k of every r[j], as lane j: a 16 x 16 transpose of 32-bit words
 * (pairs of 32-bit words, then of 64, then 128-bit quarters twice). */
static inline __attribute__((always_inline)) void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int k = 0; k < 16; k += 2) {
        t[k] = _mm512_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm512_unpackhi_epi32(r[k], r[k + 1]);
    }
    for (int k = 0; k < 16; k += 4) {
        r[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]);
        r[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]);
        r[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]);
        r[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    for (int k = 0; k < 16; k += 8)
        for (int j = 0; j < 4; j++) {
            t[k + j] = _mm512_shuffle_i32x4(r[k + j], r[k + j + 4], 0x88);
            t[k + j + 4] = _mm512_shuffle_i32x4(r[k + j], r[k + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
    }
}

void dp_keys(const uint16_t *cache, const int64_t *rows, int n, int words, int lanes,
             uint16_t *panel) {
    uint32_t *out = (uint32_t *)panel;
    for (int j0 = 0; j0 < lanes; j0 += 16) {
        int i = 0;
        for (; i + 16 <= words; i += 16) {
            __m512i r[16];
            for (int j = 0; j < 16; j++)
                r[j] = j0 + j < n ? _mm512_loadu_si512(cache + rows[j0 + j] + 2 * i)
                                  : _mm512_setzero_si512();
            transpose16(r);
            for (int k = 0; k < 16; k++)
                _mm512_storeu_si512(out + (int64_t)(i + k) * lanes + j0, r[k]);
        }
        for (; i < words; i++)
            for (int j = 0; j < 16; j++) {
                uint32_t word = 0;
                if (j0 + j < n) memcpy(&word, cache + rows[j0 + j] + 2 * i, sizeof word);
                out[(int64_t)i * lanes + j0 + j] = word;
            }
    }
}

void dp_values(const uint16_t *cache, const int64_t *rows, int n, int hd, uint16_t *panel) {
    uint16_t order[2][32]; /* dims d of a and b side by side: the first 16 dims, the next */
    for (int d = 0; d < 16; d++)
        for (int half = 0; half < 2; half++) {
            order[half][2 * d] = (uint16_t)(16 * half + d);
            order[half][2 * d + 1] = (uint16_t)(32 + 16 * half + d);
        }
    const __m512i first = _mm512_loadu_si512(order[0]), second = _mm512_loadu_si512(order[1]);
    for (int i = 0; 2 * i < n; i++) {
        const uint16_t *a = cache + rows[2 * i];
        const uint16_t *b = 2 * i + 1 < n ? cache + rows[2 * i + 1] : NULL;
        uint16_t *out = panel + (int64_t)i * 2 * hd;
        for (int d = 0; d < hd; d += 32) {
            const __mmask32 dims = hd - d >= 32 ? 0xFFFFFFFFu : 0xFFFFu;
            const __m512i x = _mm512_maskz_loadu_epi16(dims, a + d);
            const __m512i y = b != NULL ? _mm512_maskz_loadu_epi16(dims, b + d)
                                        : _mm512_setzero_si512();
            _mm512_storeu_si512(out + 2 * d, _mm512_permutex2var_epi16(x, first, y));
            if (hd - d > 16)
                _mm512_storeu_si512(out + 2 * d + 32, _mm512_permutex2var_epi16(x, second, y));
        }
    }
}

int linear_bf16_dp(const uint16_t *x, const uint16_t *panels, const float *bias, uint16_t *out,
                   int m, int n, int k, int64_t x_stride, int num_threads) {
    if (k % 2 != 0 || n % 16 != 0 || !dpbf16_usable()) return -1;
    const int pairs = k / 2, blocks = n / 16, groups = (blocks + GROUP - 1) / GROUP;
    const int64_t block_stride = (int64_t)pairs * 32; /* elements of one column block */
    const int num_blocks = row_blocks(m, num_threads, M_BLOCK);
    const int64_t items = (int64_t)groups * num_blocks;
    const int take = take_size(groups, num_threads);
    int64_t next_item = 0, run, run_len;
#pragma omp parallel num_threads(num_threads) private(run, run_len)
    while ((run_len = take_run(&next_item, items, take, num_threads, &run)) > 0) {
        for (int64_t item = run; item < run + run_len; item++) {
            const int g = item % groups, b = item / groups;
            const int m0 = block_start(b, num_blocks, m, MR);
            const int m1 = block_start(b + 1, num_blocks, m, MR);
            const int nb = g * GROUP, count = blocks - nb < GROUP ? blocks - nb : GROUP;
            const uint16_t *group = panels + nb * block_stride;
            const int next_count = blocks - nb - count < GROUP ? blocks - nb - count : GROUP;
            const char *next = next_count > 0 ? (const char *)(group + count * block_stride) : NULL;
            const int tiles = (m1 - m0 + MR - 1) / MR, pf_step = next_count * 64 / tiles;
            for (int r = m0, t = 0; r < m1; r += MR, t++)
                run_tile(x + r * x_stride, x_stride, group, block_stride, pairs,
                         m1 - r < MR ? m1 - r : MR, count, out + (int64_t)r * n + 16 * nb, n,
                         bias != NULL ? bias + 16 * nb : NULL,
                         next != NULL ? next + (int64_t)t * pairs * pf_step : NULL, pf_step);
        }
    }
    return 0;
}
#pragma GCC pop_options

#else
int dpbf16_usable(void) { return 0; }

void dp_rows(const uint16_t *x, int64_t x_stride, const uint16_t *panel, int lanes, int pairs,
             int rows, int vecs, float *out, int accumulate) {}

void dp_pairs(const float *rows, int count, int lanes, int vecs, uint16_t *pairs) {}

void dp_keys(const uint16_t *cache, const int64_t *rows, int n, int words, int lanes,
             uint16_t *panel) {}

void dp_values(const uint16_t *cache, const int64_t *rows, int n, int hd, uint16_t *panel) {}

int linear_bf16_dp(const uint16_t *x, const uint16_t *panels, const float *bias, uint16_t *out,
                   int m, int n, int k, int64_t x_stride, int num_threads) {
    return -1;
}
#endif
