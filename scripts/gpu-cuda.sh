#!/bin/sh
# Builds ggml's CUDA backend library (libggml-cuda.so) from the pinned
# github.com/ollama/ollama module's sources: `make gpu GPU=cuda`, on a
# machine with the CUDA toolkit (docs/gpu.md). Like gpu-vulkan.sh it uses
# the module's own top-level CMakeLists.txt, which sets what ollama's
# builds set (GGML_BACKEND_DL, GGML_CUDA_FA, GGML_CUDA_GRAPHS,
# GGML_CUDA_PEER_MAX_BATCH_SIZE=128, ...), and builds only the ggml-cuda
# target (plus the ggml-base it links). The engine links ggml statically
# and exports its symbols, so the library must come from exactly the same
# sources: like gpu-vulkan.sh, it is copied to $GPU_OUT/lib with a stamp
# file libggml-cuda.so.meshp2p naming the module version and its llama.cpp
# commit (read from the module's Makefile.sync, as internal/gencgo does),
# which the engine checks before loading it.
#
# CUDA_ARCHITECTURES: CMAKE_CUDA_ARCHITECTURES; default "native" when
# nvidia-smi lists a GPU, else 75;80;86;89;90 (Turing to Hopper; 89 and
# 90 need CUDA >= 11.8, and the module's CMake builds nothing below 75 for
# CUDA 13).
# CUDACXX: the nvcc to use (default: nvcc on PATH, else
# /usr/local/cuda/bin/nvcc). GPU_OUT: output folder (default .cache/gpu).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${GPU_OUT:-$root/.cache/gpu}
nvcc=${CUDACXX:-}
[ -n "$nvcc" ] || nvcc=$(command -v nvcc 2>/dev/null || true)
[ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; } || true
if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then
	echo "gpu-cuda: nvcc not found (CUDACXX, PATH, /usr/local/cuda/bin): install the CUDA toolkit, from NVIDIA's CUDA repository for Debian 12 or as Debian 12's nvidia-cuda-toolkit (CUDA 11.8, in the non-free component, not in main); see docs/gpu.md" >&2
	exit 1
fi
# FindCUDAToolkit (called by the module's CMakeLists.txt before CUDA is
# enabled) looks for nvcc on PATH.
PATH=$(dirname "$nvcc"):$PATH
export PATH
if ! command -v cmake >/dev/null 2>&1; then
	if [ "$(id -u)" != 0 ]; then
		echo "gpu-cuda: missing cmake: apt-get install cmake" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq --no-install-recommends cmake >/dev/null 2>&1 ||
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends cmake >/dev/null; }
fi
cuda_version=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
arch=${CUDA_ARCHITECTURES:-}
if [ -z "$arch" ]; then
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
		arch=native
	else
		arch="75;80;86;89;90"
	fi
fi
module=$(cd "$root" && go list -m -f '{{.Dir}}' github.com/ollama/ollama)
version=$(cd "$root" && go list -m -f '{{.Version}}' github.com/ollama/ollama)
commit=$(sed -n 's/^[[:space:]]*FETCH_HEAD=[[:space:]]*//p' "$module/Makefile.sync" 2>/dev/null | tail -1 | tr -d '[:space:]')
[ -n "$commit" ] || commit=unknown
mkdir -p "$out"
# A build folder configured for another module version or another nvcc
# keeps stale cache entries (CMake refuses a new source folder; the
# CUDAToolkit paths stay cached): start it afresh.
cached() { sed -n "s/^$1:[A-Z]*=//p" "$out/build-cuda/CMakeCache.txt"; }
if [ -f "$out/build-cuda/CMakeCache.txt" ]; then
	for v in "CMAKE_HOME_DIRECTORY=$module" "CMAKE_CUDA_COMPILER=$nvcc" "CUDAToolkit_NVCC_EXECUTABLE=$nvcc"; do
		c=$(cached "${v%%=*}")
		if [ -n "$c" ] && [ "$c" != "${v#*=}" ]; then
			rm -rf "$out/build-cuda"
			break
		fi
	done
fi
start=$(date +%s)
# Vulkan off: on a machine where gpu-vulkan.sh ran, the module's
# CMakeLists.txt would otherwise also configure ggml-vulkan here.
cmake -S "$module" -B "$out/build-cuda" -DCMAKE_BUILD_TYPE=Release \
	-DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
	-DCMAKE_DISABLE_FIND_PACKAGE_Vulkan=ON >"$out/configure-cuda.log" 2>&1 ||
	{ tail -20 "$out/configure-cuda.log" >&2; exit 1; }
cmake --build "$out/build-cuda" --target ggml-cuda -j"$(nproc)" >"$out/build-cuda.log" 2>&1 ||
	{ grep -m 20 -i error "$out/build-cuda.log" >&2; exit 1; }
# Like gpu-vulkan.sh: the library and its stamp go to $out/lib, where
# `make gpu` picks them up.
lib=$(find "$out/build-cuda" -name libggml-cuda.so | head -1)
if [ -z "$lib" ]; then
	echo "gpu-cuda: build finished but no libggml-cuda.so under $out/build-cuda (see $out/build-cuda.log)" >&2
	exit 1
fi
sh "$root/scripts/gpu-install-lib.sh" cuda "$lib" "$out"
echo "gpu-cuda: built $out/lib/libggml-cuda.so in $(( $(date +%s) - start )) s (CUDA $cuda_version, architectures $arch; ollama $version, llama.cpp $commit)"
