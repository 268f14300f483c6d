/* AVX-512-BF16 dot products (cpu_dpbf16.c) for the other kernels: paged prefill attention's
 * two products on bf16 (cpu_prefill_isa.h), and paged decode attention's where kv heads are
 * grouped (cpu_decode_isa.h). Only where dpbf16_usable(); stubs elsewhere. */
#ifndef KVSERVE_CPU_DPBF16_H
#define KVSERVE_CPU_DPBF16_H
#include <stdint.h>

int dpbf16_usable(void);

/* out[r][0, 16 vecs) = x[r] · panel (+= with accumulate), float32, for rows 1..8 of x (bf16,
 * x_stride elements apart) and vecs 1..3 vectors of 16 lanes; k = 2 pairs. panel: [pairs]
 * [lanes][2] bf16, lane j's k pair i at 2 (i lanes + j); out rows `lanes` floats apart. */
void dp_rows(const uint16_t *x, int64_t x_stride, const uint16_t *panel, int lanes, int pairs,
             int rows, int vecs, float *out, int accumulate);

/* The panel of `count` float32 rows (`lanes` apart, their first 16 vecs lanes) as dp_rows
 * reads it, [ceil(count / 2)][lanes][2] bf16, each value rounded to nearest even; an odd
 * count's last pair ends in zeros. */
void dp_pairs(const float *rows, int count, int lanes, int vecs, uint16_t *pairs);

/* n <= lanes keys (bf16 rows of `words` dim pairs at cache + rows[j]) as a panel for dp_rows,
 * [words][lanes][2]: key j's pair i at 2 (i lanes + j); keys n.. lanes are zeros. lanes: a
 * multiple of 16. */
void dp_keys(const uint16_t *cache, const int64_t *rows, int n, int words, int lanes,
             uint16_t *panel);

/* n values (bf16 rows of hd dims, a multiple of 16, at cache + rows[j]) in pairs of keys as a
 * panel for dp_rows, [ceil(n / 2)][hd][2]: value 2 i + e's dim d at 2 (i hd + d) + e; an odd
 * n's last pair ends in zeros. */
void dp_values(const uint16_t *cache, const int64_t *rows, int n, int hd, uint16_t *panel);
#endif
