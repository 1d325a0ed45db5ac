#!/bin/sh
# Release archives (make dist; docs/platforms.md):
#   scripts/dist.sh VERSION PLATFORM...
# builds each platform with scripts/cross.sh (into bin/cross, where make
# cross puts them) and packs
#   dist/meshp2p-VERSION-PLATFORM.tar.gz (Linux) or .zip (Windows)
# holding the binary, README.md, docs/platforms.md, the demo model
# (models/stories260K.gguf and its README), and LICENSES/: llama.cpp's and
# ollama's (from the pinned module), the demo model's notice, Go's, and
# the license file of every Go module linked into the binary; the project's
# own LICENSE when the repository has one. dist/SHA256SUMS lists the
# archives' SHA-256 sums. CROSS_SKIP_MISSING=1 (make test-platforms):
# platforms without a compiler are left out, saying so.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=$1
shift
dist=dist
mkdir -p "$dist"
sh scripts/cross.sh "$version" bin/cross "$@"
ollama=$(go list -m -f '{{.Dir}}' github.com/ollama/ollama)
for plat in "$@"; do
	exe=
	goos=${plat%-*}
	goarch=${plat#*-}
	[ "$goos" = windows ] && exe=.exe
	name=meshp2p-$version-$plat
	if [ ! -f "bin/cross/meshp2p-$plat$exe" ] && [ -n "${CROSS_SKIP_MISSING:-}" ]; then
		echo "dist: no $name (its compiler is missing)" >&2
		continue
	fi
	stage=$dist/stage/$name
	rm -rf "$stage"
	mkdir -p "$stage/LICENSES" "$stage/models"
	cp "bin/cross/meshp2p-$plat$exe" "$stage/meshp2p$exe"
	cp README.md "$stage/"
	cp docs/platforms.md "$stage/PLATFORMS.md"
	cp models/stories260K.gguf models/README.md "$stage/models/"
	[ -f LICENSE ] && cp LICENSE "$stage/LICENSE"
	cp "$ollama/llama/llama.cpp/LICENSE" "$stage/LICENSES/llama.cpp.txt"
	cp models/README.md "$stage/LICENSES/stories260K-model.md"
	cp "$(go env GOROOT)/LICENSE" "$stage/LICENSES/go.txt"
	# Every Go module linked into this platform's binary.
	GOOS=$goos GOARCH=$goarch CGO_ENABLED=1 go list -deps -f '{{with .Module}}{{if not .Main}}{{.Path}} {{.Dir}}{{end}}{{end}}' ./cmd/meshp2p |
		sort -u | while read -r mod dir; do
		for f in "$dir"/LICENSE* "$dir"/LICENCE* "$dir"/COPYING* "$dir"/NOTICE*; do
			[ -f "$f" ] || continue
			base=$(basename "$f")
			case $base in *.txt | *.md) ;; *) base=$base.txt ;; esac
			cp "$f" "$stage/LICENSES/$(echo "$mod" | tr '/' '_')-$base"
		done
	done
	rm -f "$dist/$name.tar.gz" "$dist/$name.zip"
	if [ "$goos" = windows ]; then
		(cd "$dist/stage" && zip -qr -X "../$name.zip" "$name")
	else
		tar -C "$dist/stage" --owner=0 --group=0 --sort=name -czf "$dist/$name.tar.gz" "$name"
	fi
	rm -rf "$stage"
	echo "dist: $dist/$name.$([ "$goos" = windows ] && echo zip || echo tar.gz)"
done
rmdir "$dist/stage" 2>/dev/null || true
(cd "$dist" && sha256sum meshp2p-"$version"-*.tar.gz meshp2p-"$version"-*.zip 2>/dev/null >SHA256SUMS || true)
echo "dist: $dist/SHA256SUMS"
cat "$dist/SHA256SUMS"
