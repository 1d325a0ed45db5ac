#!/bin/sh
# deps.sh installs what the namespace test network needs: iproute2 (ip netns)
# and iptables (NAT + router firewall inside the router namespaces).
#
# It only installs when run as root and a tool is missing; otherwise it does
# nothing (the tests then skip with a clear message). Safe to call from
# `make test` every time.
#
# iptables backend: Debian's default `iptables` is iptables-nft (the nf_tables
# backend, "iptables v1.8.x (nf_tables)"). The testnet uses whatever
# `iptables` resolves to; the nft backend is what it was measured with and is
# what this script leaves in place (no update-alternatives change).
set -eu

missing=""
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"

if [ -z "$missing" ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "testnet/deps.sh: missing:$missing (not root: not installing; namespace tests will skip)" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "testnet/deps.sh: missing:$missing and no apt-get; namespace tests will skip" >&2
	exit 0
fi
echo "testnet/deps.sh: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
