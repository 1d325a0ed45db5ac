#!/bin/sh
# Installs what the cgo build needs beyond Go and a C/C++ compiler:
# Debian's nlohmann-json3-dev (the JSON library llama.cpp's
# json-schema-to-grammar is written against; the pinned ollama module
# ships that converter but not its vendor/ directory, which Go module zips
# leave out). Run by the Makefile before the first build. Does nothing
# when the header is there; without root it says what to install.
set -eu
if [ -f /usr/include/nlohmann/json.hpp ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "build-deps: /usr/include/nlohmann/json.hpp is missing: install Debian's nlohmann-json3-dev (apt-get install nlohmann-json3-dev)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "build-deps: installing nlohmann-json3-dev"
apt-get install -y -qq --no-install-recommends nlohmann-json3-dev >/dev/null 2>&1 ||
	{ apt-get update -qq && apt-get install -y -qq --no-install-recommends nlohmann-json3-dev >/dev/null; }
