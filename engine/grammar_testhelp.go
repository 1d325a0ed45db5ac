package engine

/*
#include <stdlib.h>
#include "llama.h"
*/
import "C"

import "unsafe"

// applyAll runs the grammar over all n tokens of a vocabulary once, in
// C memory as the tail's sampler does (it serves the grammar tests: a
// _test file cannot use cgo).
func (g *grammar) applyAll(n int) error {
	p := (*C.llama_token_data)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.llama_token_data{}))))
	defer C.free(unsafe.Pointer(p))
	cands := unsafe.Slice(p, n)
	for i := range cands {
		cands[i] = C.llama_token_data{id: C.llama_token(i), logit: 0, p: 0}
	}
	arr := C.llama_token_data_array{data: p, size: C.size_t(n), selected: -1, sorted: false}
	return g.apply(&arr)
}
