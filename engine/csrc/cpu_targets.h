/* Compiles the file named by ISA_BODY once per SIMD target, each copy with ISA set to the
 * target's name (its functions' suffix): avx512 and avx2 on x86-64, and baseline (the
 * compiler's default, SSE2 on x86-64) everywhere. The loops are plain C; the compiler
 * vectorises each copy for its target's vector width. PICK(fn, isa) names one copy. */
#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,prefer-vector-width=512")
#define ISA avx512
#include ISA_BODY
#undef ISA
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define ISA avx2
#include ISA_BODY
#undef ISA
#pragma GCC pop_options
#endif

#define ISA baseline
#include ISA_BODY
#undef ISA

/* The copy of `fn` (a function of ISA_BODY) for `isa`, one that isa_usable() admits. */
#if defined(__x86_64__)
#define PICK(fn, isa) \
    ((isa) == ISA_AVX512 ? fn##_avx512 : (isa) == ISA_AVX2 ? fn##_avx2 : fn##_baseline)
#else
#define PICK(fn, isa) fn##_baseline
#endif
