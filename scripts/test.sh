#!/bin/sh
# The test steps of `make test` (after deps, build, the AMX link check and
# vet): the Vulkan library, `go test ./...`, the container test, a
# 5-minute soak, the fuzz smoke, and the other platforms: the Windows and
# ARM64 release binaries (and the portable linux-amd64 one) under wine and
# qemu-user, with the platform code's own tests (make test-platforms-run).
# Those binaries compile llama.cpp once per platform; they build in the
# background at nice 19 (make dist) from the start, on the CPU the other
# steps leave idle, and the last step waits for them: minutes of the run's
# time with a warm Go cache, more with a cold one (docs/platforms.md).
# Every step runs even when an earlier one failed, its output goes to the
# terminal and to .cache/test/test.log, and the last lines printed are a
# summary: each step's time, one line per failed test with its package
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

# The other platforms' release binaries and archives, in the background at
# the lowest priority (the tests keep the CPU they ask for).
: >"$dir/dist.log"
rm -f "$dir/dist.rc" "$dir/dist.end"
(
	CROSS_SKIP_MISSING=1 nice -n 19 $MAKE --no-print-directory dist >"$dir/dist.log" 2>&1
	echo $? >"$dir/dist.rc"
	date +%s >"$dir/dist.end"
) &
dist_pid=$!
dist_start=$(date +%s)
echo "make test: building the Windows, ARM64 and portable linux-amd64 release binaries in the background (nice 19; log: $dir/dist.log)"

failed_steps=""
times=""
rc=0
sh scripts/gpu-vulkan.sh || rc=$?
if [ $rc = 0 ]; then
	gpu=require
elif [ $rc = 3 ]; then
	gpu=
	echo "make test: GPU tests will skip"
else
	# A failure like any step's: the other steps still run (and the
	# background build is waited for), the GPU tests skip, the run fails.
	gpu=
	echo "make test: the Vulkan backend library failed to build (exit $rc); GPU tests will skip"
	failed_steps="
make test: the Vulkan backend library failed to build (exit $rc)"
fi

# step NAME CMD...: runs CMD, its output to the terminal and the log.
step() {
	name=$1
	shift
	t0=$(date +%s)
	{
		"$@"
		echo $? >"$dir/rc"
	} 2>&1 | tee -a "$log"
	src=$(cat "$dir/rc")
	times="$times
  $(($(date +%s) - t0)) s  $name"
	if [ "$src" != 0 ]; then
		failed_steps="$failed_steps
make test: step '$name' failed (exit $src)"
	fi
}

step "go test ./..." env MESHP2P_GPU_TESTS=$gpu go test -count=1 -timeout "$TEST_TIMEOUT" ./...
step "make test-docker" $MAKE --no-print-directory test-docker
step "make soak" $MAKE --no-print-directory soak SOAK_DURATION=5m
step "make fuzz" $MAKE --no-print-directory fuzz FUZZTIME="$FUZZTIME"
# platforms: waits for the background build, then runs its binaries.
platforms() {
	if kill -0 "$dist_pid" 2>/dev/null; then
		echo "make test: waiting for the release builds (started $(($(date +%s) - dist_start)) s ago; $dir/dist.log)"
	fi
	wait "$dist_pid"
	echo "make test: the release builds took $(($(cat "$dir/dist.end" 2>/dev/null || date +%s) - dist_start)) s in the background"
	if [ "$(cat "$dir/dist.rc" 2>/dev/null)" != 0 ]; then
		tail -n 40 "$dir/dist.log"
		echo "make test: make dist failed (exit $(cat "$dir/dist.rc" 2>/dev/null)); full log in $dir/dist.log"
		return 1
	fi
	grep -E '^(cross|dist):' "$dir/dist.log"
	$MAKE --no-print-directory test-platforms-run
}
step "make test-platforms-run" platforms

secs=$(($(date +%s) - start))
echo
echo "== make test: summary (tests took ${secs}s; full output in $log) =="
echo "step times:$times"
"$dir/testsum" "$log"
if [ -n "$failed_steps" ]; then
	echo "$failed_steps" | sed '/^$/d'
	echo "make test: FAILED"
	exit 1
fi
echo "make test: every test passed"
