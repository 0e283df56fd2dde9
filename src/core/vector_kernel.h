// TESSERA_VECTOR_KERNEL marks a CPU kernel written as plain loops for GCC to vectorise: it is
// compiled at -O3 (the project's -O2 leaves loops of unknown trip count scalar) for AVX2 and for
// the baseline, and the clone the CPU supports is picked at load time (target_clones). AVX2's
// clone does not enable FMA, so both clones round every product and sum alike: a kernel's result
// does not depend on the CPU it runs on. Not under the sanitizers, whose runtimes the load-time
// choice of a clone would run before; nor on other compilers or targets (plain functions there).
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define TESSERA_VECTOR_KERNEL __attribute__((target_clones("avx2", "default"), optimize("O3")))
#else
#define TESSERA_VECTOR_KERNEL
#endif
