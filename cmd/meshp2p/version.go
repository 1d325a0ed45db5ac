package main

import (
	"context"
	"fmt"
	"io"

	"github.com/neuron-tai/meshp2p/engine"
)

// buildSIMD is set by the Makefile (-X main.buildSIMD).
var buildSIMD = "default"

func runVersion(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fmt.Fprintf(stdout, "meshp2p %s\n", engine.Version)
	fmt.Fprintf(stdout, "llama.cpp %s (via github.com/ollama/ollama %s)\n", engine.LlamaCommit, engine.OllamaVersion)
	fmt.Fprintf(stdout, "simd: -march=%s\n", buildSIMD)
	fmt.Fprintf(stdout, "cpu features: %s\n", engine.SystemInfo())
	return nil
}
