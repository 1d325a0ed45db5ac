#!/bin/sh
# Installs Debian's chromium for the dashboard's browser test
# (dashboard/browser_test.go drives it headless through the DevTools
# protocol). Run by `make deps`. Does nothing when chromium is already
# there; without root it only says what is missing (the test then skips
# with that message).
set -eu
for b in chromium chromium-browser google-chrome; do
	if command -v "$b" >/dev/null 2>&1; then
		exit 0
	fi
done
if [ "$(id -u)" != 0 ]; then
	echo "browser-deps: chromium is not installed and this is not root; the browser test will skip (apt-get install chromium)" >&2
	exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# A failed install must not fail `make deps`: the browser test then skips,
# naming what is missing.
if apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; then
	echo "browser-deps: installed $(chromium --version 2>/dev/null || echo chromium)"
else
	echo "browser-deps: could not install chromium (apt-get failed); the browser test will skip" >&2
fi
