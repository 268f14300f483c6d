/* The per-ISA row of cpu_argmax.c (included by cpu_targets.h once per SIMD target). The
 * library is built with -ffast-math, under which a float compare assumes no NaN: NaNs are
 * found by their bits instead. */

static inline int FN(is_nan)(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return (bits & 0x7FFFFFFF) > 0x7F800000;
}

/* The first index of the row's largest value, or of its first NaN (0 for an empty row).
 * One pass: each lane keeps the largest value it has seen and where it first saw it (a
 * strict compare keeps the first), and whether it saw a NaN; then the lanes, and the
 * elements past the last whole vector, are merged in index order. Only a row with a NaN
 * is read again, for its first one. */
static int64_t FN(argmax_row)(const float *x, int n) {
    const int whole = n / VEC * VEC;
    float largest = n > 0 ? x[0] : 0.0f;
    int64_t found = 0;
    int nans = 0;
    if (whole > 0) {
        const veci magnitude = (veci){0} + 0x7FFFFFFF, infinity = (veci){0} + 0x7F800000;
        vec best, v;
        veci at;
        for (int c = 0; c < VEC; c++) at[c] = c;
        veci where = at, nan = {0};
        LOADV(best, x);
        for (int i = 0; i < whole; i += VEC) {
            LOADV(v, x + i);
            nan |= ((veci)v & magnitude) > infinity;
            const veci above = v > best;
            best = (vec)(((veci)v & above) | ((veci)best & ~above));
            where = (at & above) | (where & ~above);
            at += VEC;
        }
        largest = best[0];
        found = where[0];
        for (int c = 0; c < VEC; c++) {
            nans |= nan[c];
            if (best[c] > largest || (best[c] == largest && where[c] < found)) {
                largest = best[c];
                found = where[c];
            }
        }
    }
    for (int i = whole; i < n; i++) {
        nans |= FN(is_nan)(x[i]);
        if (x[i] > largest) {
            largest = x[i];
            found = i;
        }
    }
    if (nans)
        for (int i = 0; i < n; i++)
            if (FN(is_nan)(x[i])) return i;
    return found;
}
