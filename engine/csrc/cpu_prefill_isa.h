/* The per-ISA part of cpu_prefill.c (included by cpu_targets.h once per SIMD target). The
 * tiles are GCC vector types of the target's own width, so the same source is a
 * register-blocked kernel on each: a key tile's scores are VECS of the target's vectors
 * (vec, cpu_target_body.h), and so are OUT_FLOATS output dims; TILE_ROWS rows of either,
 * and the VECS key or value vectors they multiply, fit the target's VEC_REGS registers. */
#define VECS (KEY_TILE / VEC)
#define OUT_FLOATS KEY_TILE
#define FIT ((VEC_REGS - VECS) / VECS)
#define TILE_ROWS (FIT >= 8 ? 8 : FIT >= 4 ? 4 : FIT >= 2 ? 2 : 1)

/* Packs key tile `tile` of one kv head of sequence s (keys from KEY_TILE * tile on) into
 * kt [head_dim][KEY_TILE] (transposed: a query's scores for the tile are head_dim vector
 * FMAs) and vt [KEY_TILE][head_dim], as float32, zeros past the sequence's last key. Each
 * cache row is copied whole (a vector copy or conversion), the keys into a buffer on the
 * stack that is transposed from L1 into kt. */
static void FN(pack_tile)(const struct prefill_args *a, int s, int kv_head, int tile, float *kt) {
    const int hd = a->head_dim, row_len = a->num_kv_heads * hd, len = a->seq_lens[s];
    const int32_t *table = a->tables + (int64_t)s * a->table_stride;
    float *vt = kt + hd * KEY_TILE, keys[KEY_TILE * hd];
    for (int j = 0; j < KEY_TILE; j++) {
        const int t = tile * KEY_TILE + j;
        float *k = keys + j * hd, *v = vt + j * hd;
        if (t >= len) {
            memset(k, 0, sizeof(float) * hd);
            memset(v, 0, sizeof(float) * hd);
            continue;
        }
        const int64_t offset = row_offset(table, t, a->block_size, row_len) + (int64_t)kv_head * hd;
        if (a->is_bf16) {
            const uint16_t *kb = (const uint16_t *)a->key_cache + offset;
            const uint16_t *vb = (const uint16_t *)a->value_cache + offset;
            for (int d = 0; d < hd; d++) k[d] = bf16_to_f32(kb[d]);
            for (int d = 0; d < hd; d++) v[d] = bf16_to_f32(vb[d]);
        } else {
            memcpy(k, (const float *)a->key_cache + offset, sizeof(float) * hd);
            memcpy(v, (const float *)a->value_cache + offset, sizeof(float) * hd);
        }
    }
    for (int d = 0; d < hd; d++)
        for (int j = 0; j < KEY_TILE; j++) kt[d * KEY_TILE + j] = keys[j * hd + d];
}

/* p[j] = e^(p[j] - max) for the KEY_TILE scores of a row (none above max), and their sum.
 * Inline, not libmvec's expf (a call per vector, and a scalar path for every masked key):
 * e^x = 2^t = 2^n 2^f with t = x log2 e, n = round(t), |f| <= 1/2, and 2^f by a degree-6
 * polynomial fitted to its relative error on [-1/2, 1/2] (1.0e-7 in float32 arithmetic, as
 * close as float32 Horner gets). t is clamped at -115, so a masked key weighs 2^-115
 * (~2e-35, a normal float: no subnormal reaches the products). */
static inline __attribute__((always_inline)) float FN(exp_tile)(float *p, float max) {
    typedef int veci __attribute__((vector_size(VEC * sizeof(int))));
    const vec lowest = (vec){0} - 115.0f, half = (vec){0} + 0.5f;
    vec total = {0};
    for (int c = 0; c < VECS; c++) {
        vec x;
        LOADV(x, p + VEC * c);
        vec t = (x - max) * 1.44269504f; /* log2 e */
        const veci low = t < lowest;
        t = (vec)(((veci)t & ~low) | ((veci)lowest & low));
        const veci n = __builtin_convertvector(t - half, veci); /* t <= 0: to nearest */
        const vec f = t - __builtin_convertvector(n, vec);
        vec y = f * 1.5345807e-4f + 1.3399931e-3f;
        y = y * f + 9.6184891e-3f;
        y = y * f + 5.5503286e-2f;
        y = y * f + 2.4022646e-1f;
        y = y * f + 6.9314718e-1f;
        y = y * f + 1.0f;
        y = (vec)((veci)y + (n << 23)); /* times 2^n: n >= -115, the result stays normal */
        STOREV(p + VEC * c, y);
        total += y;
    }
    float sum = 0.0f;
    for (int i = 0; i < VEC; i++) sum += total[i];
    return sum;
}

/* acc[r][0, nv VEC) += p[r] · vt[:, 0, nv VEC) for TILE_ROWS rows (row stride hd), the
 * outputs in registers; inlined with nv a constant (VECS, or 16 / VEC for the tail). */
static inline __attribute__((always_inline)) void FN(add_pv)(const float (*p)[KEY_TILE],
                                                            const float *vt, float *acc, int hd,
                                                            int nv) {
    vec o[TILE_ROWS][VECS];
    for (int r = 0; r < TILE_ROWS; r++)
        for (int c = 0; c < nv; c++) LOADV(o[r][c], acc + r * hd + VEC * c);
    for (int j = 0; j < KEY_TILE; j++) {
        vec v[VECS];
        for (int c = 0; c < nv; c++) LOADV(v[c], vt + j * hd + VEC * c);
        for (int r = 0; r < TILE_ROWS; r++)
            for (int c = 0; c < nv; c++) o[r][c] += p[r][j] * v[c];
    }
    for (int r = 0; r < TILE_ROWS; r++)
        for (int c = 0; c < nv; c++) STOREV(acc + r * hd + VEC * c, o[r][c]);
}

/* One block of ROW_BLOCK query rows against one packed key tile: scores, the online
 * softmax's update of each row's max and sum, and acc += p · V. visible[r] (0..KEY_TILE):
 * how many of the tile's keys row r sees. A row's accumulator is rescaled only when the
 * tile raises its max, which after the first tiles is rare. The products run TILE_ROWS rows
 * at a time, in the target's own vectors (VEC floats each, cpu_targets.h): a row's scores
 * for the tile and its outputs for OUT_FLOATS dims are VECS vectors each. */
static void FN(row_block)(const float *qf, const float *kt, float *acc, float *row_max,
                          float *row_sum, const int *visible, int hd) {
    const float *vt = kt + hd * KEY_TILE;
    float p[ROW_BLOCK][KEY_TILE];
    for (int r0 = 0; r0 < ROW_BLOCK; r0 += TILE_ROWS) {
        vec s[TILE_ROWS][VECS];
        for (int r = 0; r < TILE_ROWS; r++)
            for (int c = 0; c < VECS; c++) s[r][c] = (vec){0};
        for (int d = 0; d < hd; d++) {
            vec k[VECS];
            for (int c = 0; c < VECS; c++) LOADV(k[c], kt + d * KEY_TILE + VEC * c);
            for (int r = 0; r < TILE_ROWS; r++)
                for (int c = 0; c < VECS; c++) s[r][c] += qf[(r0 + r) * hd + d] * k[c];
        }
        for (int r = 0; r < TILE_ROWS; r++)
            for (int c = 0; c < VECS; c++) STOREV(p[r0 + r] + VEC * c, s[r][c]);
    }
    for (int r = 0; r < ROW_BLOCK; r++) {
        float *pr = p[r];
        if (visible[r] == 0) {
            memset(pr, 0, sizeof p[r]);
            continue;
        }
        for (int j = visible[r]; j < KEY_TILE; j++) pr[j] = MASKED;
        float tile_max = MASKED;
#pragma omp simd reduction(max : tile_max)
        for (int j = 0; j < KEY_TILE; j++) tile_max = pr[j] > tile_max ? pr[j] : tile_max;
        if (tile_max > row_max[r]) {
            if (row_max[r] != MASKED) { /* else the row's sum and accumulator are still 0 */
                const float rescale = expf(row_max[r] - tile_max);
                row_sum[r] *= rescale;
                for (int d = 0; d < hd; d++) acc[r * hd + d] *= rescale;
            }
            row_max[r] = tile_max;
        }
        row_sum[r] += FN(exp_tile)(pr, row_max[r]);
    }
    for (int r0 = 0; r0 < ROW_BLOCK; r0 += TILE_ROWS) {
        int d0 = 0;
        for (; d0 + OUT_FLOATS <= hd; d0 += OUT_FLOATS)
            FN(add_pv)(p + r0, vt + d0, acc + r0 * hd + d0, hd, VECS);
        for (; d0 < hd; d0 += 16) /* hd % 16 == 0: the rest, 16 dims a pass */
            FN(add_pv)(p + r0, vt + d0, acc + r0 * hd + d0, hd, 16 / VEC);
    }
}

/* Query rows [i0, i1) of sequence s and the query heads of one kv head: causal attention
 * over the sequence's packed key tiles with an online softmax. Rows are (query token, head
 * of the group), ROW_BLOCK at a time (the last block padded with zero queries that see no
 * key). Scratch: prefill_scratch_floats(). */
static void FN(prefill_item)(const struct prefill_args *a, const float *packed, int s, int kv_head,
                             int i0, int i1, float *scratch) {
    const int hd = a->head_dim, group = a->num_heads / a->num_kv_heads;
    const int rows = (i1 - i0) * group, q_len = a->query_lens[s];
    const int padded = (rows + ROW_BLOCK - 1) / ROW_BLOCK * ROW_BLOCK;
    const int first_pos = a->seq_lens[s] - q_len; /* the chunk's first query's position */
    float *qf = scratch, *acc = qf + (int64_t)padded * hd, *row_max = acc + (int64_t)padded * hd;
    float *row_sum = row_max + padded;
    int *visible_end = (int *)(row_sum + padded); /* keys below it are visible to the row */
    for (int r = 0; r < padded; r++) {
        for (int d = 0; d < hd; d++) acc[r * hd + d] = qf[r * hd + d] = 0.0f;
        row_max[r] = MASKED;
        row_sum[r] = 0.0f;
        visible_end[r] = 0;
        if (r >= rows) continue;
        const int64_t q_row = (int64_t)(a->query_starts[s] + i0 + r / group) * a->num_heads;
        const int64_t offset = (q_row + (int64_t)kv_head * group + r % group) * hd;
        for (int d = 0; d < hd; d++) qf[r * hd + d] = load(a->q, offset + d, a->is_bf16) * a->scale;
        visible_end[r] = first_pos + i0 + r / group + 1;
    }
    const int64_t tile_floats = 2 * (int64_t)hd * KEY_TILE;
    const float *tiles = packed + (int64_t)a->first_tiles[s] * a->num_kv_heads * tile_floats;
    const int last_key = first_pos + i1 - 1; /* the item's last row sees keys up to here */
    for (int t0 = 0; t0 <= last_key; t0 += KEY_TILE) {
        const float *kt = tiles + ((int64_t)(t0 / KEY_TILE) * a->num_kv_heads + kv_head) * tile_floats;
        for (int r0 = 0; r0 < padded; r0 += ROW_BLOCK) {
            int visible[ROW_BLOCK], any = 0;
            for (int r = 0; r < ROW_BLOCK; r++) {
                const int m = visible_end[r0 + r] - t0;
                visible[r] = m < 0 ? 0 : m > KEY_TILE ? KEY_TILE : m;
                any |= m > 0;
            }
            if (any)
                FN(row_block)(qf + (int64_t)r0 * hd, kt, acc + (int64_t)r0 * hd, row_max + r0,
                              row_sum + r0, visible, hd);
        }
    }
    for (int r = 0; r < rows; r++) {
        const int64_t q_row = (int64_t)(a->query_starts[s] + i0 + r / group) * a->num_heads;
        const int64_t offset = (q_row + (int64_t)kv_head * group + r % group) * hd;
        const float inv = 1.0f / row_sum[r];
        for (int d = 0; d < hd; d++) store(a->out, offset + d, a->is_bf16, acc[r * hd + d] * inv);
    }
}

#undef TILE_ROWS
#undef OUT_FLOATS
#undef FIT
#undef VECS
