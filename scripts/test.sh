#!/bin/sh
# The test steps of `make test` (after deps, build, the AMX link check and
# vet): the Vulkan library, `go test ./...`, the container test, a
# 5-minute soak, the fuzz smoke and the platform code's pure-Go tests
# under wine and qemu (make test-platforms-unit). (The Windows and ARM64
# release builds under wine and qemu are `make test-platforms`, not run
# here: on a machine whose Go cache is cold they compile llama.cpp three
# more times, 35 min on 2 busy cores, which would more than double make
# test; docs/platforms.md.) Every step runs even when an earlier one failed,
# its output goes to the terminal and to .cache/test/test.log, and the last
# lines printed are a summary: one line per failed test with its package
# (internal/testsum), then each failed step. Exit status 1 if anything
# failed.
#
# From the Makefile: MAKE, TEST_TIMEOUT, FUZZTIME.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
MAKE=${MAKE:-make}
TEST_TIMEOUT=${TEST_TIMEOUT:-35m}
FUZZTIME=${FUZZTIME:-50000x}
dir=.cache/test
log=$dir/test.log
mkdir -p "$dir"
: >"$log"
go build -o "$dir/testsum" ./internal/testsum || exit 1
start=$(date +%s)
# Where the test models come from (internal/testmodels): say it up front,
# so a run whose model tests skip says why in its first lines.
models=${MESHP2P_MODELS:-$(dirname "$root")/shared/models}
if [ -d "$models" ]; then
	echo "make test: test models from $models"
else
	echo "make test: no test models at $models (set MESHP2P_MODELS or put shared/models next to the repository):"
	echo "  tests that need only the committed models/stories260K.gguf use it; the others skip, saying so"
fi

rc=0
sh scripts/gpu-vulkan.sh || rc=$?
if [ $rc = 0 ]; then
	gpu=require
elif [ $rc = 3 ]; then
	gpu=
	echo "make test: GPU tests will skip"
else
	echo "make test: the Vulkan backend library failed to build (exit $rc)"
	exit $rc
fi

failed_steps=""
# step NAME CMD...: runs CMD, its output to the terminal and the log.
step() {
	name=$1
	shift
	{
		"$@"
		echo $? >"$dir/rc"
	} 2>&1 | tee -a "$log"
	src=$(cat "$dir/rc")
	if [ "$src" != 0 ]; then
		failed_steps="$failed_steps
make test: step '$name' failed (exit $src)"
	fi
}

step "go test ./..." env MESHP2P_GPU_TESTS=$gpu go test -count=1 -timeout "$TEST_TIMEOUT" ./...
step "make test-docker" $MAKE --no-print-directory test-docker
step "make soak" $MAKE --no-print-directory soak SOAK_DURATION=5m
step "make fuzz" $MAKE --no-print-directory fuzz FUZZTIME="$FUZZTIME"
step "make test-platforms-unit" $MAKE --no-print-directory test-platforms-unit

secs=$(($(date +%s) - start))
echo
echo "== make test: summary (tests took ${secs}s; full output in $log) =="
"$dir/testsum" "$log"
if [ -n "$failed_steps" ]; then
	echo "$failed_steps" | sed '/^$/d'
	echo "make test: FAILED"
	exit 1
fi
echo "make test: every test passed"
