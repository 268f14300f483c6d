/* The step's new keys and values written into the paged cache for the CPU, one row per
 * token on OpenMP threads (torch's, see cpu_decode.c), where torch's index_copy_ took two
 * passes and a check of the slots first.
 *
 * key, value: [tokens, row_len] rows at key_stride / value_stride elements apart (views of
 * the fused qkv projection); caches: [slots, row_len] (the paged cache [num_blocks,
 * block_size, num_kv_heads, head_dim] seen flat); slots: [tokens]. A negative slot is a
 * padding row and writes nothing. Elements are float32 or bfloat16 bits (is_bf16): copied,
 * never converted; or, with kv_fp8, the caches are e4m3 bytes and take each key times
 * k_inv_scale and each value times v_inv_scale, rounded (f32_to_fp8). Returns 0.
 */
#include <stdint.h>
#include <string.h>

#include "cpu_common.h"

/* Fewer tokens than this are copied on the calling thread: waking the team costs more. */
#define PARALLEL_TOKENS 64

/* One row of row_len elements as e4m3 bytes, each times inv_scale. */
static void quantize_row(uint8_t *out, const void *row, int row_len, int is_bf16,
                         float inv_scale) {
    for (int e = 0; e < row_len; e++) out[e] = f32_to_fp8(load(row, e, is_bf16) * inv_scale);
}

int store_kv(const void *key, const void *value, void *key_cache, void *value_cache,
             const int64_t *slots, int tokens, int row_len, int64_t key_stride,
             int64_t value_stride, int is_bf16, int kv_fp8, float k_inv_scale,
             float v_inv_scale, int num_threads) {
    const int64_t size = is_bf16 ? 2 : 4, bytes = row_len * size;
    if (kv_fp8) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (tokens >= PARALLEL_TOKENS)
        for (int t = 0; t < tokens; t++) {
            if (slots[t] < 0) continue;
            quantize_row((uint8_t *)key_cache + slots[t] * row_len,
                         (const char *)key + t * key_stride * size, row_len, is_bf16,
                         k_inv_scale);
            quantize_row((uint8_t *)value_cache + slots[t] * row_len,
                         (const char *)value + t * value_stride * size, row_len, is_bf16,
                         v_inv_scale);
        }
        return 0;
    }
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
