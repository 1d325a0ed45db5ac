#!/bin/sh
# Installs what the cross builds and their tests need (docs/platforms.md):
# Debian's mingw-w64 (Windows, posix threads) and aarch64 cross compilers,
# qemu-user-static (runs the ARM64 binary, and the amd64 one on an older
# emulated CPU), wine64 (runs the Windows binary) and zip (make dist's
# Windows archive). Run by make cross, dist, vet-cross and test-platforms (not by make deps:
# make test does not need them).
# Does nothing when they are all there; without root it says what is
# missing (make cross then fails, and the platform tests skip, saying so).
set -eu
missing=""
for tool in x86_64-w64-mingw32-gcc-posix:g++-mingw-w64-x86-64-posix \
	aarch64-linux-gnu-g++:g++-aarch64-linux-gnu \
	qemu-aarch64-static:qemu-user-static \
	wine:wine zip:zip; do
	if ! command -v "${tool%%:*}" >/dev/null 2>&1; then
		missing="$missing ${tool#*:}"
	fi
done
# wine's 64-bit loader is its own package (wine alone may bring only the
# 32-bit one).
if [ ! -x /usr/lib/wine/wine64 ]; then
	missing="$missing wine64"
fi
if [ -z "$missing" ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "cross-deps: missing:$missing (apt-get install$missing); make cross fails and the platform tests skip without them" >&2
	exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "cross-deps: installing$missing"
apt-get update -qq
# shellcheck disable=SC2086 # a list of package names
apt-get install -y -qq --no-install-recommends $missing gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null
