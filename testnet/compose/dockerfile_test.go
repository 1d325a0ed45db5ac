package compose

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The Dockerfile cannot be built here (no registry), so this is a static
// check: every instruction is a known one, two stages (the Go toolchain on
// Debian bookworm, then bookworm-slim), SIMD a build argument defaulting to
// the portable x86-64-v3 and passed to make build, the binary copied from
// the build stage, and the build context leaving out bin/.
func TestDockerfileStatic(t *testing.T) {
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{"FROM": true, "ARG": true, "RUN": true, "COPY": true, "ENV": true, "WORKDIR": true,
		"VOLUME": true, "EXPOSE": true, "ENTRYPOINT": true, "CMD": true, "LABEL": true, "USER": true}
	var froms, ins []string
	cont := false
	for i, l := range strings.Split(string(b), "\n") {
		s := strings.TrimSpace(l)
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		if !cont {
			w := strings.Fields(s)[0]
			if !known[w] {
				t.Errorf("line %d: unknown instruction %q", i+1, w)
			}
			ins = append(ins, s)
			if w == "FROM" {
				froms = append(froms, s)
			}
		} else {
			ins[len(ins)-1] += " " + s
		}
		cont = strings.HasSuffix(s, "\\")
	}
	if cont {
		t.Error("the last line ends in a continuation")
	}
	if len(froms) != 2 || !regexp.MustCompile(`^FROM golang:\S*bookworm AS build$`).MatchString(froms[0]) ||
		froms[1] != "FROM debian:bookworm-slim" {
		t.Errorf("stages: %q", froms)
	}
	all := strings.Join(ins, "\n")
	for _, want := range []string{"ARG SIMD=x86-64-v3", "make build SIMD=${SIMD}", "COPY --from=build /src/bin/meshp2p /usr/local/bin/meshp2p", "ENTRYPOINT"} {
		if !strings.Contains(all, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	ign, err := os.ReadFile("../../.dockerignore")
	if err != nil || !strings.Contains(string(ign), "bin/") {
		t.Errorf(".dockerignore must leave out bin/: %q %v", ign, err)
	}
}
