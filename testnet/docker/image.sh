#!/bin/sh
# image.sh BIN [TAG]: build the offline image (`make image`): FROM scratch,
# no pull. It holds BIN as /usr/local/bin/meshp2p, the shared libraries
# `ldd` lists for it, Debian's busybox-static (sh, ip, nc, ...: the
# testnet's scripts and healthchecks) and this machine's iptables (nft
# backend, its extensions and their libraries: the router containers).
# Exit status 3: a part is missing here (docker, iptables, busybox-static).
# The build context is assembled in a temporary directory outside the
# repository and removed afterwards; nothing here is ever committed.
set -eu

BIN=${1:?usage: image.sh BIN [TAG]}
TAG=${2:-meshp2p:local}
CACHE=${MESHP2P_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshp2p-image}

[ -x "$BIN" ] || { echo "image.sh: $BIN is not an executable (make build)" >&2; exit 1; }
command -v docker >/dev/null 2>&1 || { echo "image.sh: docker is not installed (make deps as root)" >&2; exit 3; }
docker version >/dev/null 2>&1 || { echo "image.sh: no docker daemon answers (start one that leaves host networking alone: sh testnet/docker/dockerd.sh start)" >&2; exit 3; }
IPT=$(command -v xtables-nft-multi || true)
[ -n "$IPT" ] || { echo "image.sh: iptables (nft) is not installed here (make deps as root)" >&2; exit 3; }

ctx=$(mktemp -d "${TMPDIR:-/tmp}/meshp2p-image.XXXXXX")
trap 'rm -rf "$ctx" "$ctx.log"' EXIT INT TERM
root=$ctx/rootfs
mkdir -p "$root/bin" "$root/usr/local/bin" "$root/usr/sbin" "$root/etc" "$root/data" "$root/tmp" "$root/run" "$root/root"
chmod 1777 "$root/tmp"

# copylibs FILE...: every library ldd lists for FILE, at its own path.
copylibs() {
	for f in "$@"; do
		ldd "$f" 2>/dev/null | grep -oE '/[^ ]+' | while read -r lib; do
			[ -e "$root$lib" ] && continue
			mkdir -p "$root$(dirname "$lib")"
			cp -L "$lib" "$root$lib"
		done
	done
}

cp "$BIN" "$root/usr/local/bin/meshp2p"
copylibs "$BIN"

# busybox-static from Debian (cached .deb; apt-get download needs no root).
mkdir -p "$CACHE"
deb=$(ls "$CACHE"/busybox-static_*.deb 2>/dev/null | head -1 || true)
if [ -z "$deb" ]; then
	(cd "$CACHE" && apt-get download busybox-static >/dev/null 2>&1) || { echo "image.sh: apt-get download busybox-static failed (no Debian archive reachable?)" >&2; exit 3; }
	deb=$(ls "$CACHE"/busybox-static_*.deb | head -1)
fi
dpkg-deb -x "$deb" "$ctx/bb"
cp "$ctx/bb/bin/busybox" "$root/bin/busybox"
for a in sh ash cat cp echo env grep head hostname ip kill ls mkdir nc ping ps rm sed sleep sort tail test timeout tr true wc wget; do
	ln -s busybox "$root/bin/$a"
done

# iptables: the multi-call binary, its extensions (conntrack, MASQUERADE, ...), their libraries.
cp "$IPT" "$root/usr/sbin/xtables-nft-multi"
for a in iptables iptables-restore iptables-save; do ln -s xtables-nft-multi "$root/usr/sbin/$a"; done
xt=$(dirname "$(readlink -f "$(ldd "$IPT" | grep -oE '/[^ ]*libxtables[^ ]*')")")/xtables
mkdir -p "$root$xt"
cp "$xt"/*.so "$root$xt/"
copylibs "$IPT" "$xt"/*.so

printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
cat >"$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs/ /
ENV PATH=/usr/local/bin:/usr/sbin:/bin HOME=/root MESHP2P_DATA_DIR=/data
LABEL org.meshp2p.testnet=1
WORKDIR /data
ENTRYPOINT ["/usr/local/bin/meshp2p"]
DOCKERFILE
# The legacy builder: FROM scratch needs no BuildKit (not packaged in Debian).
if ! DOCKER_BUILDKIT=0 docker build -q -t "$TAG" "$ctx" >"$ctx.log" 2>&1; then
	cat "$ctx.log" >&2
	exit 1
fi
echo "image.sh: built $TAG ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.1f MB", $1/1e6}'))"
