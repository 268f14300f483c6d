/* The step's new keys and values written into the paged cache for the CPU, one row copy per
 * token on OpenMP threads (torch's, see cpu_decode.c), where torch's index_copy_ took two
 * passes and a check of the slots first.
 *
 * key, value: [tokens, row_len] rows at key_stride / value_stride elements apart (views of
 * the fused qkv projection); caches: [slots, row_len] (the paged cache [num_blocks,
 * block_size, num_kv_heads, head_dim] seen flat); slots: [tokens]. A negative slot is a
 * padding row and writes nothing. Elements are float32 or bfloat16 bits (is_bf16): copied,
 * never converted. Returns 0.
 */
#include <stdint.h>
#include <string.h>

/* Fewer tokens than this are copied on the calling thread: waking the team costs more. */
#define PARALLEL_TOKENS 64

int store_kv(const void *key, const void *value, void *key_cache, void *value_cache,
             const int64_t *slots, int tokens, int row_len, int64_t key_stride,
             int64_t value_stride, int is_bf16, int num_threads) {
    const int64_t size = is_bf16 ? 2 : 4, bytes = row_len * size;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (tokens >= PARALLEL_TOKENS)
    for (int t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        memcpy((char *)key_cache + slots[t] * bytes, (const char *)key + t * key_stride * size,
               bytes);
        memcpy((char *)value_cache + slots[t] * bytes,
               (const char *)value + t * value_stride * size, bytes);
    }
    return 0;
}
