#!/bin/sh
# Installs Node.js (Debian's nodejs and npm, when node is missing) and the
# official SDKs that api/sdk_test.go runs against the API
# (api/testdata/sdk: @anthropic-ai/sdk and ollama, pinned by its
# package-lock.json), with `npm ci`. Does nothing when node_modules already
# matches the lock file (offline-safe); without root or network it only
# says what is missing (the SDK test then skips with that message).
set -eu
dir=$(cd "$(dirname "$0")/.." && pwd)/api/testdata/sdk
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	if [ "$(id -u)" != 0 ]; then
		echo "node-deps: node/npm are not installed and this is not root; the SDK test will skip (apt-get install nodejs npm)" >&2
		exit 0
	fi
	export DEBIAN_FRONTEND=noninteractive
	if ! (apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null); then
		echo "node-deps: could not install nodejs and npm (apt-get failed); the SDK test will skip" >&2
		exit 0
	fi
fi
# node_modules/.meshp2p-lock holds the digest of the lock file it was
# installed from.
want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
if [ -f "$dir/node_modules/.meshp2p-lock" ] && [ "$(cat "$dir/node_modules/.meshp2p-lock")" = "$want" ]; then
	exit 0
fi
if npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >/dev/null; then
	echo "$want" >"$dir/node_modules/.meshp2p-lock"
	echo "node-deps: installed the SDKs of $dir (node $(node --version))"
else
	echo "node-deps: npm ci failed (no registry access?); the SDK test will skip" >&2
fi
