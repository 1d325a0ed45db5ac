package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strings"

	"github.com/neuron-tai/meshp2p/engine"
)

// Set by the Makefile: buildSIMD (-X main.buildSIMD) is the -march level,
// buildNoAMX (-X main.buildNoAMX) the flags that turned AMX off, if any.
// buildDist (-X main.buildDist) names the release archive a binary was
// built for (make dist: e.g. linux-arm64); empty for make build.
var (
	buildSIMD  = "default"
	buildNoAMX = ""
	buildDist  = ""
)

// buildName says which build this is: a release archive's or a local one.
func buildName() string {
	if buildDist != "" {
		return "release build meshp2p-" + engine.Version + "-" + buildDist
	}
	return "local build"
}

// needsLine describes the CPU extensions the build requires.
func needsLine(needs []string) string {
	if len(needs) == 0 {
		return "the architecture's baseline: runs on any " + runtime.GOARCH + " CPU"
	}
	return "needs " + strings.Join(needs, " ") + "; this CPU has them: one without them is refused at start"
}

func runVersion(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("version", stdout, "")
	var df deviceFlags
	df.register(fs, "(unused here)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "meshp2p %s\n", engine.Version)
	fmt.Fprintf(stdout, "llama.cpp %s (via github.com/ollama/ollama %s)\n", engine.LlamaCommit, engine.OllamaVersion)
	fmt.Fprintf(stdout, "build: %s/%s, %s\n", runtime.GOOS, runtime.GOARCH, buildName())
	fmt.Fprintf(stdout, "simd: -march=%s (%s)\n", buildSIMD, needsLine(engine.CPUNeeds()))
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
