/* Compiles the file named by ISA_BODY once per SIMD target, each copy with ISA set to the
 * target's name (its functions' suffix), VEC to its vectors' width in floats and VEC_REGS
 * to their number of registers: avx512 and avx2 on x86-64, and baseline (the compiler's
 * default, SSE2 on x86-64, 128-bit vectors) everywhere, through cpu_target_body.h (FN, vec,
 * LOADV, STOREV). The loops are plain C; the compiler vectorises each copy for its target's
 * vector width. PICK(fn, isa) names one copy. */
#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,prefer-vector-width=512")
#define ISA avx512
#define VEC 16
#define VEC_REGS 32
#include "cpu_target_body.h"
#undef VEC_REGS
#undef VEC
#undef ISA
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define ISA avx2
#define VEC 8
#define VEC_REGS 16
#include "cpu_target_body.h"
#undef VEC_REGS
#undef VEC
#undef ISA
#pragma GCC pop_options
#endif

#define ISA baseline
#define VEC 4
#define VEC_REGS 16
#include "cpu_target_body.h"
#undef VEC_REGS
#undef VEC
#undef ISA

/* The copy of `fn` (a function of ISA_BODY) for `isa`, one that isa_usable() admits. */
#if defined(__x86_64__)
#define PICK(fn, isa) \
    ((isa) == ISA_AVX512 ? fn##_avx512 : (isa) == ISA_AVX2 ? fn##_avx2 : fn##_baseline)
#else
#define PICK(fn, isa) fn##_baseline
#endif
