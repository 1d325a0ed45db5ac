package engine

/*
#include <stdlib.h>
#include "mp.h"
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"unsafe"
)

// QuantType names a quantization llama.cpp can produce.
type QuantType string

const (
	QuantF16   QuantType = "f16"
	QuantQ8_0  QuantType = "q8_0"
	QuantQ4_KM QuantType = "q4_k_m"
	QuantQ4_0  QuantType = "q4_0"
	QuantQ6_K  QuantType = "q6_k"
	// QuantMXFP4 is llama.cpp's MXFP4_MOE: expert tensors in MXFP4 (as
	// gpt-oss ships them), the other matrices in Q8_0.
	QuantMXFP4 QuantType = "mxfp4_moe"
)

func (q QuantType) ftype() (C.enum_llama_ftype, error) {
	switch q {
	case QuantF16:
		return C.LLAMA_FTYPE_MOSTLY_F16, nil
	case QuantQ8_0:
		return C.LLAMA_FTYPE_MOSTLY_Q8_0, nil
	case QuantQ4_KM:
		return C.LLAMA_FTYPE_MOSTLY_Q4_K_M, nil
	case QuantQ4_0:
		return C.LLAMA_FTYPE_MOSTLY_Q4_0, nil
	case QuantQ6_K:
		return C.LLAMA_FTYPE_MOSTLY_Q6_K, nil
	case QuantMXFP4:
		return C.LLAMA_FTYPE_MOSTLY_MXFP4_MOE, nil
	}
	return 0, fmt.Errorf("%w: unknown quantization %q (want f16, q8_0, q4_0, q6_k, q4_k_m or mxfp4_moe)", ErrBadInput, q)
}

// Quantize writes a quantized copy of the whole model in to out with
// llama.cpp's llama_model_quantize. Quantize whole models, then split:
// quantizing shards separately yields a different type mix. The output is
// written to a temporary file and renamed, so a failure leaves nothing.
// Callers should check the geometry first (gguf.CheckQuantizable): plain
// Q8_0 needs every quantized row to be a multiple of 32.
func Quantize(ctx context.Context, in, out string, q QuantType) error {
	ft, err := q.ftype()
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	initBackend()
	tmp, err := os.CreateTemp(filepath.Dir(out), ".quant-*.gguf")
	if err != nil {
		return fmt.Errorf("engine: quantize: %w", err)
	}
	tmpName := tmp.Name()
	tmp.Close()
	defer os.Remove(tmpName) // no-op after the rename
	p := C.llama_model_quantize_default_params()
	p.ftype = ft
	p.nthread = C.int32_t(runtime.NumCPU())
	cin, cout := C.CString(in), C.CString(tmpName)
	defer C.free(unsafe.Pointer(cin))
	defer C.free(unsafe.Pointer(cout))
	if rc := C.llama_model_quantize(cin, cout, &p); rc != 0 {
		return fmt.Errorf("engine: quantize %s to %s failed (rc=%d; see the log above)", in, q, int(rc))
	}
	if err := os.Rename(tmpName, out); err != nil {
		return fmt.Errorf("engine: quantize: %w", err)
	}
	return nil
}
