#!/bin/sh
# dockerd.sh: Docker for the container testnet, without touching the host's
# network (so it cannot disturb the namespace NAT tests).
#
#   dockerd.sh install   apt-get install docker.io docker-compose when missing
#                        (root with apt-get only; otherwise says so, exits 0)
#   dockerd.sh start     start dockerd only if none answers; ours runs with
#                        --iptables=false --ip-forward=false --bridge=none, so
#                        it changes no iptables rule, no ip_forward and makes
#                        no docker0; it runs in its own session and writes
#                        its PID to $PIDFILE
#   dockerd.sh stop      stop the daemon `start` started (by that PID, and
#                        only if /proc/PID is still that dockerd); a daemon
#                        we did not start is left alone
#   dockerd.sh snapshot  the host state the testnet must not change:
#                        iptables-save and ip6tables-save (counters
#                        stripped), IPv4/IPv6 forwarding, the bridge-netfilter
#                        sysctls, links, addresses and routes
#
# Exit status of start: 0 ready, 3 docker unavailable here (not root, not
# installed, daemon failed): callers skip with the message printed.
set -eu

PIDFILE=${MESHP2P_DOCKERD_PIDFILE:-/run/meshp2p-dockerd.pid}
LOG=${MESHP2P_DOCKERD_LOG:-/run/meshp2p-dockerd.log}

running() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

cmd_install() {
	missing=""
	command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
	command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || missing="$missing docker-compose"
	[ -z "$missing" ] && return 0
	if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		echo "testnet/docker/dockerd.sh: missing:$missing (not root or no apt-get: not installing; the container test will skip)" >&2
		return 0
	fi
	echo "testnet/docker/dockerd.sh: installing$missing" >&2
	export DEBIAN_FRONTEND=noninteractive
	# Debian's policy-rc.d keeps the package from starting a daemon here.
	# A failed install is not fatal: the container test then skips.
	# shellcheck disable=SC2086
	if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null; }; then
		echo "testnet/docker/dockerd.sh: installing$missing failed; the container test will skip" >&2
	fi
}

cmd_start() {
	if running; then
		echo "dockerd.sh: a docker daemon is already running (not ours; left alone)" >&2
		return 0
	fi
	if ! command -v dockerd >/dev/null 2>&1; then
		echo "dockerd.sh: dockerd is not installed (make deps installs it as root)" >&2
		return 3
	fi
	if [ "$(id -u)" != 0 ]; then
		echo "dockerd.sh: no docker daemon answers and starting one needs root" >&2
		return 3
	fi
	# Its own session, so a Ctrl-C (or kill) of the make or test that
	# started it cannot kill it halfway through creating a container; it
	# writes its own PID to $PIDFILE.
	rm -f "$PIDFILE"
	setsid dockerd --iptables=false --ip-forward=false --ip-masq=false --bridge=none \
		--userland-proxy=true --pidfile "$PIDFILE" </dev/null >"$LOG" 2>&1 &
	spawned=$!
	i=0
	while ! running; do
		i=$((i + 1))
		if [ $i -gt 150 ] || { [ ! -f "$PIDFILE" ] && ! kill -0 "$spawned" 2>/dev/null; }; then
			echo "dockerd.sh: dockerd did not come up (log $LOG):" >&2
			tail -5 "$LOG" >&2 || true
			cmd_stop
			return 3
		fi
		sleep 0.2
	done
	echo "dockerd.sh: started dockerd pid $(cat "$PIDFILE")" >&2
}

cmd_stop() {
	[ -f "$PIDFILE" ] || return 0
	pid=$(cat "$PIDFILE")
	[ -n "$pid" ] || { rm -f "$PIDFILE"; return 0; }
	case "$(cat "/proc/$pid/comm" 2>/dev/null || true)" in
	dockerd)
		kill "$pid"
		i=0
		while [ -d "/proc/$pid" ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i + 1)); done
		[ -d "/proc/$pid" ] && kill -9 "$pid"
		echo "dockerd.sh: stopped dockerd pid $pid" >&2
		;;
	esac
	rm -f "$PIDFILE"
}

cmd_snapshot() {
	echo "## iptables-save"
	iptables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' || true
	echo "## ip6tables-save"
	ip6tables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' || true
	echo "## ip_forward $(cat /proc/sys/net/ipv4/ip_forward) ipv6 forwarding $(cat /proc/sys/net/ipv6/conf/all/forwarding 2>/dev/null)"
	for f in /proc/sys/net/bridge/bridge-nf-call-iptables /proc/sys/net/bridge/bridge-nf-call-ip6tables; do
		[ -f "$f" ] && echo "## $f $(cat "$f")"
	done
	echo "## links"
	ip -br link | awk '{print $1, $3}'
	echo "## addresses"
	ip -br addr
	echo "## routes"
	ip route
	ip -6 route | sed 's/ expires [0-9]*sec//'
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
snapshot) cmd_snapshot ;;
*)
	echo "usage: $0 install|start|stop|snapshot" >&2
	exit 2
	;;
esac
