#!/bin/sh
# Builds meshp2p for other platforms (docs/platforms.md):
#   scripts/cross.sh VERSION OUTDIR PLATFORM...
# PLATFORM is linux-amd64, linux-arm64 or windows-amd64; each binary is
# OUTDIR/meshp2p-PLATFORM (.exe for Windows), built with the Debian cross
# compilers (scripts/cross-deps.sh) at a portable SIMD level:
#   amd64: -march=$AMD64_SIMD (x86-64-v3: AVX2, FMA, BMI2, F16C; Haswell,
#          Zen 1 and later), AMX off as in make build;
#   arm64: -march=$ARM64_SIMD (armv8.2-a+fp16+dotprod: Cortex-A55/A76,
#          Neoverse N1, Graviton 2, Raspberry Pi 5 and later).
# Always -UGGML_USE_LLAMAFILE (batch invariance, Makefile) and -trimpath. A CPU without
# the level's extensions is refused at start (engine/cpucheck.c). Each
# platform's llama.cpp compile is cached by Go separately: minutes the
# first time (docs/platforms.md has the times), seconds afterwards.
# CROSS_VET=1 (make vet-cross): go vet ./... for each platform instead.
# CROSS_SKIP_MISSING=1 (make test-platforms): a platform whose compiler is
# not installed is skipped with a message instead of failing the run.
set -eu
version=$1
out=$2
shift 2
AMD64_SIMD=${AMD64_SIMD:-x86-64-v3}
ARM64_SIMD=${ARM64_SIMD:-armv8.2-a+fp16+dotprod}
noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
mkdir -p "$out"
for plat in "$@"; do
	case $plat in
	linux-amd64)
		cc=gcc cxx=g++ goos=linux goarch=amd64 simd=$AMD64_SIMD amx=$noamx exe=
		;;
	windows-amd64)
		cc=x86_64-w64-mingw32-gcc-posix cxx=x86_64-w64-mingw32-g++-posix
		goos=windows goarch=amd64 simd=$AMD64_SIMD amx=$noamx exe=.exe
		;;
	linux-arm64)
		cc=aarch64-linux-gnu-gcc cxx=aarch64-linux-gnu-g++ goos=linux goarch=arm64 simd=$ARM64_SIMD amx= exe=
		;;
	*)
		echo "cross: unknown platform $plat (linux-amd64, linux-arm64, windows-amd64)" >&2
		exit 2
		;;
	esac
	if ! command -v "$cxx" >/dev/null 2>&1; then
		echo "cross: $cxx not found: run scripts/cross-deps.sh as root (make deps does)" >&2
		if [ -n "${CROSS_SKIP_MISSING:-}" ]; then
			echo "cross: $plat skipped (its tests skip)" >&2
			rm -f "$out/meshp2p-$plat$exe"
			continue
		fi
		exit 1
	fi
	# -trimpath: no paths of this machine in a release binary, and Go's
	# cache keys of this repository's packages do not depend on the
	# clone's directory, so a fresh clone (make test in CI) recompiles only
	# what changed and relinks.
	flags=$(echo "-O3 -march=$simd $amx -UGGML_USE_LLAMAFILE" | tr -s ' ')
	if [ -n "${CROSS_VET:-}" ]; then
		# go vet ./... as that platform compiles it (build tags, cgo)
		echo "cross: go vet ./... for $goos/$goarch"
		CC=$cc CXX=$cxx GOOS=$goos GOARCH=$goarch CGO_ENABLED=1 GOTOOLCHAIN=local \
			CGO_CFLAGS=$flags CGO_CXXFLAGS=$flags go vet ./...
		continue
	fi
	bin=$out/meshp2p-$plat$exe
	echo "cross: $bin (CC=$cc, $flags)"
	start=$(date +%s)
	CC=$cc CXX=$cxx GOOS=$goos GOARCH=$goarch CGO_ENABLED=1 GOTOOLCHAIN=local \
		CGO_CFLAGS=$flags CGO_CXXFLAGS=$flags \
		go build -trimpath -ldflags "-X github.com/neuron-tai/meshp2p/engine.Version=$version -X main.buildSIMD=$simd -X 'main.buildNoAMX=$amx' -X main.buildDist=$plat" \
		-o "$bin" ./cmd/meshp2p
	echo "cross: $bin built in $(($(date +%s) - start)) s"
done
