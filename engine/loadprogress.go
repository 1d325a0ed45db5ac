package engine

/*
#include <stdint.h>
#include <stdbool.h>
*/
import "C"

import "runtime/cgo"

// mpGoLoadProgress is llama.cpp's model-load progress callback (mp.c's
// mp_progress): it calls the func(float32) bool behind handle; false
// aborts the load.
//
//export mpGoLoadProgress
func mpGoLoadProgress(progress C.float, handle C.uintptr_t) C.bool {
	f, ok := cgo.Handle(handle).Value().(func(float32) bool)
	if !ok {
		return C.bool(true)
	}
	return C.bool(f(float32(progress)))
}
