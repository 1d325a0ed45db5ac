#!/bin/sh
# make fuzz: every fuzz target of the module for FUZZTIME ($1: a duration,
# or Nx executions).
#
# One fuzz-instrumented test binary per package (`go test -c -fuzz`), run
# once per target from the package's directory (its testdata/fuzz seed
# corpus), new inputs kept where `go test -fuzz` keeps them (the Go cache's
# fuzz directory). Targets are found in the packages' test files
# (`go list`), so packages without any build nothing. Before, every target
# was its own `go test -fuzz` (a link each) and every package was built
# once more to list its targets.
#
# -trimpath: the instrumented builds' cache keys do not depend on the
# clone's directory, so a fresh clone rebuilds only the packages that
# changed. -test.fuzzminimizetime 1s: some inputs are signed and verified
# (transcripts, proofs), and minimizing each new one for the default 60 s
# stalls a run.
set -eu
fuzztime=${1:-10000x}
bindir=$(pwd)/.cache/fuzz
mkdir -p "$bindir"
cache=$(go env GOCACHE)/fuzz
go list -f '{{.ImportPath}} {{.Dir}}{{range .TestGoFiles}} {{.}}{{end}}{{range .XTestGoFiles}} {{.}}{{end}}' ./... |
while read -r pkg dir files; do
	[ -n "$files" ] || continue
	targets=$(cd "$dir" && sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $files)
	[ -n "$targets" ] || continue
	bin=$bindir/$(echo "$pkg" | tr / _).test
	echo "fuzz: building $pkg"
	go test -trimpath -c -fuzz=. -o "$bin" "$pkg"
	for f in $targets; do
		echo "fuzz $pkg $f ($fuzztime)"
		(cd "$dir" && "$bin" -test.run='^$' -test.fuzz="^$f\$" -test.fuzztime="$fuzztime" \
			-test.fuzzminimizetime=1s -test.fuzzcachedir="$cache/$pkg" -test.timeout=20m)
	done
done
