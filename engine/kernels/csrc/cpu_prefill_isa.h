/* The per-ISA part of cpu_prefill.c (included by cpu_targets.h once per SIMD target). An
 * item's rows, its (query token, head of the group) pairs, lie across the lanes of one
 * panel of the register tile (cpu_tile_isa.h: NR rows, NR_VECS vectors), so both products
 * are that tile and the softmax runs down each lane, without horizontal reductions:
 * - scores S^T [keys][NR] = K · Q^T, the key tile's rows as the tile's x and the item's
 *   queries, transposed, as its panel (k = head_dim);
 * - the output O^T [head_dim][NR] += V^T · P^T, the transposed values as x and the
 *   probabilities as the panel (k = the tile's keys), accumulated across key tiles.
 * With bf16_dots (AVX-512 only) both products are AVX-512-BF16 dot products instead
 * (cpu_dpbf16.h): keys, values and queries stay bf16 (tiles and panels of pairs), the scores
 * are scaled after their product, and the probabilities are rounded to bf16 for the second,
 * as GPU flash attention rounds them; the softmax's sums stay float32. */
#include "cpu_exp_isa.h"
#include "cpu_tile_isa.h"

/* softcap * tanh(x / softcap) in each lane, as (1 - e) / (1 + e) with e = e^(-2|x| / softcap)
 * (exp_lanes' argument <= 0) and x's sign. */
static inline __attribute__((always_inline)) vec FN(soft_cap)(vec x, float cap) {
    const veci sign = (veci)x & (int)0x80000000u;
    const vec e = FN(exp_lanes)((vec)((veci)x & ~sign) * (-2.0f / cap));
    return (vec)((veci)((1.0f - e) / (1.0f + e) * cap) | sign);
}

/* An item's rows: one panel. */
static int FN(item_rows)(void) { return NR; }

/* Packs key tile `tile` of one kv head of sequence s (keys from KEY_TILE * tile on, up to
 * the sequence's last) into kp [KEY_TILE][head_dim] and vt [head_dim][KEY_TILE]
 * (transposed: the output's rows are the value dims), as float32 (an e4m3 cache's widened),
 * or with bf16_dots as bf16 with an odd count's next value 0 (the dot products read keys in
 * pairs); nothing past that (no item reads it). Each cache row is copied whole (a vector
 * copy or conversion), the values into `buffer` (KEY_TILE * head_dim floats), transposed
 * from there into vt. Keys before the sequence's first visible one (a window's) are zeros,
 * their blocks unread. */
static void FN(pack_tile)(const struct prefill_args *a, int s, int kv_head, int tile, float *kp,
                          float *buffer) {
    const int hd = a->head_dim, row_len = a->num_kv_heads * hd;
    const int32_t *table = a->tables + (int64_t)s * a->table_stride;
    const int left = a->seq_lens[s] - tile * KEY_TILE, keys = left < KEY_TILE ? left : KEY_TILE;
    const int widen = a->is_bf16 && !a->bf16_dots; /* else rows are copied as stored */
    const size_t width = a->is_bf16 ? sizeof(uint16_t) : sizeof(float), row_bytes = width * hd;
    const int first = first_visible(a, a->seq_lens[s] - a->query_lens[s]) - tile * KEY_TILE;
    const size_t packed_bytes = a->bf16_dots ? row_bytes : sizeof(float) * hd;
    for (int j = 0; j < first; j++) {
        memset((char *)kp + j * packed_bytes, 0, packed_bytes);
        memset((char *)buffer + j * packed_bytes, 0, packed_bytes);
    }
    for (int j = first > 0 ? first : 0; j < keys; j++) {
        const int64_t offset = row_offset(table, tile * KEY_TILE + j, a->block_size, row_len) +
                               (int64_t)kv_head * hd;
        if (a->kv_fp8) {
            const uint8_t *kb = (const uint8_t *)a->key_cache + offset;
            const uint8_t *vb = (const uint8_t *)a->value_cache + offset;
            for (int d = 0; d < hd; d += VEC) STOREV(kp + j * hd + d, FN(load_fp8)(kb, d));
            for (int d = 0; d < hd; d += VEC) STOREV(buffer + j * hd + d, FN(load_fp8)(vb, d));
        } else if (widen) {
            const uint16_t *kb = (const uint16_t *)a->key_cache + offset;
            const uint16_t *vb = (const uint16_t *)a->value_cache + offset;
            float *k = kp + j * hd, *v = buffer + j * hd;
            for (int d = 0; d < hd; d++) k[d] = bf16_to_f32(kb[d]);
            for (int d = 0; d < hd; d++) v[d] = bf16_to_f32(vb[d]);
        } else {
            const int64_t at = offset * (int64_t)width;
            memcpy((char *)kp + j * row_bytes, (const char *)a->key_cache + at, row_bytes);
            memcpy((char *)buffer + j * row_bytes, (const char *)a->value_cache + at, row_bytes);
        }
    }
    if (a->bf16_dots) {
        uint16_t *vt = (uint16_t *)(kp + hd * KEY_TILE); /* where the float32 tile has it */
        const uint16_t *rows = (const uint16_t *)buffer;
        for (int d = 0; d < hd; d++) {
            for (int j = 0; j < keys; j++) vt[d * KEY_TILE + j] = rows[j * hd + d];
            if (keys % 2 != 0) vt[d * KEY_TILE + keys] = 0;
        }
        return;
    }
    float *vt = kp + hd * KEY_TILE;
    for (int d = 0; d < hd; d++)
        for (int j = 0; j < keys; j++) vt[d * KEY_TILE + j] = buffer[j * hd + d];
}

/* out[r] (+)= x[r] · panel for `rows` rows (1..MR) of x, k deep, in the panel's first
 * `vecs` vectors: tile() with rows and vecs constants (`accumulate`, 0: out = ..., is read
 * once, before the products). */
static void FN(panel_rows)(const float *x, int64_t x_stride, const float *panel, int k, int rows,
                           int vecs, float *out, int accumulate) {
#define TILE(n, v) FN(tile)(x, x_stride, panel, k, n, out, NR, NULL, (v) * VEC, NULL, 0, accumulate, v, 0, 0)
#define ROWS(n)                                                                              \
    case n:                                                                                  \
        if (vecs == 1)                                                                       \
            TILE(n, 1);                                                                      \
        else if (vecs == 2)                                                                  \
            TILE(n, 2);                                                                      \
        else                                                                                 \
            TILE(n, NR_VECS);                                                                \
        break;
    switch (rows) {
        ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6)
#if MR > 6
        ROWS(7) ROWS(8)
#endif
    }
#undef ROWS
#undef TILE
}

/* Rows [row0, row0 + rows) of sequence s's chunk (row r: query token r / group, head
 * r % group of kv head kv_head's group) in the first `vecs` vectors of lanes (a constant
 * once inlined) against its packed key tiles, with an online softmax per lane; each key tile
 * is cut at the last key the item's last row sees, and the tiles start at the one holding
 * the first key its first row sees (a window's). `kinds`: a window or a soft-cap is set (a
 * constant once inlined: without, the loops are those of plain causal attention). Scratch: the queries and outputs
 * transposed, [head_dim][NR] each (with bf16_dots the queries as a panel of dim pairs), one
 * tile's scores, [KEY_TILE][NR], and with bf16_dots their panel of key pairs. */
static inline __attribute__((always_inline)) void FN(item_lanes)(const struct prefill_args *a,
                                                                 const float *packed, int s,
                                                                 int kv_head, int row0, int rows,
                                                                 int vecs, int kinds,
                                                                 float *scratch) {
    const int hd = a->head_dim, group = a->num_heads / a->num_kv_heads, q_len = a->query_lens[s];
    const int lanes = vecs * VEC;
    const int first_pos = a->seq_lens[s] - q_len; /* the chunk's first query's position */
    float *qt = scratch, *st = qt + hd * NR, *ot = st + KEY_TILE * NR;
    uint16_t *pairs = (uint16_t *)(ot + hd * NR); /* bf16_dots: P^T's panel */
    const int dots = a->bf16_dots;
    int visible_end[NR]; /* keys below it are visible to the lane's row (none to padding) */
    int visible_start[NR]; /* and from it on (a window's; 0 without) */
    for (int c = 0; c < lanes; c++) {
        const int r = row0 + c;
        const int64_t offset = row_element(a, s, kv_head, r);
        if (dots) /* dim pair i of the row: one 32-bit word of its bf16 query */
            for (int i = 0; i < hd / 2; i++) {
                uint32_t pair = 0;
                if (c < rows) memcpy(&pair, (const uint16_t *)a->q + offset + 2 * i, sizeof pair);
                memcpy(qt + i * NR + c, &pair, sizeof pair);
            }
        else
            for (int d = 0; d < hd; d++)
                qt[d * NR + c] = c < rows ? load(a->q, offset + d, a->is_bf16) * a->scale : 0.0f;
        visible_end[c] = c < rows ? first_pos + r / group + 1 : 0;
        visible_start[c] = c < rows ? first_visible(a, first_pos + r / group) : 0;
    }
    for (int d = 0; d < hd; d++) memset(ot + d * NR, 0, sizeof(float) * lanes);
    vec row_max[NR_VECS], row_sum[NR_VECS];
    veci ends[NR_VECS], starts[NR_VECS];
    for (int c = 0; c < vecs; c++) {
        row_max[c] = (vec){0} + MASKED;
        row_sum[c] = (vec){0};
        memcpy(&ends[c], visible_end + VEC * c, sizeof ends[c]);
        memcpy(&starts[c], visible_start + VEC * c, sizeof starts[c]);
    }
    const int64_t tile_floats = 2 * (int64_t)hd * KEY_TILE;
    const float *tiles = packed + (int64_t)a->first_tiles[s] * a->num_kv_heads * tile_floats;
    const int packed_from = first_tile(a, s); /* the tile at `tiles` */
    const int first_end = visible_end[0], last_end = visible_end[rows - 1];
    const int last_start = visible_start[rows - 1], windowed = kinds && a->window > 0;
    const float cap = kinds ? a->softcap : 0.0f;
    for (int t0 = visible_start[0] / KEY_TILE * KEY_TILE; t0 < last_end; t0 += KEY_TILE) {
        const float *kp =
            tiles + ((int64_t)(t0 / KEY_TILE - packed_from) * a->num_kv_heads + kv_head) * tile_floats;
        const float *vt = kp + (int64_t)hd * KEY_TILE;
        const int keys = last_end - t0 < KEY_TILE ? last_end - t0 : KEY_TILE;
        for (int j = 0; j < keys; j += MR) {
            const int count = keys - j < MR ? keys - j : MR;
            if (dots)
                dp_rows((const uint16_t *)kp + (int64_t)j * hd, hd, (const uint16_t *)qt, NR,
                        hd / 2, count, vecs, st + j * NR, 0);
            else
                FN(panel_rows)(kp + (int64_t)j * hd, hd, qt, hd, count, vecs, st + j * NR, 0);
        }
        const vec scale = (vec){0} + a->scale;
        vec tile_max[NR_VECS];
        for (int c = 0; c < vecs; c++) tile_max[c] = row_max[c];
        const int in_part = t0 + keys > first_end || (windowed && t0 < last_start); /* in part */
        for (int j = 0; j < keys; j++)
            for (int c = 0; c < vecs; c++) {
                vec x;
                LOADV(x, st + j * NR + VEC * c);
                if (dots) /* the queries went in unscaled */
                    x *= scale;
                if (cap > 0.0f) x = FN(soft_cap)(x, cap);
                if (in_part) {
                    veci hidden = ((veci){0} + (t0 + j)) >= ends[c];
                    if (windowed) hidden |= ((veci){0} + (t0 + j)) < starts[c];
                    x = (vec)(((veci)x & ~hidden) | ((veci)((vec){0} + MASKED) & hidden));
                }
                if (dots || in_part || cap > 0.0f) STOREV(st + j * NR + VEC * c, x);
                const veci above = x > tile_max[c];
                tile_max[c] = (vec)(((veci)x & above) | ((veci)tile_max[c] & ~above));
            }
        vec sum[NR_VECS];
        for (int c = 0; c < vecs; c++) {
            const vec rescale = FN(exp_lanes)(row_max[c] - tile_max[c]);
            row_sum[c] *= rescale;
            row_max[c] = tile_max[c];
            sum[c] = (vec){0};
            for (int d = 0; d < hd; d++) {
                vec o;
                LOADV(o, ot + d * NR + VEC * c);
                STOREV(ot + d * NR + VEC * c, o * rescale);
            }
        }
        for (int j = 0; j < keys; j++)
            for (int c = 0; c < vecs; c++) {
                vec x;
                LOADV(x, st + j * NR + VEC * c);
                x = FN(exp_lanes)(x - row_max[c]);
                STOREV(st + j * NR + VEC * c, x);
                sum[c] += x;
            }
        for (int c = 0; c < vecs; c++) row_sum[c] += sum[c];
        if (dots) dp_pairs(st, keys, NR, vecs, pairs);
        for (int d = 0; d < hd; d += MR) {
            const int count = hd - d < MR ? hd - d : MR;
            if (dots)
                dp_rows((const uint16_t *)vt + (int64_t)d * KEY_TILE, KEY_TILE, pairs, NR,
                        (keys + 1) / 2, count, vecs, ot + d * NR, 1);
            else
                FN(panel_rows)(vt + (int64_t)d * KEY_TILE, KEY_TILE, st, keys, count, vecs,
                               ot + d * NR, 1);
        }
    }
    float inv[NR];
    for (int c = 0; c < vecs; c++) STOREV(inv + VEC * c, a->v_scale / row_sum[c]);
    if (a->sinks != NULL) { /* each row's sink joins its sum */
        float maxes[NR], sums[NR];
        for (int c = 0; c < vecs; c++) {
            STOREV(maxes + VEC * c, row_max[c]);
            STOREV(sums + VEC * c, row_sum[c]);
        }
        for (int c = 0; c < rows; c++) {
            const float sink = a->sinks[kv_head * group + (row0 + c) % group];
            inv[c] = a->v_scale / (sums[c] + expf(sink - maxes[c]));
        }
    }
    for (int c = 0; c < rows; c++) {
        const int64_t offset = row_element(a, s, kv_head, row0 + c);
        for (int d = 0; d < hd; d++) store(a->out, offset + d, a->is_bf16, ot[d * NR + c] * inv[c]);
    }
}

/* Rows [row0, row0 + rows) of sequence s's chunk (rows <= NR), in as few vectors of lanes
 * as hold them (item_lanes()), with the attention kinds' loops only where a layer has one. */
static void FN(prefill_item)(const struct prefill_args *a, const float *packed, int s, int kv_head,
                             int row0, int rows, float *scratch) {
    const int vecs = (rows + VEC - 1) / VEC, kinds = a->window > 0 || a->softcap > 0.0f;
#define LANES(v)                                                            \
    (kinds ? FN(item_lanes)(a, packed, s, kv_head, row0, rows, v, 1, scratch) \
           : FN(item_lanes)(a, packed, s, kv_head, row0, rows, v, 0, scratch))
    if (vecs == NR_VECS)
        LANES(NR_VECS);
    else if (vecs == 1)
        LANES(1);
    else
        LANES(2);
#undef LANES
}

#undef NR
#undef MR
#undef NR_VECS
