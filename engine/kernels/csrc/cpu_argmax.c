/* Row argmax for the sampler: out[r] is the first index of row r's largest value, exactly
 * as torch.argmax(x, dim=-1) gives it, a NaN counting as larger than any number (so a row
 * with one answers its first NaN). torch's CPU argmax compares one element at a time
 * (~1.9 ms for 64 x 32,000 floats on two cores, ~1.8 ms of a decode step); here each row
 * takes one vectorised pass (cpu_argmax_isa.h).
 * x: [rows, cols] float32, rows row_stride elements apart; out: rows int64. Rows run on
 * OpenMP threads. Returns 0, or -1 for an ISA this CPU lacks. */
#include <stdint.h>

#include "cpu_common.h"

#define ISA_BODY "cpu_argmax_isa.h"
#include "cpu_targets.h"

int row_argmax(const float *x, int64_t *out, int rows, int cols, int64_t row_stride,
               int num_threads, int isa) {
    if (!isa_usable(isa)) return -1;
    int64_t (*row)(const float *, int) = PICK(argmax_row, isa);
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int r = 0; r < rows; r++) out[r] = row(x + r * row_stride, cols);
    return 0;
}
