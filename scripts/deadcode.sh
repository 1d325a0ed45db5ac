#!/bin/sh
# Dead code check of make lint (golang.org/x/tools/cmd/deadcode, whole
# program, reachability from the main packages):
#   1. no function is unreachable even from the tests (hard: 0);
#   2. the production functions (harnesses testnet/ and internal/ aside)
#      that only tests reach stay at most MAX (a ceiling, lowered as they
#      go: an API kept for tests alone is code nobody runs).
# usage: scripts/deadcode.sh DEADCODE_BIN MAX
set -eu
bin=$1
max=$2
# Functions exported to C (//export) are called from C, which deadcode
# cannot see: left out of both counts.
exported=$(grep -rhoE '^//export [A-Za-z0-9_]+' --include='*.go' . | awk '{print $2}' | paste -sd '|' -)
keep() { if [ -n "$exported" ]; then grep -Ev "func: ($exported)\$" || true; else cat; fi; }
dead=$("$bin" -test ./... | keep)
if [ -n "$dead" ]; then
	echo "deadcode: functions no program and no test reaches (remove them):"
	echo "$dead"
	exit 1
fi
only=$("$bin" ./cmd/... | keep | grep -v -e '^testnet/' -e '^internal/' || true)
n=$(printf '%s' "$only" | grep -c . || true)
echo "deadcode: 0 unreachable functions; $n production functions only tests reach (ceiling $max)"
if [ "$n" -gt "$max" ]; then
	echo "$only"
	exit 1
fi
