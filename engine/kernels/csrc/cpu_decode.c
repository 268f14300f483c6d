/* Paged decode attention for the CPU: one query token per sequence, keys and values read
 * in place from the block-paged cache (no gather), fp32 math; or, with bf16_dots (bf16 on
 * the AVX-512 path of a CPU with AVX-512-BF16) for groups of DOTS_MIN_GROUP query heads or
 * more on a kv head, bf16 dot products (decode_dots, cpu_decode_isa.h).
 *
 * q: num_seqs rows of [num_heads, head_dim], q_stride elements apart (a view of the qkv
 * projection's output, say); out: [num_seqs, num_heads, head_dim]; caches: [num_blocks, block_size, num_kv_heads,
 * head_dim]; tables: [num_seqs, table_stride] int32; seq_lens: [num_seqs] int32. Elements
 * are float32 or bfloat16 bits (is_bf16); head_dim must be a multiple of 16. With kv_fp8 the
 * caches are e4m3 bytes standing for stored * k_scale (keys) and stored * v_scale (values):
 * k_scale is folded into the softmax scale and v_scale into the output, each block's rows
 * widened to float32 once (decode_pass); bf16_dots does not take them. The scales are
 * ignored without kv_fp8.
 *
 * The attention kinds (kvserve's AttentionBackend.attend), each outside the loops over the
 * keys: window > 0 starts each context at its last `window` tokens (the blocks before them
 * are never read); softcap > 0 turns each score s into softcap * tanh(s / softcap) before
 * the softmax; sinks (NULL: none) holds one float32 logit per head that joins the softmax
 * sum, once per context (decode_merge takes it for a split one).
 *
 * The work items are (sequence, range of its tokens), every head of whole cache rows: whole
 * contexts when the batch holds enough tokens to keep every thread busy, else each context
 * split into ranges, whose partial softmax sums are merged once all items are done (as
 * flash-decoding splits the keys). Whole rows stream: splitting few sequences by kv heads
 * instead read every other span of each row, 20-25 % slower (benchmarks/cpu-levers.md,
 * lever 15). The items run on OpenMP threads: loaded into a torch process, this library
 * shares torch's OpenMP runtime (libgomp.so.1) and so its warm thread pool. The loops
 * (cpu_decode_isa.h) are compiled once per SIMD target (cpu_targets.h) and `isa` picks
 * one at run time.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu_common.h"
#include "cpu_dpbf16.h"
#include "cpu_workspace.h"

struct decode_args {
    const void *q, *key_cache, *value_cache;
    const int32_t *tables, *seq_lens;
    void *out;
    int64_t q_stride; /* elements from one sequence's query row to the next */
    int num_seqs, num_heads, num_kv_heads, head_dim, block_size, table_stride, is_bf16;
    int bf16_dots; /* grouped kv heads take decode_dots (cpu_decode_isa.h) */
    int kv_fp8;    /* e4m3 caches */
    float scale;   /* the softmax scale times k_scale */
    float v_scale; /* the outputs' factor: 1 for a 16-bit cache */
    const float *sinks; /* [num_heads] logits or NULL */
    float softcap;      /* 0: none */
};

/* Tokens per block of the context (cpu_decode_isa.h): 4 measured fastest of 2-16 on an
 * Intel Xeon (benchmarks/cpu-levers.md, lever 8). */
#define DECODE_BLOCK 4
/* The least a range may span: a context of up to MIN_SPAN tokens stays whole, so that a
 * range's query loads, softmax and merge stay small next to its reads (128 measured fastest
 * of 32, 64 and 128); and the most ranges of one context. */
#define MIN_SPAN 128
#define MAX_RANGES 64
/* decode_dots: the least group it takes (alone, 64 sequences of 96-576 tokens: groups of
 * 5-8 1.2-1.8x faster than decode_pass, 4 level, 2-3 up to 1.2x slower where kv heads are
 * many; benchmarks/cpu-levers.md, lever 27), keys packed at a time (three vectors of 16,
 * dp_rows' widest panel), the most rows of one dp_rows call, and the floats of its
 * scratch. */
#define DOTS_MIN_GROUP 5
#define DOT_KEYS 48
#define MR_DOTS 8
#define DOTS_SCRATCH(heads, kv_heads, len, hd)                                             \
    ((size_t)(heads) * ((len) + 1) * 3 / 2 + 1 + (size_t)(heads) * (hd) + MR_DOTS * DOT_KEYS + \
     (size_t)DOT_KEYS * (kv_heads) * (hd) / 2)

/* Into L2 (locality 1), not L1: on an AMD EPYC Zen 4 the L1 prefetches held up the loads
 * of the rows in use (bf16 1.3-1.6x slower, fp32 1.1-1.3x), and the hardware brings the
 * lines from L2 in time (benchmarks/cpu-levers.md, lever 20). */
static inline void prefetch(const char *p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 1);
}

#define ISA_BODY "cpu_decode_isa.h"
#include "cpu_targets.h"

typedef void (*decode_item_fn)(const struct decode_args *, int, int, int, float *, float *);

/* Sequence s's output from its ranges' partials (decode_item): each head's sums rescaled
 * to the largest of the ranges' maxima, added, and divided by the rescaled sums. */
static void decode_merge(const struct decode_args *a, int s, const float *partials, int ranges) {
    const int hd = a->head_dim, row = hd + 2;
    for (int h = 0; h < a->num_heads; h++) {
        const float *first = partials + (int64_t)h * row;
        const int64_t range_stride = (int64_t)a->num_heads * row;
        float max = a->sinks != NULL ? a->sinks[h] : -INFINITY, sum = 0.0f;
        float weights[MAX_RANGES];
        for (int r = 0; r < ranges; r++) {
            const float m = first[r * range_stride + hd];
            max = m > max ? m : max;
        }
        for (int r = 0; r < ranges; r++) {
            weights[r] = expf(first[r * range_stride + hd] - max);
            sum += weights[r] * first[r * range_stride + hd + 1];
        }
        if (a->sinks != NULL) sum += expf(a->sinks[h] - max);
        const int64_t out = ((int64_t)s * a->num_heads + h) * hd;
        for (int i = 0; i < hd; i++) {
            float value = 0.0f;
            for (int r = 0; r < ranges; r++) value += weights[r] * first[r * range_stride + i];
            store(a->out, out + i, a->is_bf16, value / sum * a->v_scale);
        }
    }
}

/* The first token of sequence s's context that its query sees. */
static inline int first_token(const int32_t *seq_lens, int s, int window) {
    return window > 0 && seq_lens[s] > window ? seq_lens[s] - window : 0;
}

/* The ranges a context of len tokens splits into: one per span tokens, at least one (an
 * empty context too) and at most MAX_RANGES. */
static int ranges_of(int len, int span) {
    const int ranges = (len + span - 1) / span;
    return ranges < 1 ? 1 : ranges > MAX_RANGES ? MAX_RANGES : ranges;
}

/* 0 on success, -1 for an ISA this build or this CPU lacks or a head_dim it does not take,
 * -2 if memory ran out. */
int paged_decode(const void *q, const void *key_cache, const void *value_cache,
                 const int32_t *tables, const int32_t *seq_lens, void *out, int64_t q_stride,
                 int num_seqs,
                 int num_heads, int num_kv_heads, int head_dim, int block_size, int table_stride,
                 float scale, int is_bf16, int bf16_dots, int kv_fp8, float k_scale,
                 float v_scale, const float *sinks, int window, float softcap, int num_threads,
                 int isa) {
    if (head_dim % 16 != 0 || !isa_usable(isa)) return -1;
    if (bf16_dots && !(is_bf16 && !kv_fp8 && isa == ISA_AVX512 && dpbf16_usable())) return -1;
    const decode_item_fn item = PICK(decode_item, isa);
    const struct decode_args a = {q,          key_cache,    value_cache, tables,
                                  seq_lens,   out,          q_stride,    num_seqs,
                                  num_heads,  num_kv_heads, head_dim,    block_size,
                                  table_stride, is_bf16,    bf16_dots,   kv_fp8,
                                  kv_fp8 ? scale * k_scale : scale, kv_fp8 ? v_scale : 1.0f,
                                  sinks,      softcap};
    /* About four items per thread: each context in equal ranges of at most `span` tokens,
     * whole where it is no longer (so a large batch runs one item per sequence). */
    int64_t total = 0;
    for (int s = 0; s < num_seqs; s++) total += seq_lens[s] - first_token(seq_lens, s, window);
    int span = (int)((total + 4 * num_threads - 1) / (4 * num_threads));
    span = span < MIN_SPAN ? MIN_SPAN : span;
    span = (span + DECODE_BLOCK - 1) / DECODE_BLOCK * DECODE_BLOCK;
    int num_items = 0, max_len = 1;
    for (int s = 0; s < num_seqs; s++)
        num_items += ranges_of(seq_lens[s] - first_token(seq_lens, s, window), span);
    const int split = num_items > num_seqs;
    /* items: sequence, first token, end, and the number of ranges of its context (a split
     * context's ranges are consecutive items, its partials consecutive slots) */
    int(*items)[4] = malloc(sizeof(int[4]) * (num_items > 0 ? num_items : 1));
    const size_t partial_floats = (size_t)num_heads * (head_dim + 2);
    float *partials =
        split ? workspace(WORKSPACE_SHARED, sizeof(float) * partial_floats * num_items) : NULL;
    int failed = items == NULL || (split && partials == NULL);
    if (failed) goto done;
    for (int s = 0, n = 0; s < num_seqs; s++) {
        const int begin = first_token(seq_lens, s, window), len = seq_lens[s] - begin;
        const int ranges = ranges_of(len, span);
        for (int r = 0; r < ranges; r++, n++) {
            items[n][0] = s;
            items[n][1] = begin + (int)((int64_t)r * len / ranges);
            items[n][2] = begin + (int)((int64_t)(r + 1) * len / ranges);
            items[n][3] = ranges;
            max_len = items[n][2] - items[n][1] > max_len ? items[n][2] - items[n][1] : max_len;
        }
    }
    size_t scratch_floats = (size_t)num_heads * max_len + 2 * (size_t)num_heads * head_dim;
    if (kv_fp8) scratch_floats += (size_t)DECODE_BLOCK * num_kv_heads * head_dim;
    const size_t dots_floats = DOTS_SCRATCH(num_heads, num_kv_heads, max_len, head_dim);
    if (bf16_dots && dots_floats > scratch_floats) scratch_floats = dots_floats;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        float *scratch = workspace(WORKSPACE_THREAD, sizeof(float) * scratch_floats);
        failed |= scratch == NULL;
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < num_items; i++)
            if (scratch != NULL)
                item(&a, items[i][0], items[i][1], items[i][2], scratch,
                     items[i][3] > 1 ? partials + (int64_t)i * partial_floats : NULL);
        if (split) {
#pragma omp for schedule(static)
            for (int i = 0; i < num_items; i++)
                if (items[i][3] > 1 && items[i][1] == first_token(seq_lens, items[i][0], window))
                    /* a split context's first range */
                    decode_merge(&a, items[i][0], partials + (int64_t)i * partial_floats,
                                 items[i][3]);
        }
    }
done:
    free(items);
    return failed ? -2 : 0;
}
