/* Paged prefill attention for the CPU: each sequence's chunk of query tokens attends
 * causally to its cached context (its earlier tokens and the chunk itself, stored before
 * the call), read from the block-paged cache, with fp32 math and an online softmax; all of
 * a step's chunks in one call.
 *
 * q, out: the flat batch [num_tokens, num_heads, head_dim]; sequence s's queries are rows
 * [query_starts[s], query_starts[s] + query_lens[s]), at positions from seq_lens[s] -
 * query_lens[s] on; caches: [num_blocks, block_size, num_kv_heads, head_dim]; tables:
 * [num_seqs, table_stride] int32. Elements are float32 or bfloat16 bits (is_bf16).
 * head_dim must be a multiple of 16. bf16_dots (bf16 on the AVX-512 path of a CPU with
 * AVX-512-BF16 only): both products as bf16 dot products (cpu_prefill_isa.h). kv_fp8: the
 * caches are e4m3 bytes standing for stored * k_scale (keys) and stored * v_scale (values),
 * widened to float32 as they are packed, k_scale folded into the softmax scale and v_scale
 * into the outputs' normalisation (not with bf16_dots); without kv_fp8 the scales are
 * ignored.
 *
 * The attention kinds (kvserve's AttentionBackend.attend): window > 0, a query at p sees
 * keys p - window < j <= p, and each sequence's keys are packed from the tile holding its
 * first query's first visible key, those before it as zeros (their blocks are never read);
 * softcap > 0, each score s becomes softcap * tanh(s / softcap) before the softmax; sinks
 * (NULL: none), one float32 logit per head that joins each row's softmax sum.
 *
 * Two phases on OpenMP threads (torch's, see cpu_decode.c). First every sequence's keys and
 * values are packed once, per kv head, into float32 tiles of KEY_TILE keys (bf16 with
 * bf16_dots; the values transposed), in one buffer of 8 * head_dim * num_kv_heads bytes per key (every sequence's
 * whole context, rounded up to a tile; the calling thread's workspace, cpu_workspace.c): read
 * and converted once, not once per item.
 * Then the work items, (sequence, kv head, up to one panel of the linear kernel's register
 * tile of rows: NR (query token, head of the group) pairs, 48 on AVX-512), the ones reading
 * the most keys first, stream those tiles through that register tile with the rows in its
 * lanes (cpu_prefill_isa.h). Tiles of 256 keys, not 64: the work done once a tile (the
 * outputs' rescale, the products' loads and stores of their sums) spread over more keys.
 * Returns 0, -1 for an ISA this CPU lacks, a head_dim it does not take or bf16_dots where
 * they cannot run, -2 if memory ran out.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu_common.h"
#include "cpu_dpbf16.h"
#include "cpu_workspace.h"

#define KEY_TILE 256
/* The score of a key a row does not see: finite (-ffast-math assumes no infinities), below
 * any real score, so exp_lanes (cpu_prefill_isa.h) gives it its floor, 2^-115 (~e^-80). */
#define MASKED -1e30f

struct prefill_args {
    const void *q, *key_cache, *value_cache;
    const int32_t *tables, *seq_lens, *query_starts, *query_lens;
    const int *first_tiles; /* sequence s's tile first_tile() is packed tile first_tiles[s] */
    void *out;
    int num_heads, num_kv_heads, head_dim, block_size, table_stride, is_bf16, bf16_dots;
    int kv_fp8;    /* e4m3 caches */
    float scale;   /* the softmax scale times k_scale */
    float v_scale; /* the outputs' factor: 1 for a 16-bit cache */
    const float *sinks; /* [num_heads] logits or NULL */
    int window;         /* 0: none */
    float softcap;      /* 0: none */
};

/* The first key that a query at position p sees. */
static inline int first_visible(const struct prefill_args *a, int p) {
    return a->window > 0 && p >= a->window ? p - a->window + 1 : 0;
}

/* The first key tile of sequence s that is packed: the one holding its first query's first
 * visible key. */
static inline int first_tile(const struct prefill_args *a, int s) {
    return first_visible(a, a->seq_lens[s] - a->query_lens[s]) / KEY_TILE;
}

/* The element where row r of sequence s's chunk (query token r / group, head r % group of
 * kv head kv_head's group) starts in q and out. */
static inline int64_t row_element(const struct prefill_args *a, int s, int kv_head, int r) {
    const int group = a->num_heads / a->num_kv_heads;
    const int64_t token = a->query_starts[s] + r / group;
    return (token * a->num_heads + (int64_t)kv_head * group + r % group) * a->head_dim;
}

#define ISA_BODY "cpu_prefill_isa.h"
#include "cpu_targets.h"

typedef void (*pack_tile_fn)(const struct prefill_args *, int, int, int, float *, float *);
typedef void (*prefill_item_fn)(const struct prefill_args *, const float *, int, int, int, int,
                                float *);

static int most_keys_first(const void *x, const void *y) {
    return ((const int *)y)[4] - ((const int *)x)[4];
}

int paged_prefill(const void *q, const void *key_cache, const void *value_cache,
                  const int32_t *tables, const int32_t *seq_lens, const int32_t *query_starts,
                  const int32_t *query_lens, void *out, int num_seqs, int num_heads,
                  int num_kv_heads, int head_dim, int block_size, int table_stride, float scale,
                  int is_bf16, int bf16_dots, int kv_fp8, float k_scale, float v_scale,
                  const float *sinks, int window, float softcap, int num_threads, int isa) {
    if (head_dim % 16 != 0) return -1;
    if (!isa_usable(isa)) return -1;
    if (bf16_dots && !(is_bf16 && !kv_fp8 && isa == ISA_AVX512 && dpbf16_usable())) return -1;
    const pack_tile_fn pack = PICK(pack_tile, isa);
    const prefill_item_fn item = PICK(prefill_item, isa);
    const int item_rows = PICK(item_rows, isa)(), group = num_heads / num_kv_heads;
    int *first_tiles = malloc(sizeof(int) * (num_seqs > 0 ? num_seqs : 1));
    const struct prefill_args a = {q,          key_cache,    value_cache,  tables,
                                   seq_lens,   query_starts, query_lens,   first_tiles,
                                   out,        num_heads,    num_kv_heads, head_dim,
                                   block_size, table_stride, is_bf16,      bf16_dots,
                                   kv_fp8,     kv_fp8 ? scale * k_scale : scale,
                                   kv_fp8 ? v_scale : 1.0f,  sinks,        window,
                                   softcap};
    /* Items (sequence, kv head, first row, rows, keys it reads), the most keys first; tiles
     * (sequence, its tile index) in packing order. */
    int num_items = 0, num_tiles = 0;
    for (int s = 0; s < num_seqs; s++) {
        num_items += (query_lens[s] * group + item_rows - 1) / item_rows * num_kv_heads;
        num_tiles += (seq_lens[s] + KEY_TILE - 1) / KEY_TILE - first_tile(&a, s);
    }
    const int64_t tile_floats = 2 * (int64_t)head_dim * KEY_TILE;
    int(*items)[5] = malloc(sizeof(int[5]) * (num_items > 0 ? num_items : 1));
    int(*tiles)[2] = malloc(sizeof(int[2]) * (num_tiles > 0 ? num_tiles : 1));
    float *packed = workspace(WORKSPACE_SHARED, sizeof(float) * tile_floats * num_kv_heads *
                                                    (num_tiles > 0 ? num_tiles : 1));
    int failed = items == NULL || tiles == NULL || first_tiles == NULL || packed == NULL;
    if (failed) goto done;
    int n = 0, k = 0;
    for (int s = 0; s < num_seqs; s++) {
        first_tiles[s] = k;
        for (int t = first_tile(&a, s); t * KEY_TILE < seq_lens[s]; t++, k++) {
            tiles[k][0] = s;
            tiles[k][1] = t;
        }
        /* the one item of fewer rows (lanes left idle) is the first: it reads the fewest keys */
        const int rows = query_lens[s] * group, first = rows % item_rows;
        for (int r0 = 0, count = first > 0 ? first : item_rows; r0 < rows;
             r0 += count, count = item_rows)
            for (int h = 0; h < num_kv_heads; h++, n++) {
                items[n][0] = s;
                items[n][1] = h;
                items[n][2] = r0;
                items[n][3] = count;
                items[n][4] = seq_lens[s] - query_lens[s] + (r0 + count - 1) / group + 1 -
                              first_visible(&a, seq_lens[s] - query_lens[s] + r0 / group);
            }
    }
    qsort(items, n, sizeof items[0], most_keys_first);
    /* an item's queries and outputs transposed, one tile's scores and their bf16 pairs; first,
     * a tile's values on their way to being transposed */
    const size_t item_floats = (2 * (size_t)head_dim + KEY_TILE + KEY_TILE / 2) * item_rows;
    const size_t pack_floats = (size_t)KEY_TILE * head_dim;
    const size_t scratch_floats = item_floats > pack_floats ? item_floats : pack_floats;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        float *scratch = workspace(WORKSPACE_THREAD, sizeof(float) * scratch_floats);
        failed |= scratch == NULL;
#pragma omp for schedule(static)
        for (int i = 0; i < num_tiles * num_kv_heads; i++) {
            const int t = i / num_kv_heads;
            if (scratch != NULL)
                pack(&a, tiles[t][0], i % num_kv_heads, tiles[t][1],
                     packed + (int64_t)i * tile_floats, scratch);
        }
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < n; i++)
            if (scratch != NULL)
                item(&a, packed, items[i][0], items[i][1], items[i][2], items[i][3], scratch);
    }
done:
    free(items);
    free(tiles);
    free(first_tiles);
    return failed ? -2 : 0;
}
