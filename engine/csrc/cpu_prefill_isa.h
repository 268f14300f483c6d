/* The per-ISA part of cpu_prefill.c (included by cpu_targets.h once per SIMD target). The
 * tiles are GCC vector types of 16 floats: each target lowers one to its own registers
 * (one zmm, two ymm, four xmm), so the same source is a register-blocked kernel on all. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, ISA)

/* Keys [t0, t0 + n) of one kv head: kt [head_dim] vectors of KEY_TILE keys (transposed, so
 * that a query's scores for the tile are head_dim vector FMAs), vt [KEY_TILE][head_dim];
 * zeros past n keys. */
static void FN(load_tile)(const struct prefill_args *a, const int32_t *table, int kv_head,
                          int t0, int n, float *kt, float *vt) {
    const int hd = a->head_dim, row_len = a->num_kv_heads * hd;
    for (int j = 0; j < KEY_TILE; j++) {
        if (j >= n) {
            for (int d = 0; d < hd; d++) kt[d * KEY_TILE + j] = vt[j * hd + d] = 0.0f;
            continue;
        }
        const int t = t0 + j;
        const int64_t offset = row_offset(table, t, a->block_size, row_len) + (int64_t)kv_head * hd;
        for (int d = 0; d < hd; d++) kt[d * KEY_TILE + j] = load(a->key_cache, offset + d, a->is_bf16);
        for (int d = 0; d < hd; d++) vt[j * hd + d] = load(a->value_cache, offset + d, a->is_bf16);
    }
}

/* One block of ROW_BLOCK query rows against one key tile: scores, the online softmax's
 * update of each row's max and sum, and acc += p · V. */
static void FN(row_block)(const float *qf, const float *kt, const float *vt, float *acc,
                          float *row_max, float *row_sum, const int *visible, int hd, int n) {
    v16 s[ROW_BLOCK];
    for (int r = 0; r < ROW_BLOCK; r++) s[r] = (v16){0};
    for (int d = 0; d < hd; d++) {
        v16 k;
        LOAD16(k, kt + d * KEY_TILE);
        for (int r = 0; r < ROW_BLOCK; r++) s[r] += qf[r * hd + d] * k;
    }
    float p[ROW_BLOCK][KEY_TILE];
    for (int r = 0; r < ROW_BLOCK; r++) {
        float sc[KEY_TILE];
        STORE16(sc, s[r]);
        const int m = visible[r] < n ? visible[r] : n;
        if (m <= 0) {
            for (int j = 0; j < KEY_TILE; j++) p[r][j] = 0.0f;
            continue;
        }
        float tile_max = -INFINITY;
        for (int j = 0; j < m; j++) tile_max = sc[j] > tile_max ? sc[j] : tile_max;
        const float new_max = tile_max > row_max[r] ? tile_max : row_max[r];
        const float rescale = expf(row_max[r] - new_max);
#pragma omp simd
        for (int j = 0; j < KEY_TILE; j++) p[r][j] = expf(sc[j] - new_max); /* vector expf */
        float tile_sum = 0.0f;
        for (int j = 0; j < KEY_TILE; j++) {
            p[r][j] = j < m ? p[r][j] : 0.0f;
            tile_sum += p[r][j];
        }
        row_sum[r] = row_sum[r] * rescale + tile_sum;
        row_max[r] = new_max;
        for (int d = 0; d < hd; d++) acc[r * hd + d] *= rescale;
    }
    for (int d0 = 0; d0 < hd; d0 += 16) {
        v16 o[ROW_BLOCK];
        for (int r = 0; r < ROW_BLOCK; r++) LOAD16(o[r], acc + r * hd + d0);
        for (int j = 0; j < n; j++) {
            v16 v;
            LOAD16(v, vt + j * hd + d0);
            for (int r = 0; r < ROW_BLOCK; r++) o[r] += p[r][j] * v;
        }
        for (int r = 0; r < ROW_BLOCK; r++) STORE16(acc + r * hd + d0, o[r]);
    }
}

/* Query rows [i0, i1) of sequence s and the query heads of one kv head: causal attention
 * over the sequence's cached keys with an online softmax, one key tile at a time. Rows are
 * (query token, head of the group), ROW_BLOCK at a time (the last block padded with zero
 * queries that see no key). Scratch: prefill_scratch_floats(). */
static void FN(prefill_item)(const struct prefill_args *a, int s, int kv_head, int i0, int i1,
                             float *scratch) {
    const int hd = a->head_dim, group = a->num_heads / a->num_kv_heads;
    const int rows = (i1 - i0) * group, q_len = a->query_lens[s];
    const int padded = (rows + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK;
    const int first_pos = a->seq_lens[s] - q_len; /* the chunk's first query's position */
    const int32_t *table = a->tables + (int64_t)s * a->table_stride;
    float *kt = scratch, *vt = kt + hd * KEY_TILE, *qf = vt + KEY_TILE * hd;
    float *acc = qf + (int64_t)padded * hd, *row_max = acc + (int64_t)padded * hd;
    float *row_sum = row_max + padded;
    int *visible_end = (int *)(row_sum + padded); /* keys below it are visible to the row */
    for (int r = 0; r < padded; r++) {
        for (int d = 0; d < hd; d++) acc[r * hd + d] = qf[r * hd + d] = 0.0f;
        row_max[r] = -INFINITY;
        row_sum[r] = 0.0f;
        visible_end[r] = 0;
        if (r >= rows) continue;
        const int64_t q_row = (int64_t)(a->query_starts[s] + i0 + r / group) * a->num_heads;
        const int64_t offset = (q_row + (int64_t)kv_head * group + r % group) * hd;
        for (int d = 0; d < hd; d++) qf[r * hd + d] = load(a->q, offset + d, a->is_bf16) * a->scale;
        visible_end[r] = first_pos + i0 + r / group + 1;
    }
    const int last_key = first_pos + i1 - 1; /* the tile's last row sees keys up to here */
    for (int t0 = 0; t0 <= last_key; t0 += KEY_TILE) {
        const int n = last_key + 1 - t0 < KEY_TILE ? last_key + 1 - t0 : KEY_TILE;
        FN(load_tile)(a, table, kv_head, t0, n, kt, vt);
        for (int r0 = 0; r0 < padded; r0 += ROW_BLOCK) {
            int visible[ROW_BLOCK], any = 0;
            for (int r = 0; r < ROW_BLOCK; r++) {
                visible[r] = visible_end[r0 + r] - t0;
                any |= visible[r] > 0;
            }
            if (any)
                FN(row_block)(qf + (int64_t)r0 * hd, kt, vt, acc + (int64_t)r0 * hd,
                              row_max + r0, row_sum + r0, visible, hd, n);
        }
    }
    for (int r = 0; r < rows; r++) {
        const int64_t q_row = (int64_t)(a->query_starts[s] + i0 + r / group) * a->num_heads;
        const int64_t offset = (q_row + (int64_t)kv_head * group + r % group) * hd;
        const float inv = 1.0f / row_sum[r];
        for (int d = 0; d < hd; d++) store(a->out, offset + d, a->is_bf16, acc[r * hd + d] * inv);
    }
}

#undef FN
#undef CAT
#undef CAT_
