package main

import (
	"context"
	"fmt"
	"io"

	"github.com/neuron-tai/meshp2p/engine"
)

// Set by the Makefile: buildSIMD (-X main.buildSIMD) is the -march level,
// buildNoAMX (-X main.buildNoAMX) the flags that turned AMX off, if any.
var (
	buildSIMD  = "default"
	buildNoAMX = ""
)

func runVersion(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("version", stdout, "")
	var df deviceFlags
	df.register(fs, "(unused here)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "meshp2p %s\n", engine.Version)
	fmt.Fprintf(stdout, "llama.cpp %s (via github.com/ollama/ollama %s)\n", engine.LlamaCommit, engine.OllamaVersion)
	fmt.Fprintf(stdout, "simd: -march=%s\n", buildSIMD)
	fmt.Fprintf(stdout, "amx: %s\n", amxLine(engine.HasAMXInt8(), buildNoAMX))
	fmt.Fprintf(stdout, "cpu features: %s\n", engine.SystemInfo())
	inv := "batch-invariant"
	if err := engine.CheckInvariantBuild(); err != nil {
		inv = "NOT batch-invariant: shards refuse to start (" + err.Error() + ")"
	}
	fmt.Fprintf(stdout, "kernel class: %s (%s)\n", engine.KernelClass(), inv)
	printDevices(stdout, df.dirs())
	return nil
}

// amxLine describes whether ggml was compiled with AMX (hasAMX, from
// ggml_cpu_has_amx_int8) and why not.
func amxLine(hasAMX bool, noAMX string) string {
	switch {
	case hasAMX:
		return "on (ggml compiled with __AMX_INT8__)"
	case noAMX != "":
		return "off (compiled without AMX: " + noAMX + ")"
	default:
		return "off (the compiler target has no AMX)"
	}
}
