/* Helpers shared by the CPU kernels: element access for float32 or bfloat16 tensors
 * (is_bf16), the e4m3 rounding of the FP8 KV cache, and the ISA numbering that Python's
 * cpu_library.ISAS mirrors. */
#ifndef KVSERVE_CPU_COMMON_H
#define KVSERVE_CPU_COMMON_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define ISA_BASELINE 0
#define ISA_AVX2 1
#define ISA_AVX512 2

/* How the linear kernels cut m rows into blocks (their work items are a block of rows times
 * a panel, taken by the threads a few at a time, take_size): blocks of about
 * `most` rows, as many as a multiple of `threads` where that keeps them at least half that
 * size, each a whole number of the tile's `mr` rows and no two more than one tile apart
 * (block_start), so that every thread gets as many rows. Blocks of 128 gave 1,336 rows on 2
 * threads as 704 and 632, and an MLP chunk of 312 rows as 192 and 120; now 672 and 664, 160
 * and 152. m <= most: one block (the threads split its panels). */
static inline int row_blocks(int m, int threads, int most) {
    const int blocks = (m + most - 1) / most, even = (blocks + threads - 1) / threads * threads;
    return m > most && m / even >= most / 2 ? even : blocks;
}

/* How many work items an OpenMP thread takes at a time from a dynamic schedule over runs
 * of `per_block` items (a block of rows' panels): about two takes a thread in each run, at
 * least 1. Dynamic rather than static: a thread slowed by what else its core runs (another
 * process on a shared vCPU, or an SMT sibling on the same AMX unit) leaves the rest of its
 * share to the others instead of holding up the whole layer. Two, not more: a take is a run
 * of consecutive panels, each fetching the next, and eight takes a thread cost a quarter
 * of the time at 16 rows (benchmarks/cpu-levers.md, lever 19). */
static inline int take_size(int64_t per_block, int threads) {
    const int64_t take = per_block / (2 * (int64_t)threads);
    return take > 1 ? (int)take : 1;
}

/* The next run of work items, [*start, *start + returned count), for a thread of a parallel
 * region whose threads share the counter `next` (0 at the start) over `items` items: runs of
 * `take` (take_size) while more than `threads` runs of it are left, then shorter ones (what is
 * left over twice the threads, at least 1), so the threads finish within about one item of
 * each other. Runs of `take` to the end left one thread a whole run behind where the
 * threads' runs did not come out even: 19 panels on 2 threads went 11 and 8 (lever 28).
 * Returns 0 when none are left. */
static inline int64_t take_run(int64_t *next, int64_t items, int take, int threads,
                               int64_t *start) {
    int64_t begin = __atomic_load_n(next, __ATOMIC_RELAXED), count;
    do {
        const int64_t left = items - begin;
        if (left <= 0) return 0;
        count = left > (int64_t)threads * take ? take : (left + 2 * threads - 1) / (2 * threads);
    } while (!__atomic_compare_exchange_n(next, &begin, begin + count, 0, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    *start = begin;
    return count;
}

/* The first row of block b of `blocks` (b == blocks: m). */
static inline int block_start(int b, int blocks, int m, int mr) {
    const int64_t tiles = (m + mr - 1) / mr, start = (int64_t)b * tiles / blocks * mr;
    return start < m ? (int)start : m;
}

static inline float bf16_to_f32(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &wide, sizeof f);
    return f;
}

/* Round to nearest even, as torch converts float32 to bfloat16 (NaN stays NaN). */
static inline uint16_t f32_to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((bits >> 16) | 0x40);
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

/* A value as the tensor's dtype would hold it: float32 unchanged, else rounded to bf16. */
static inline float round_to(float value, int is_bf16) {
    return is_bf16 ? bf16_to_f32(f32_to_bf16(value)) : value;
}

/* A float as e4m3 (the fn kind: no infinities) bits: clamped to +-448, rounded to the
 * nearest, ties to even, as torch converts a clamped float32 (NaN is not expected). Normal
 * results (2^-6 and up) round away float32's low 20 mantissa bits and rebias the exponent
 * (127 to 7); smaller ones are multiples of the subnormal step 2^-9. */
static inline uint8_t f32_to_fp8(float value) {
    value = value > 448.0f ? 448.0f : value < -448.0f ? -448.0f : value;
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    const uint8_t sign = (uint8_t)((bits >> 24) & 0x80);
    uint32_t magnitude = bits & 0x7FFFFFFFu;
    if (magnitude >= (121u << 23)) {
        magnitude += 0x7FFFFu + ((magnitude >> 20) & 1);
        return sign | (uint8_t)((magnitude >> 20) - (120u << 3));
    }
    float small;
    memcpy(&small, &magnitude, sizeof small);
    return sign | (uint8_t)rintf(small * 512.0f);
}

static inline float load(const void *base, int64_t i, int is_bf16) {
    return is_bf16 ? bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static inline void store(void *base, int64_t i, int is_bf16, float value) {
    if (is_bf16)
        ((uint16_t *)base)[i] = f32_to_bf16(value);
    else
        ((float *)base)[i] = value;
}

/* The element offset of token t's row (row_len elements: every kv head) in a paged cache
 * [num_blocks, block_size, row_len], through its sequence's block table. */
static inline int64_t row_offset(const int32_t *table, int t, int block_size, int row_len) {
    return table[t / block_size] * (int64_t)row_len * block_size +
           (int64_t)(t % block_size) * row_len;
}

int best_isa(void);

/* Whether this build and this CPU run `isa` (best_isa() is the baseline off x86-64). */
static inline int isa_usable(int isa) { return isa >= ISA_BASELINE && isa <= best_isa(); }
#endif
