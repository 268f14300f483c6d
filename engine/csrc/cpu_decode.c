/* Paged decode attention for the CPU: one query token per sequence, keys and values read
 * in place from the block-paged cache (no gather), fp32 math.
 *
 * q, out: [num_seqs, num_heads, head_dim]; caches: [num_blocks, block_size, num_kv_heads,
 * head_dim]; tables: [num_seqs, table_stride] int32; seq_lens: [num_seqs] int32. Elements
 * are float32 or bfloat16 bits (is_bf16); head_dim must be a multiple of 16.
 *
 * The work items are (sequence, range of kv heads): whole sequences when there are enough
 * of them to keep every thread busy, else each sequence's heads split further. They run on
 * OpenMP threads: loaded into a torch process, this library shares torch's OpenMP runtime
 * (libgomp.so.1) and so its warm thread pool. The loops (cpu_decode_isa.h) are compiled
 * once per SIMD target (cpu_targets.h) and `isa` picks one at run time.
 */
#include <math.h>

#include "cpu_common.h"
#include "cpu_workspace.h"

struct decode_args {
    const void *q, *key_cache, *value_cache;
    const int32_t *tables, *seq_lens;
    void *out;
    int num_seqs, num_heads, num_kv_heads, head_dim, block_size, table_stride, is_bf16;
    float scale;
};

/* Tokens per block of the context (cpu_decode_isa.h): 4 measured fastest of 2-16 on an
 * Intel Xeon (benchmarks/cpu-levers.md, lever 8). */
#define DECODE_BLOCK 4

static inline void prefetch(const char *p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i);
}

#define ISA_BODY "cpu_decode_isa.h"
#include "cpu_targets.h"

typedef void (*decode_item_fn)(const struct decode_args *, int, int, int, float *);

/* 0 on success, -1 for an ISA this build or this CPU lacks or a head_dim it does not take,
 * -2 if scratch memory ran out. */
int paged_decode(const void *q, const void *key_cache, const void *value_cache,
                 const int32_t *tables, const int32_t *seq_lens, void *out, int num_seqs,
                 int num_heads, int num_kv_heads, int head_dim, int block_size, int table_stride,
                 float scale, int is_bf16, int num_threads, int isa) {
    if (head_dim % 16 != 0 || !isa_usable(isa)) return -1;
    const decode_item_fn item = PICK(decode_item, isa);
    const struct decode_args a = {q,        key_cache, value_cache,  tables,  seq_lens,
                                  out,      num_seqs,  num_heads,    num_kv_heads,
                                  head_dim, block_size, table_stride, is_bf16, scale};
    int max_len = 0;
    for (int s = 0; s < num_seqs; s++) max_len = seq_lens[s] > max_len ? seq_lens[s] : max_len;
    /* Enough items for about four per thread, never more than one per kv head. */
    int chunks = (4 * num_threads + num_seqs - 1) / num_seqs;
    chunks = chunks < 1 ? 1 : chunks > num_kv_heads ? num_kv_heads : chunks;
    const int per_chunk = (num_kv_heads + chunks - 1) / chunks;
    chunks = (num_kv_heads + per_chunk - 1) / per_chunk;
    const int heads = per_chunk * (num_heads / num_kv_heads);
    const size_t scratch_floats = (size_t)heads * max_len + 2 * (size_t)heads * head_dim;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        float *scratch = workspace(WORKSPACE_THREAD, sizeof(float) * scratch_floats);
        failed |= scratch == NULL;
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < num_seqs * chunks; i++) {
            const int h0 = (i % chunks) * per_chunk;
            const int h1 = h0 + per_chunk < num_kv_heads ? h0 + per_chunk : num_kv_heads;
            if (scratch != NULL) item(&a, i / chunks, h0, h1, scratch);
        }
    }
    return failed ? -2 : 0;
}
