/* The per-ISA part of cpu_decode.c (included by cpu_targets.h once per SIMD target). A
 * work item's tokens are read in blocks of DECODE_BLOCK whole rows (every kv head): first
 * every head's scores for the block's keys, then, after the softmax, every head's weighted
 * sum of its values, each head's outputs held in registers across the block; the next
 * block's rows are prefetched into L2.
 *
 * Head dims go in pairs of vectors (2 VEC elements). A float32 pair is two plain vectors; a
 * bfloat16 pair is one vector of VEC 32-bit words, each holding two bf16 values: shifted up
 * 16 bits it gives the even dims as floats, masked the odd ones, so the query and the
 * accumulators are kept in that order (`lane`) and nothing is widened element by element.
 * A head_dim that is not a multiple of 2 VEC leaves one vector at the end, read plainly.
 * An e4m3 cache's block of rows is first widened to float32 (widen_rows) and read as
 * float32 from there. */

/* Where dim i of a head (head_dim hd) sits in the query and accumulator scratch. */
static inline int FN(lane)(int i, int hd, int is_bf16) {
    const int paired = hd / (2 * VEC) * (2 * VEC);
    if (!is_bf16 || i >= paired) return i;
    const int r = i % (2 * VEC);
    return i - r + (r % 2) * VEC + r / 2;
}

/* The pair of vectors at element i (see above). */
static inline __attribute__((always_inline)) void FN(load_pair)(const void *base, int64_t i,
                                                                int is_bf16, vec *lo, vec *hi) {
    typedef uint32_t words __attribute__((vector_size(VEC * 4), aligned(2), may_alias));
    if (!is_bf16) {
        LOADV(*lo, (const float *)base + i);
        LOADV(*hi, (const float *)base + i + VEC);
        return;
    }
    const words w = *(const words *)((const uint16_t *)base + i);
    *lo = (vec)(w << 16);
    *hi = (vec)(w & 0xFFFF0000u);
}

/* q · k over one head's hd dims (q in lane order). */
static inline __attribute__((always_inline)) float FN(dot)(const float *q, const void *keys,
                                                           int64_t k, int hd, int is_bf16) {
    vec sum = {0};
    int d = 0;
    for (; d + 2 * VEC <= hd; d += 2 * VEC) {
        vec lo, hi, qlo, qhi;
        FN(load_pair)(keys, k + d, is_bf16, &lo, &hi);
        LOADV(qlo, q + d);
        LOADV(qhi, q + d + VEC);
        sum += qlo * lo + qhi * hi;
    }
    if (d < hd) {
        vec q1;
        LOADV(q1, q + d);
        sum += q1 * FN(load_one)(keys, k + d, is_bf16);
    }
    float total = 0.0f;
    for (int i = 0; i < VEC; i++) total += sum[i];
    return total;
}

/* acc[0, 2 VEC · pairs) += Σ_j p[j] · values[rows[j] + offset + ...] in lane order, the sums
 * in registers; inlined with pairs a constant. */
static inline __attribute__((always_inline)) void FN(add_values)(const void *values,
                                                                 const int64_t *rows,
                                                                 int64_t offset, const float *p,
                                                                 int n, float *acc, int pairs,
                                                                 int is_bf16) {
    vec o[4];
    for (int c = 0; c < 2 * pairs; c++) LOADV(o[c], acc + VEC * c);
    for (int j = 0; j < n; j++)
        for (int c = 0; c < pairs; c++) {
            vec lo, hi;
            FN(load_pair)(values, rows[j] + offset + 2 * VEC * c, is_bf16, &lo, &hi);
            o[2 * c] += p[j] * lo;
            o[2 * c + 1] += p[j] * hi;
        }
    for (int c = 0; c < 2 * pairs; c++) STOREV(acc + VEC * c, o[c]);
}

/* The last single vector's share (head_dim not a multiple of 2 VEC). */
static inline __attribute__((always_inline)) void FN(add_value_tail)(const void *values,
                                                                     const int64_t *rows,
                                                                     int64_t offset,
                                                                     const float *p, int n,
                                                                     float *acc, int is_bf16) {
    vec o;
    LOADV(o, acc);
    for (int j = 0; j < n; j++) o += p[j] * FN(load_one)(values, rows[j] + offset, is_bf16);
    STOREV(acc, o);
}

/* The rows of tokens [t0, t0 + n) (element offsets of their rows), prefetching the rows of
 * the block after, up to token `end`. */
static inline __attribute__((always_inline)) void FN(block_rows)(const struct decode_args *a,
                                                                 const int32_t *table, int t0,
                                                                 int n, int end,
                                                                 const char *cache, int size,
                                                                 int64_t *rows) {
    const int row_len = a->num_kv_heads * a->head_dim;
    for (int j = 0; j < n; j++) {
        rows[j] = row_offset(table, t0 + j, a->block_size, row_len);
        if (t0 + j + DECODE_BLOCK < end)
            prefetch(cache + row_offset(table, t0 + j + DECODE_BLOCK, a->block_size, row_len) * size,
                     (int64_t)row_len * size);
    }
}

/* The n rows at element offsets rows[] of an e4m3 cache, widened into `wide` (n rows of
 * row_len floats, a multiple of 16 long); rows[] become their offsets there. */
static inline __attribute__((always_inline)) const float *FN(widen_rows)(const void *cache,
                                                                         int64_t *rows, int n,
                                                                         int row_len,
                                                                         float *wide) {
    for (int j = 0; j < n; j++) {
        float *row = wide + (int64_t)j * row_len;
        for (int e = 0; e < row_len; e += VEC)
            STOREV(row + e, FN(load_fp8)((const uint8_t *)cache + rows[j], e));
        rows[j] = (int64_t)j * row_len;
    }
    return wide;
}

/* Head h's len scores p (soft-capped first, with a->softcap) become their softmax
 * numerators, exp(p - max). A whole context (partial NULL) gets back 1 / their sum, its
 * sink's exp(sink - max) included, to normalise them by; a range stores its max and sum
 * after its row of partial sums (decode_merge, which adds the sink) and gets back 1. */
static inline float FN(softmax_numerators)(const struct decode_args *a, float *p, int len,
                                           float *partial, int h) {
    const int hd = a->head_dim, sink = a->sinks != NULL && partial == NULL;
    if (a->softcap > 0.0f)
        for (int t = 0; t < len; t++) p[t] = a->softcap * tanhf(p[t] / a->softcap);
    float max = sink ? a->sinks[h] : -INFINITY, sum = 0.0f;
    for (int t = 0; t < len; t++) max = p[t] > max ? p[t] : max;
    for (int t = 0; t < len; t++) {
        p[t] = expf(p[t] - max);
        sum += p[t];
    }
    if (sink) sum += expf(a->sinks[h] - max);
    if (partial == NULL) return 1.0f / sum;
    partial[(int64_t)h * (hd + 2) + hd] = max;
    partial[(int64_t)h * (hd + 2) + hd + 1] = sum;
    return 1.0f;
}

/* is_bf16: the query's and output's dtype; kv_fp8: e4m3 caches (else in that dtype). Both
 * constants once inlined; `pairs` (the cache read as bf16 pairs) follows from them. */
static inline __attribute__((always_inline)) void FN(decode_pass)(const struct decode_args *a,
                                                                  int s, int begin, int end,
                                                                  float *scratch, float *partial,
                                                                  int is_bf16, int kv_fp8) {
    const int group = a->num_heads / a->num_kv_heads, hd = a->head_dim, heads = a->num_heads;
    const int len = end - begin, size = kv_fp8 ? 1 : is_bf16 ? 2 : 4;
    const int pairs = is_bf16 && !kv_fp8, row_len = a->num_kv_heads * hd;
    const int32_t *table = a->tables + (int64_t)s * a->table_stride;
    float *scores = scratch, *acc = scratch + (int64_t)heads * len, *qf = acc + heads * hd;
    float *wide = qf + heads * hd; /* kv_fp8: a block's rows as float32 */
    const int64_t q_offset = s * a->q_stride, out_offset = (int64_t)s * heads * hd;
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd; i++)
            qf[h * hd + FN(lane)(i, hd, pairs)] = load(a->q, q_offset + h * hd + i, is_bf16) * a->scale;
    int64_t rows[DECODE_BLOCK];
    for (int t0 = 0; t0 < len; t0 += DECODE_BLOCK) {
        const int n = len - t0 < DECODE_BLOCK ? len - t0 : DECODE_BLOCK;
        FN(block_rows)(a, table, begin + t0, n, end, a->key_cache, size, rows);
        const void *keys = kv_fp8 ? FN(widen_rows)(a->key_cache, rows, n, row_len, wide) : a->key_cache;
        for (int j = 0; j < n; j++)
            for (int h = 0; h < heads; h++)
                scores[(int64_t)h * len + t0 + j] =
                    FN(dot)(qf + h * hd, keys, rows[j] + (int64_t)(h / group) * hd, hd, pairs);
    }
    for (int h = 0; h < heads; h++) {
        float *p = scores + (int64_t)h * len;
        const float scale = FN(softmax_numerators)(a, p, len, partial, h);
        if (partial == NULL)
            for (int t = 0; t < len; t++) p[t] *= scale;
    }
    memset(acc, 0, sizeof(float) * heads * hd);
    for (int t0 = 0; t0 < len; t0 += DECODE_BLOCK) {
        const int n = len - t0 < DECODE_BLOCK ? len - t0 : DECODE_BLOCK;
        FN(block_rows)(a, table, begin + t0, n, end, a->value_cache, size, rows);
        const void *values =
            kv_fp8 ? FN(widen_rows)(a->value_cache, rows, n, row_len, wide) : a->value_cache;
        for (int h = 0; h < heads; h++) {
            const int64_t offset = (int64_t)(h / group) * hd;
            const float *p = scores + (int64_t)h * len + t0;
            float *out = acc + h * hd;
            int d = 0;
            for (; d + 4 * VEC <= hd; d += 4 * VEC)
                FN(add_values)(values, rows, offset + d, p, n, out + d, 2, pairs);
            for (; d + 2 * VEC <= hd; d += 2 * VEC)
                FN(add_values)(values, rows, offset + d, p, n, out + d, 1, pairs);
            if (d < hd) FN(add_value_tail)(values, rows, offset + d, p, n, out + d, pairs);
        }
    }
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd; i++) {
            const float value = acc[h * hd + FN(lane)(i, hd, pairs)];
            if (partial != NULL)
                partial[(int64_t)h * (hd + 2) + i] = value;
            else
                store(a->out, out_offset + h * hd + i, is_bf16, value * a->v_scale);
        }
}

/* decode_pass for bf16 with kv heads grouped, on AVX-512-BF16 dot products (bf16_dots, the
 * AVX-512 path only; cpu_dpbf16.h). DOT_KEYS keys at a time, every kv head of their rows
 * (the next keys' rows prefetched into L2, as decode_pass does): each kv head's keys packed
 * once as a tile's panel (dp_keys) against its group's queries as the rows, the scores
 * scaled after; after the softmax, the probabilities rounded to bf16 as the rows against the
 * kv head's values packed in pairs of keys (dp_values), as lever 26's prefill rounds them;
 * the sums stay float32. One packing serves the whole group, where decode_pass widens each
 * bf16 row again for every head of it. scratch: DOTS_SCRATCH(num_heads, num_kv_heads, len,
 * head_dim) floats. */
static void FN(decode_dots)(const struct decode_args *a, int s, int begin, int end,
                            float *scratch, float *partial) {
    const int group = a->num_heads / a->num_kv_heads, hd = a->head_dim, heads = a->num_heads;
    const int len = end - begin, even = (len + 1) / 2 * 2, row_len = a->num_kv_heads * hd;
    const int32_t *table = a->tables + (int64_t)s * a->table_stride;
    const uint16_t *q = (const uint16_t *)a->q + s * a->q_stride;
    /* out: [group][num_kv_heads][hd], head g * group + r at r * row_len + g * hd */
    float *scores = scratch, *out = scores + (int64_t)heads * even, *tile = out + heads * hd;
    uint16_t *probs = (uint16_t *)(tile + MR_DOTS * DOT_KEYS);
    uint16_t *panel = probs + (int64_t)heads * even; /* DOT_KEYS * row_len bf16 */
    int64_t rows[DOT_KEYS];
    for (int t0 = 0; t0 < len; t0 += DOT_KEYS) {
        const int n = len - t0 < DOT_KEYS ? len - t0 : DOT_KEYS, lanes = (n + 15) / 16 * 16;
        FN(block_rows)(a, table, begin + t0, n, end, a->key_cache, 2, rows);
        dp_keys(a->key_cache, rows, n, row_len / 2, lanes, panel); /* whole rows, in order */
        for (int g = 0; g < a->num_kv_heads; g++)
            for (int r0 = 0; r0 < group; r0 += MR_DOTS) {
                const int h0 = g * group + r0, rn = group - r0 < MR_DOTS ? group - r0 : MR_DOTS;
                dp_rows(q + h0 * hd, hd, panel + (int64_t)g * hd * lanes, lanes, hd / 2, rn,
                        lanes / 16, tile, 0);
                for (int r = 0; r < rn; r++)
                    for (int j = 0; j < n; j++)
                        scores[(int64_t)(h0 + r) * even + t0 + j] = tile[r * lanes + j] * a->scale;
            }
    }
    for (int h = 0; h < heads; h++) {
        float *p = scores + (int64_t)h * even;
        const float scale = FN(softmax_numerators)(a, p, len, partial, h);
        uint16_t *pb = probs + (int64_t)h * even;
        for (int t = 0; t < len; t++) pb[t] = f32_to_bf16(p[t] * scale);
        if (len < even) pb[len] = 0;
    }
    if (len == 0) memset(out, 0, sizeof(float) * heads * hd);
    for (int t0 = 0; t0 < len; t0 += DOT_KEYS) {
        const int n = len - t0 < DOT_KEYS ? len - t0 : DOT_KEYS;
        FN(block_rows)(a, table, begin + t0, n, end, a->value_cache, 2, rows);
        dp_values(a->value_cache, rows, n, row_len, panel); /* whole rows, in order */
        for (int g = 0; g < a->num_kv_heads; g++)
            for (int r0 = 0; r0 < group; r0 += MR_DOTS)
                for (int c0 = 0; c0 < hd / 16; c0 += 3) {
                    const int h0 = g * group + r0, rn = group - r0 < MR_DOTS ? group - r0 : MR_DOTS;
                    const int vecs = hd / 16 - c0 < 3 ? hd / 16 - c0 : 3;
                    dp_rows(probs + (int64_t)h0 * even + t0, even, panel + 2 * (g * hd + 16 * c0),
                            row_len, (n + 1) / 2, rn, vecs, out + r0 * row_len + g * hd + 16 * c0,
                            t0 > 0);
                }
    }
    for (int g = 0; g < a->num_kv_heads; g++)
        for (int r = 0; r < group; r++)
            for (int d = 0; d < hd; d++) {
                const int64_t h = g * group + r;
                const float value = out[r * row_len + g * hd + d];
                if (partial != NULL)
                    partial[h * (hd + 2) + d] = value;
                else
                    store(a->out, ((int64_t)s * heads + h) * hd + d, 1, value);
            }
}

/* Every head of sequence s over its tokens [begin, end); head_dim a multiple of 16. scratch:
 * num_heads * (end - begin) scores, then num_heads * head_dim accumulators and as many
 * scaled queries. partial: NULL when the range is the whole context (the output is
 * written), else num_heads rows of head_dim unnormalised sums (in dim order), the scores'
 * max and the sum of their exponentials, for decode_merge. With kv_fp8, scratch also holds
 * DECODE_BLOCK widened rows after the scaled queries. */
static void FN(decode_item)(const struct decode_args *a, int s, int begin, int end,
                            float *scratch, float *partial) {
    if (a->bf16_dots && a->num_heads >= DOTS_MIN_GROUP * a->num_kv_heads)
        FN(decode_dots)(a, s, begin, end, scratch, partial);
    else if (a->kv_fp8 && a->is_bf16)
        FN(decode_pass)(a, s, begin, end, scratch, partial, 1, 1);
    else if (a->kv_fp8)
        FN(decode_pass)(a, s, begin, end, scratch, partial, 0, 1);
    else if (a->is_bf16)
        FN(decode_pass)(a, s, begin, end, scratch, partial, 1, 0);
    else
        FN(decode_pass)(a, s, begin, end, scratch, partial, 0, 0);
}
