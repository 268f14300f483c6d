/* Paged prefill attention for the CPU: each sequence's chunk of query tokens attends
 * causally to its cached context (its earlier tokens and the chunk itself, stored before
 * the call), read in place from the block-paged cache, with fp32 math and an online
 * softmax; all of a step's chunks in one call.
 *
 * q, out: the flat batch [num_tokens, num_heads, head_dim]; sequence s's queries are rows
 * [query_starts[s], query_starts[s] + query_lens[s]), at positions from seq_lens[s] -
 * query_lens[s] on; caches: [num_blocks, block_size, num_kv_heads, head_dim]; tables:
 * [num_seqs, table_stride] int32. Elements are float32 or bfloat16 bits (is_bf16).
 * head_dim must be a multiple of 16.
 *
 * Work items are (sequence, kv head, QUERY_TILE query tokens), the ones reading the most
 * keys first, on OpenMP threads (torch's, see cpu_decode.c). Each streams its keys in tiles
 * of KEY_TILE and its rows in blocks of ROW_BLOCK (cpu_prefill_isa.h). Returns 0, -1 for an
 * ISA this CPU lacks or a head_dim it does not take, -2 if memory ran out.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu_common.h"

#define KEY_TILE 16
#define QUERY_TILE 64
#define ROW_BLOCK 8

struct prefill_args {
    const void *q, *key_cache, *value_cache;
    const int32_t *tables, *seq_lens, *query_starts, *query_lens;
    void *out;
    int num_heads, num_kv_heads, head_dim, block_size, table_stride, is_bf16;
    float scale;
};

#define ISA_BODY "cpu_prefill_isa.h"
#include "cpu_targets.h"

typedef void (*prefill_item_fn)(const struct prefill_args *, int, int, int, int, float *);

static int most_keys_first(const void *x, const void *y) {
    return ((const int *)y)[3] - ((const int *)x)[3];
}

int paged_prefill(const void *q, const void *key_cache, const void *value_cache,
                  const int32_t *tables, const int32_t *seq_lens, const int32_t *query_starts,
                  const int32_t *query_lens, void *out, int num_seqs, int num_heads,
                  int num_kv_heads, int head_dim, int block_size, int table_stride, float scale,
                  int is_bf16, int num_threads, int isa) {
    if (head_dim % 16 != 0) return -1;
    if (!isa_usable(isa)) return -1;
    const prefill_item_fn item = PICK(prefill_item, isa);
    const struct prefill_args a = {q,         key_cache,    value_cache,  tables,
                                   seq_lens,  query_starts, query_lens,   out,
                                   num_heads, num_kv_heads, head_dim,     block_size,
                                   table_stride, is_bf16,   scale};
    /* Items (sequence, kv head, first query, keys it reads), the most keys first. */
    int num_items = 0;
    for (int s = 0; s < num_seqs; s++)
        num_items += (query_lens[s] + QUERY_TILE - 1) / QUERY_TILE * num_kv_heads;
    int(*items)[4] = malloc(sizeof(int[4]) * (num_items > 0 ? num_items : 1));
    if (items == NULL) return -2;
    int n = 0;
    for (int s = 0; s < num_seqs; s++)
        for (int i0 = 0; i0 < query_lens[s]; i0 += QUERY_TILE)
            for (int h = 0; h < num_kv_heads; h++, n++) {
                const int i1 = i0 + QUERY_TILE < query_lens[s] ? i0 + QUERY_TILE : query_lens[s];
                items[n][0] = s;
                items[n][1] = h;
                items[n][2] = i0;
                items[n][3] = seq_lens[s] - query_lens[s] + i1;
            }
    qsort(items, n, sizeof items[0], most_keys_first);
    const int group = num_heads / num_kv_heads;
    const int rows = (QUERY_TILE * group + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK;
    /* key and value tiles, queries and accumulators, row maxima, sums and visible ends */
    const size_t scratch_floats =
        2 * (size_t)head_dim * KEY_TILE + 2 * (size_t)rows * head_dim + 3 * (size_t)rows;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        float *scratch = malloc(sizeof(float) * scratch_floats);
        failed |= scratch == NULL;
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < n; i++) {
            const int s = items[i][0], i0 = items[i][2];
            const int i1 = i0 + QUERY_TILE < query_lens[s] ? i0 + QUERY_TILE : query_lens[s];
            if (scratch != NULL) item(&a, s, items[i][1], i0, i1, scratch);
        }
        free(scratch);
    }
    free(items);
    return failed ? -2 : 0;
}
