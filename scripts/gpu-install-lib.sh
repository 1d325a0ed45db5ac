#!/bin/sh
# Installs a ggml backend library built by gpu-vulkan.sh or gpu-cuda.sh
# into OUT/lib with its stamp: gpu-install-lib.sh NAME BUILT_LIB OUT.
#  - The library runs against the meshp2p binary's own ggml (exported with
#    -rdynamic), never a libggml-base of its own: its dependency on
#    libggml-base.so.0 and the build tree's RUNPATH are removed (patchelf),
#    so the copy in bin/lib loads on a machine without the build tree.
#  - The stamp names the sources it was built from; the engine refuses a
#    library whose stamp is not its own.
set -eu
name=$1 lib=$2 out=$3
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v patchelf >/dev/null 2>&1; then
	if [ "$(id -u)" != 0 ]; then
		echo "gpu: missing patchelf: apt-get install patchelf (as root, make gpu does)" >&2
		exit 3
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq --no-install-recommends patchelf >/dev/null 2>&1 ||
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends patchelf >/dev/null; }
fi
module=$(cd "$root" && go list -m -f '{{.Dir}}' github.com/ollama/ollama)
version=$(cd "$root" && go list -m -f '{{.Version}}' github.com/ollama/ollama)
commit=$(sed -n 's/^FETCH_HEAD=//p' "$module/Makefile.sync" | tr -d ' ')
mkdir -p "$out/lib"
dst="$out/lib/libggml-$name.so"
cp "$lib" "$dst.tmp"
patchelf --remove-needed libggml-base.so.0 --remove-rpath "$dst.tmp"
needed=$(patchelf --print-needed "$dst.tmp")
case "$needed" in
*libggml-base*)
	echo "gpu: $dst still needs libggml-base after patchelf" >&2
	exit 1 ;;
esac
mv "$dst.tmp" "$dst"
echo "ollama $version llama.cpp $commit" >"$dst.meshp2p"
