/* The per-ISA part of cpu_decode.c: included once per SIMD target with ISA set to its
 * name suffix; the compiler vectorises these loops for that target's vector width. */

static inline float FN(dot)(const float *q, const void *k, int is_bf16, int n) {
    float sum = 0.0f;
    if (is_bf16) {
        const uint16_t *kb = (const uint16_t *)k;
        for (int d = 0; d < n; d++) sum += q[d] * bf16_to_f32(kb[d]);
    } else {
        const float *kf = (const float *)k;
        for (int d = 0; d < n; d++) sum += q[d] * kf[d];
    }
    return sum;
}

static inline void FN(axpy)(float *acc, float p, const void *v, int is_bf16, int n) {
    if (is_bf16) {
        const uint16_t *vb = (const uint16_t *)v;
        for (int d = 0; d < n; d++) acc[d] += p * bf16_to_f32(vb[d]);
    } else {
        const float *vf = (const float *)v;
        for (int d = 0; d < n; d++) acc[d] += p * vf[d];
    }
}

/* Query heads of kv heads [h0, h1) of one sequence. scratch: (h1 - h0) * group * len
 * scores, then (h1 - h0) * group * head_dim accumulators and as many scaled queries. */
static void FN(decode_item)(const struct decode_args *a, int s, int h0, int h1, float *scratch) {
    const int group = a->num_heads / a->num_kv_heads, hd = a->head_dim;
    const int row_len = a->num_kv_heads * hd, heads = (h1 - h0) * group;
    const int len = a->seq_lens[s], size = a->is_bf16 ? 2 : 4;
    const int32_t *table = a->tables + (int64_t)s * a->table_stride;
    float *scores = scratch, *acc = scratch + (int64_t)heads * len, *qf = acc + heads * hd;
    const int64_t q_offset = ((int64_t)s * a->num_heads + h0 * group) * hd;
    for (int i = 0; i < heads * hd; i++) qf[i] = load(a->q, q_offset + i, a->is_bf16) * a->scale;
    const char *keys = (const char *)a->key_cache, *values = (const char *)a->value_cache;
    const int64_t first = (int64_t)h0 * hd, span = (int64_t)(h1 - h0) * hd * size;
    for (int t = 0; t < len; t++) {
        if (t + PREFETCH_AHEAD < len)
            prefetch(keys + (row_offset(table, t + PREFETCH_AHEAD, a->block_size, row_len) + first) * size, span);
        const char *row = keys + (row_offset(table, t, a->block_size, row_len) + first) * size;
        for (int h = 0; h < heads; h++)
            scores[(int64_t)h * len + t] =
                FN(dot)(qf + h * hd, row + (int64_t)(h / group) * hd * size, a->is_bf16, hd);
    }
    for (int h = 0; h < heads; h++) {
        float *p = scores + (int64_t)h * len, max = -INFINITY, sum = 0.0f;
        for (int t = 0; t < len; t++) max = p[t] > max ? p[t] : max;
        for (int t = 0; t < len; t++) {
            p[t] = expf(p[t] - max);
            sum += p[t];
        }
        const float inv = 1.0f / sum;
        for (int t = 0; t < len; t++) p[t] *= inv;
    }
    memset(acc, 0, sizeof(float) * heads * hd);
    for (int t = 0; t < len; t++) {
        if (t + PREFETCH_AHEAD < len)
            prefetch(values + (row_offset(table, t + PREFETCH_AHEAD, a->block_size, row_len) + first) * size, span);
        const char *row = values + (row_offset(table, t, a->block_size, row_len) + first) * size;
        for (int h = 0; h < heads; h++)
            FN(axpy)(acc + h * hd, scores[(int64_t)h * len + t],
                     row + (int64_t)(h / group) * hd * size, a->is_bf16, hd);
    }
    for (int i = 0; i < heads * hd; i++) store(a->out, q_offset + i, a->is_bf16, acc[i]);
}
