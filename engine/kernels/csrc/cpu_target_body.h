/* One SIMD target's copy of ISA_BODY (cpu_targets.h sets ISA, VEC and VEC_REGS first), with
 * the names every body uses: FN(name), the function `name` suffixed with the target's name;
 * vec, the target's vector of VEC floats, and veci, of VEC ints (a compare's lane masks);
 * LOADV and STOREV, its loads and stores at any float's address (macros: a vector passed
 * by value has a different ABI on each target); load_one and store_one, a vector of VEC
 * elements of a float32 or bfloat16 tensor (cpu_common.h's load and store, VEC at once);
 * load_fp8, VEC elements of an e4m3 tensor. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, ISA)
typedef float FN(vec) __attribute__((vector_size(VEC * sizeof(float))));
typedef float FN(vec_at) __attribute__((vector_size(VEC * sizeof(float)), aligned(4), may_alias));
typedef int FN(veci) __attribute__((vector_size(VEC * sizeof(int))));
#define vec FN(vec)
#define veci FN(veci)
#define LOADV(v, p) ((v) = *(const FN(vec_at) *)(p))
#define STOREV(p, v) (*(FN(vec_at) *)(p) = (v))

/* Elements [i, i + VEC) of `base` as floats. */
static inline __attribute__((always_inline)) vec FN(load_one)(const void *base, int64_t i,
                                                              int is_bf16) {
    typedef uint16_t halves __attribute__((vector_size(VEC * 2), aligned(2), may_alias));
    typedef uint32_t wide __attribute__((vector_size(VEC * 4)));
    vec v;
    if (!is_bf16) {
        LOADV(v, (const float *)base + i);
        return v;
    }
    return (vec)(__builtin_convertvector(*(const halves *)((const uint16_t *)base + i), wide) << 16);
}

/* Elements [i, i + VEC) of an e4m3 tensor (bytes) as floats, exactly: a normal byte's
 * exponent and mantissa bits moved to float32's places and the exponent rebiased (7 to 127),
 * a subnormal's mantissa times its step 2^-9; then the sign. */
static inline __attribute__((always_inline)) vec FN(load_fp8)(const void *base, int64_t i) {
    typedef uint8_t bytes __attribute__((vector_size(VEC), aligned(1), may_alias));
    typedef uint32_t wide __attribute__((vector_size(VEC * 4)));
    const wide w = __builtin_convertvector(*(const bytes *)((const uint8_t *)base + i), wide);
    const veci normal = (veci)((w & 0x78u) != 0);
    const veci scaled = (veci)(((w & 0x7Fu) << 20) + (120u << 23));
    const veci small = (veci)(__builtin_convertvector((veci)(w & 7u), vec) * (1.0f / 512));
    return (vec)((scaled & normal) | (small & ~normal) | (veci)((w & 0x80u) << 24));
}

/* Stores v at elements [i, i + VEC) of `base`, rounded as f32_to_bf16 rounds if is_bf16. */
static inline __attribute__((always_inline)) void FN(store_one)(void *base, int64_t i,
                                                                int is_bf16, vec v) {
    typedef uint16_t halves __attribute__((vector_size(VEC * 2), aligned(2), may_alias));
    typedef uint32_t wide __attribute__((vector_size(VEC * 4)));
    if (!is_bf16) {
        STOREV((float *)base + i, v);
        return;
    }
    const wide bits = (wide)v, nan = (wide)((bits & 0x7FFFFFFFu) > 0x7F800000u);
    const wide rounded = (nan & ((bits >> 16) | 0x40)) |
                         (~nan & ((bits + 0x7FFFu + ((bits >> 16) & 1)) >> 16));
    *(halves *)((uint16_t *)base + i) = __builtin_convertvector(rounded, halves);
}

#include ISA_BODY
#undef STOREV
#undef LOADV
#undef veci
#undef vec
#undef FN
#undef CAT
#undef CAT_
