package engine

/*
#include "mp.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
)

// ErrNotInvariant: this build or CPU would compute a row differently
// depending on what is batched with it, so the shard refuses to serve.
var ErrNotInvariant = errors.New("engine: not batch-invariant")

// CheckInvariantBuild returns ErrNotInvariant for builds NewShard refuses.
func CheckInvariantBuild() error { return checkInvariantBuild() }

// checkInvariantBuild refuses builds that compiled ggml-cpu with
// llamafile's sgemm: it takes products of 2+ rows and leaves 1-row ones to
// vec_dot, which accumulates in another order (F32/F16 weights, Q8_0/Q4_0
// weights, attention).
func checkInvariantBuild() error {
	if C.ggml_cpu_has_llamafile() != 0 {
		return fmt.Errorf("%w: llama.cpp was compiled with GGML_USE_LLAMAFILE (a plain `go build`?): "+
			"build with `make build`, which passes -UGGML_USE_LLAMAFILE in CGO_CFLAGS and CGO_CXXFLAGS", ErrNotInvariant)
	}
	return nil
}

var kernelClass = sync.OnceValue(func() string {
	rev := "llama.cpp@" + llamaCommit
	feats := []struct {
		name string
		has  C.int
	}{
		{"sse3", C.ggml_cpu_has_sse3()}, {"ssse3", C.ggml_cpu_has_ssse3()},
		{"avx", C.ggml_cpu_has_avx()}, {"avx2", C.ggml_cpu_has_avx2()},
		{"avx_vnni", C.ggml_cpu_has_avx_vnni()}, {"f16c", C.ggml_cpu_has_f16c()},
		{"fma", C.ggml_cpu_has_fma()}, {"bmi2", C.ggml_cpu_has_bmi2()},
		{"avx512", C.ggml_cpu_has_avx512()}, {"avx512_vbmi", C.ggml_cpu_has_avx512_vbmi()},
		{"avx512_vnni", C.ggml_cpu_has_avx512_vnni()}, {"avx512_bf16", C.ggml_cpu_has_avx512_bf16()},
		{"amx_int8", C.ggml_cpu_has_amx_int8()}, {"neon", C.ggml_cpu_has_neon()},
		{"arm_fma", C.ggml_cpu_has_arm_fma()}, {"fp16_va", C.ggml_cpu_has_fp16_va()},
		{"dotprod", C.ggml_cpu_has_dotprod()}, {"matmul_int8", C.ggml_cpu_has_matmul_int8()},
		{"sve", C.ggml_cpu_has_sve()}, {"llamafile", C.ggml_cpu_has_llamafile()},
	}
	var on []string
	for _, f := range feats {
		if f.has != 0 {
			on = append(on, f.name)
		}
	}
	if len(on) == 0 {
		on = []string{"scalar"}
	}
	return fmt.Sprintf("cpu/%s/%s/%s/fa", runtime.GOARCH, strings.Join(on, "+"), rev)
})

// KernelClass names everything that decides how this build computes a row:
// backend, ISA and the SIMD features ggml-cpu was compiled with (build
// flags, llamafile among them), the llama.cpp revision (through the pinned
// ollama module) and the attention kernel. Two shards of the same kernel
// class compute bitwise the same hidden states and logits for the same
// input, however rows are batched; across classes results agree only to
// rounding. Shards advertise it (route.Shard.KernelClass) so that work
// comparing hops byte for byte (verification, GPU backends) compares only
// like with like.
func KernelClass() string { return kernelClass() }
