package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"

	"github.com/neuron-tai/meshp2p/engine"
)

func TestAMXLine(t *testing.T) {
	for _, c := range []struct {
		has   bool
		noAMX string
		want  string
	}{
		{false, "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16", "off (compiled without AMX: -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)"},
		{false, "", "off (the compiler target has no AMX)"},
		{true, "", "on (ggml compiled with __AMX_INT8__)"},
	} {
		if got := amxLine(c.has, c.noAMX); got != c.want {
			t.Errorf("amxLine(%v, %q) = %q, want %q", c.has, c.noAMX, got, c.want)
		}
	}
}

// The version command reports what ggml was compiled with. A build with
// __AMX_INT8__ would not link (patches/README.md), so a test binary that runs
// has AMX off.
func TestVersionAMX(t *testing.T) {
	if engine.HasAMXInt8() {
		t.Fatal("ggml compiled with AMX-INT8, which this build cannot link (see patches/README.md)")
	}
	var out bytes.Buffer
	if err := runVersion(context.Background(), &out, &out, nil); err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{`(?m)^simd: -march=\S+ \(.+\)$`, `(?m)^build: \w+/\w+, local build$`, `(?m)^amx: off \(.+\)$`, `(?m)^kernel class: cpu/\S+/fa \(batch-invariant\)$`} {
		if !regexp.MustCompile(re).Match(out.Bytes()) {
			t.Errorf("version output lacks %s:\n%s", re, out.String())
		}
	}
}
