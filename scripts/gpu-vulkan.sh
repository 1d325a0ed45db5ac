#!/bin/sh
# Builds ggml's Vulkan backend library (libggml-vulkan.so) from the pinned
# github.com/ollama/ollama module's sources, with Debian 12's packages:
# `make gpu`; it lands in .cache/gpu/lib with its stamp (see docs/gpu.md). Two things the module and Debian lack are supplied
# here, not copied into the project:
#  - the module zip has no ggml-vulkan/vulkan-shaders/feature-tests/, and
#    ggml's CMake counts any glslc error other than "extension not
#    supported" as support (it then enables cooperative-matrix shaders
#    Debian's glslc cannot compile): a glslc wrapper answers "extension
#    not supported" for a missing feature test;
#  - ggml-vulkan.cpp needs Vulkan headers newer than Debian's 1.3.239
#    (vk::LayerSettingEXT): Khronos' Vulkan-Headers come from the Go module
#    proxy (VULKAN_HEADERS, a version), Debian's loader is linked.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${GPU_OUT:-$root/.cache/gpu}
headers_version=${VULKAN_HEADERS:-v1.3.280}
need=""
for c in glslc cmake patchelf; do command -v "$c" >/dev/null 2>&1 || need="$need $c"; done
[ -f /usr/include/vulkan/vulkan.h ] || need="$need libvulkan-dev"
# Mesa's lavapipe: the Vulkan device tests run on where there is no GPU.
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || need="$need mesa-vulkan-drivers"
if [ -n "$need" ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "gpu-vulkan: missing$need: apt-get install glslc libvulkan-dev mesa-vulkan-drivers cmake patchelf (as root, make gpu does)" >&2
		exit 3 # make test skips the GPU tests then (only then)
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq --no-install-recommends glslc libvulkan-dev mesa-vulkan-drivers cmake patchelf >/dev/null 2>&1 ||
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends glslc libvulkan-dev mesa-vulkan-drivers cmake patchelf >/dev/null; }
fi
module=$(cd "$root" && go list -m -f '{{.Dir}}' github.com/ollama/ollama)
headers=$(cd "$root" && GOFLAGS=-mod=mod go mod download -json "github.com/KhronosGroup/Vulkan-Headers@$headers_version" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
if [ ! -f "$headers/include/vulkan/vulkan.hpp" ]; then
	echo "gpu-vulkan: Vulkan-Headers $headers_version not found through the Go module proxy" >&2
	exit 1
fi
mkdir -p "$out"
# A fresh clone on a machine that built this library before reuses it: the
# finished library is kept in the user's cache under a key of everything it
# is built from (the module, the headers, these scripts, the compilers),
# like Go's build cache keeps llama.cpp's objects. GPU_CACHE= (empty) skips it.
cache=${GPU_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/meshp2p/gpu-vulkan}
if [ -n "$cache" ]; then
	key=$({
		echo "$module $headers_version"
		cat "$0" "$root/scripts/gpu-install-lib.sh"
		c++ --version 2>&1 | head -1
		glslc --version 2>&1 | head -1
		cmake --version 2>&1 | head -1
	} | sha256sum | cut -c1-24)
	if [ -f "$cache/$key/libggml-vulkan.so" ] && [ -f "$cache/$key/libggml-vulkan.so.meshp2p" ]; then
		mkdir -p "$out/lib"
		for f in libggml-vulkan.so libggml-vulkan.so.meshp2p; do
			cp "$cache/$key/$f" "$out/lib/$f.tmp" && mv "$out/lib/$f.tmp" "$out/lib/$f"
		done
		echo "gpu-vulkan: $out/lib/libggml-vulkan.so from the cache $cache/$key (stamp: $(cat "$out/lib/libggml-vulkan.so.meshp2p"))"
		exit 0
	fi
fi
cat >"$out/glslc" <<'WRAP'
#!/bin/sh
for a in "$@"; do
	case "$a" in
	*/feature-tests/*.comp)
		if [ ! -f "$a" ]; then
			case "$(basename "$a" .comp)" in
			coopmat) e=GL_KHR_cooperative_matrix ;;
			coopmat2) e=GL_NV_cooperative_matrix2 ;;
			integer_dot) e=GL_EXT_integer_dot_product ;;
			bfloat16) e=GL_EXT_bfloat16 ;;
			*) e=unknown ;;
			esac
			echo "error: extension not supported: $e" >&2
			exit 1
		fi ;;
	esac
done
exec glslc "$@"
WRAP
chmod +x "$out/glslc"
start=$(date +%s)
cmake -S "$module" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DVulkan_GLSLC_EXECUTABLE="$out/glslc" \
	-DVulkan_INCLUDE_DIR="$headers/include" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log" >&2; exit 1; }
cmake --build "$out/build" --target ggml-vulkan -j"$(nproc)" >"$out/build.log" 2>&1 || { grep -m 20 error "$out/build.log" >&2; exit 1; }
lib=$(find "$out/build" -name libggml-vulkan.so | head -1)
sh "$root/scripts/gpu-install-lib.sh" vulkan "$lib" "$out"
if [ -n "$cache" ]; then
	mkdir -p "$cache/$key.tmp$$"
	cp "$out/lib/libggml-vulkan.so" "$out/lib/libggml-vulkan.so.meshp2p" "$cache/$key.tmp$$/"
	rm -rf "$cache/$key" && mv "$cache/$key.tmp$$" "$cache/$key" || rm -rf "$cache/$key.tmp$$"
fi
echo "gpu-vulkan: built $out/lib/libggml-vulkan.so in $(( $(date +%s) - start )) s (Vulkan-Headers $headers_version; stamp: $(cat "$out/lib/libggml-vulkan.so.meshp2p"))"
