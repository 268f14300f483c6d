/* One SIMD target's copy of ISA_BODY (cpu_targets.h sets ISA, VEC and VEC_REGS first), with
 * the names every body uses: FN(name), the function `name` suffixed with the target's name;
 * vec, the target's vector of VEC floats, and veci, of VEC ints (a compare's lane masks);
 * LOADV and STOREV, its loads and stores at any float's address (macros: a vector passed
 * by value has a different ABI on each target). */
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
#include ISA_BODY
#undef STOREV
#undef LOADV
#undef veci
#undef vec
#undef FN
#undef CAT
#undef CAT_
