#!/bin/sh
# Makes the Wine prefix the platform tests run the Windows binary in
# (scripts/wine/prefix.sh DIR; make test-platforms uses .cache/wine):
# `wineboot --init` once (about 15 s), then, where Wine lacks it (8.0),
# the bcryptprimitives.dll stand-in built from bcryptprimitives.c with
# mingw-w64. Prints nothing and exits 0 when the prefix is ready; exits 3
# (the tests then skip, saying so) when wine or mingw-w64 is missing.
set -eu
dir=$1
here=$(cd "$(dirname "$0")" && pwd)
for tool in wine x86_64-w64-mingw32-gcc-posix; do
	if ! command -v $tool >/dev/null 2>&1; then
		echo "wine prefix: $tool not found (scripts/cross-deps.sh installs it as root)" >&2
		exit 3
	fi
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
export WINEPREFIX="$dir" WINEDEBUG=-all
if [ ! -f "$dir/system.reg" ]; then
	echo "wine prefix: wineboot --init in $dir"
	wineboot --init >/dev/null 2>&1 || wine wineboot --init >/dev/null 2>&1 || true
	wineserver -w || true
fi
sys=$dir/drive_c/windows/system32
if [ ! -d "$sys" ]; then
	echo "wine prefix: $sys missing after wineboot" >&2
	exit 1
fi
if [ ! -f /usr/lib/x86_64-linux-gnu/wine/x86_64-windows/bcryptprimitives.dll ] && [ ! -f "$sys/bcryptprimitives.dll" ]; then
	x86_64-w64-mingw32-gcc-posix -shared -O2 -s -o "$sys/bcryptprimitives.dll.tmp" "$here/bcryptprimitives.c" -lbcrypt
	mv "$sys/bcryptprimitives.dll.tmp" "$sys/bcryptprimitives.dll"
fi
