package engine

//go:generate go run ../internal/gencgo zz_cgo_include.go

/*
#cgo CXXFLAGS: -std=c++17
#include <stdlib.h>
#include "mp.h"
#include "ggml-cpu.h"
*/
import "C"

import (
	"os"
	"sync"

	_ "github.com/ollama/ollama/llama/llama.cpp/src"      // libllama and its model graphs
	_ "github.com/ollama/ollama/ml/backend/ggml/ggml/src" // ggml, ggml-base, ggml-cpu
)

// Version of meshp2p; overridden at link time by the Makefile.
var Version = "dev"

// LlamaCommit is the upstream llama.cpp revision vendored by the pinned
// ollama module; OllamaVersion is that module's version.
const (
	LlamaCommit   = llamaCommit
	OllamaVersion = ollamaVersion
)

// backendOnce guards llama_backend_init, which is process-wide by design in
// llama.cpp (it registers the CPU backend once).
var backendOnce sync.Once

func initBackend() {
	backendOnce.Do(func() {
		verbose := 0
		if os.Getenv("MESHP2P_LLAMA_DEBUG") != "" {
			verbose = 1
		}
		C.mp_log_init(C.int(verbose))
		C.llama_backend_init()
	})
}

// HasAMXInt8 reports whether ggml's CPU backend was compiled with AMX-INT8
// (__AMX_INT8__ defined by the C compiler flags, e.g. -march=sapphirerapids
// without -mno-amx-int8). It says what was compiled, not what this CPU has.
// The Makefile turns AMX off on x86-64; see patches/README.md.
func HasAMXInt8() bool {
	return C.ggml_cpu_has_amx_int8() != 0
}

// SystemInfo returns llama.cpp's compiled-in CPU feature line.
func SystemInfo() string {
	initBackend()
	return C.GoString(C.llama_print_system_info())
}

// TimerSlackNs is the calling thread's timer slack in ns (-1: unknown):
// 1 ms unless MESHP2P_TIMER_SLACK_NS said otherwise (see mp.c).
func TimerSlackNs() int64 { return int64(C.mp_timer_slack_ns()) }
