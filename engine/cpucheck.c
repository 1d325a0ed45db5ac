// Refuses, before anything else runs, a CPU that lacks an instruction set
// extension this build was compiled to use (a release archive built with
// -march=x86-64-v3 on a CPU without AVX2, or one built for armv8.2-a+dotprod
// on a Raspberry Pi 4): without the check such a binary dies of SIGILL
// somewhere inside llama.cpp, possibly in a C++ static constructor before
// main. The constructor runs first (priority 101, the first one not
// reserved) and is compiled for the baseline ISA, so it never executes an
// instruction it is checking for. docs/platforms.md.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpucheck.h"

#if defined(__x86_64__)
#define MP_BASELINE __attribute__((target("arch=x86-64")))
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#define MP_BASELINE __attribute__((target("arch=armv8-a")))
// From the kernel's arch/arm64/include/uapi/asm/hwcap.h (AT_HWCAP).
#define MP_HWCAP_FPHP (1UL << 9)
#define MP_HWCAP_ASIMDHP (1UL << 10)
#define MP_HWCAP_ASIMDDP (1UL << 20)
#define MP_HWCAP_SVE (1UL << 22)
#define MP_HWCAP2_I8MM (1UL << 13)
#else
#define MP_BASELINE
#endif

// The extensions the compiler was told it may use, and the missing ones.
static char mp_need[256], mp_missing[256];

MP_BASELINE static void mp_req(const char *name, int has) {
	strncat(mp_need, name, sizeof mp_need - strlen(mp_need) - 2);
	strcat(mp_need, " ");
	if (!has) {
		strncat(mp_missing, name, sizeof mp_missing - strlen(mp_missing) - 2);
		strcat(mp_missing, " ");
	}
}

MP_BASELINE static void mp_check(void) {
#if defined(__x86_64__)
	__builtin_cpu_init();
#if defined(__AVX__)
	mp_req("avx", __builtin_cpu_supports("avx"));
#endif
#if defined(__AVX2__)
	mp_req("avx2", __builtin_cpu_supports("avx2"));
#endif
#if defined(__FMA__)
	mp_req("fma", __builtin_cpu_supports("fma"));
#endif
#if defined(__BMI2__)
	mp_req("bmi2", __builtin_cpu_supports("bmi2"));
#endif
#if defined(__AVX512F__)
	mp_req("avx512f", __builtin_cpu_supports("avx512f"));
#endif
#if defined(__AVX512BW__)
	mp_req("avx512bw", __builtin_cpu_supports("avx512bw"));
#endif
#if defined(__AVX512VL__)
	mp_req("avx512vl", __builtin_cpu_supports("avx512vl"));
#endif
#if defined(__AVX512VNNI__)
	mp_req("avx512vnni", __builtin_cpu_supports("avx512vnni"));
#endif
#if defined(__AVX512BF16__)
	mp_req("avx512bf16", __builtin_cpu_supports("avx512bf16"));
#endif
#elif defined(__aarch64__) && defined(__linux__)
	unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
	(void)hw;
	(void)hw2;
#if defined(__ARM_FEATURE_FP16_VECTOR_ARITHMETIC)
	mp_req("fp16", (hw & MP_HWCAP_FPHP) && (hw & MP_HWCAP_ASIMDHP));
#endif
#if defined(__ARM_FEATURE_DOTPROD)
	mp_req("dotprod", (hw & MP_HWCAP_ASIMDDP) != 0);
#endif
#if defined(__ARM_FEATURE_MATMUL_INT8)
	mp_req("i8mm", (hw2 & MP_HWCAP2_I8MM) != 0);
#endif
#if defined(__ARM_FEATURE_SVE)
	mp_req("sve", (hw & MP_HWCAP_SVE) != 0);
#endif
#endif
}

MP_BASELINE __attribute__((constructor(101))) static void mp_cpucheck(void) {
	mp_check();
	if (mp_missing[0] != 0) {
		fprintf(stderr,
		        "meshp2p: this build was compiled for CPUs with %s"
		        "and this CPU lacks %s(its instructions would crash it). "
		        "Build meshp2p from source on this machine (`make build`: -march=native), "
		        "or for a lower level (make dist AMD64_SIMD=x86-64-v2, ARM64_SIMD=armv8-a); docs/platforms.md.\n",
		        mp_need, mp_missing);
		exit(3);
	}
}

const char *mp_cpu_needs(void) { return mp_need; }
