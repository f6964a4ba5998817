/* Which instruction-set path the kernels run, and how many threads: chosen at run time. */
#include "cpu_ops.h"
#include "matmul.h"

/* set by dot_avx2.c / dot_avx512.c when the build compiled them for their instruction set */
extern const int mm_avx2_built, mm_avx512_built;

static int current_isa = -1;
static int n_threads = 1;

static int cpu_has(int isa) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (isa == LUCE_ISA_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == LUCE_ISA_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
               __builtin_cpu_supports("fma");
#endif
    return isa == LUCE_ISA_PORTABLE;
}

int luce_cpu_isa_supported(int isa) {
    if (isa == LUCE_ISA_PORTABLE) return 1;
    if (isa == LUCE_ISA_AVX2) return mm_avx2_built && cpu_has(isa);
    if (isa == LUCE_ISA_AVX512) return mm_avx512_built && cpu_has(isa);
    return 0;
}

int luce_cpu_set_isa(int isa) {
    while (isa > LUCE_ISA_PORTABLE && !luce_cpu_isa_supported(isa)) isa--;
    current_isa = isa < 0 ? LUCE_ISA_PORTABLE : isa;
    return current_isa;
}

int luce_cpu_get_isa(void) {
    if (current_isa < 0) luce_cpu_set_isa(LUCE_ISA_AVX512);
    return current_isa;
}

void luce_cpu_set_threads(int n) { n_threads = n < 1 ? 1 : n; }

int luce_cpu_get_threads(void) { return n_threads; }
