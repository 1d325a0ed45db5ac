#!/bin/sh
# testnet.sh: the container testnet (docker-compose.yml next to this file).
#
#   testnet.sh up       clean up a previous run, start dockerd if none runs
#                       (testnet/docker/dockerd.sh), build the image, start
#                       relay, routers, a, b and wait until all are healthy
#   testnet.sh check    generate through the NATed nodes (client behind
#                       router 1), compare with --local, require the home-to-
#                       home seam (a -> b) to be hole-punched (path=direct)
#   testnet.sh scale N  N nodes behind router 2 (docker-compose --scale
#                       node=N): each chooses its own layers within its
#                       mem_limit (NODE_MEM), or serves NODE_LAYERS
#   testnet.sh fit      a model bigger than one container's memory limit:
#                       OOM-killed whole in one limited container, served by
#                       three limited containers, output equal to --local
#   testnet.sh compose ARGS...   docker-compose with this testnet's settings
#   testnet.sh down     remove every container, network, volume and image of
#                       it, stop the dockerd it started, and compare the
#                       host's network state with the one before `up`
#
# Environment: MESHP2P_BIN (default bin/meshp2p), MESHP2P_MODELS (default
# models/, the committed stories260K.gguf: 5 layers, as the compose file
# splits them), MESHP2P_MODEL (stories260K.gguf), MESHP2P_COMPOSE_STATE
# (default /tmp/meshp2p-compose), MESHP2P_IMAGE (meshp2p:testnet), FIT_MEM
# (200m), MESHP2P_TOKENS (24), MESHP2P_FIT_TOKENS (MESHP2P_TOKENS).
# Exit status 3: Docker cannot run here (the message says why).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN=${MESHP2P_BIN:-$repo/bin/meshp2p}
export MESHP2P_MODELS=${MESHP2P_MODELS:-$repo/models}
export MESHP2P_MODEL=${MESHP2P_MODEL:-stories260K.gguf}
export MESHP2P_STATE=${MESHP2P_COMPOSE_STATE:-/tmp/meshp2p-compose}
export MESHP2P_IMAGE=${MESHP2P_IMAGE:-meshp2p:testnet}
export FIT_MEM=${FIT_MEM:-200m}
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-meshp2p}
export DOCKER_BUILDKIT=0
# The dockerd this testnet starts (if none runs) is recorded in its own state
# directory: `down` (and the next `up` after an interrupted run) stops that
# one only, never a daemon another testnet or the system started.
export MESHP2P_DOCKERD_PIDFILE="$MESHP2P_STATE/dockerd.pid" MESHP2P_DOCKERD_LOG="$MESHP2P_STATE/dockerd.log"
PROMPT="Once upon a time"
TOKENS=${MESHP2P_TOKENS:-24}
FIT_TOKENS=${MESHP2P_FIT_TOKENS:-$TOKENS}

dc() {
	if [ -f "$MESHP2P_STATE/relay.id" ]; then
		MESHP2P_RELAY_ID=$(cat "$MESHP2P_STATE/relay.id")
		export MESHP2P_RELAY_ID
	fi
	if command -v docker-compose >/dev/null 2>&1; then
		docker-compose -f "$here/docker-compose.yml" "$@"
	else
		docker compose -f "$here/docker-compose.yml" "$@"
	fi
}

# wait_healthy SERVICE...: until docker reports every container of each
# one healthy (120 s each).
wait_healthy() {
	for s in "$@"; do
		ids=$(dc --profile scale --profile fit ps -q "$s")
		[ -n "$ids" ] || { echo "testnet.sh: $s has no container" >&2; return 1; }
		for id in $ids; do
			i=0
			while :; do
				st=$(docker inspect -f '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$id")
				case "$st" in
				"running healthy") break ;;
				exited* | dead*)
					echo "testnet.sh: $s stopped ($st):" >&2
					docker logs --tail 20 "$id" >&2 || true
					return 1
					;;
				esac
				i=$((i + 1))
				if [ $i -gt 600 ]; then
					echo "testnet.sh: $s not healthy after 120 s ($st)" >&2
					docker logs --tail 20 "$id" >&2 || true
					return 1
				fi
				sleep 0.2
			done
		done
	done
}

# tokens FILE: the "tokens" array of a generate --json output, one line.
tokens() { tr -d ' \n' <"$1" | grep -o '"tokens":\[[^]]*\]'; }

# tps FILE: decode tokens per second of a generate --json output.
tps() { tr -d ' \n' <"$1" | grep -o '"ms_per_token":[0-9.]*' | awk -F: '$2 > 0 {printf "%.1f", 1000 / $2}'; }

cmd_up() {
	cmd_down quiet
	mkdir -p "$MESHP2P_STATE/relay"
	sh "$repo/testnet/docker/dockerd.sh" snapshot >"$MESHP2P_STATE/host.before"
	rc=0
	sh "$repo/testnet/docker/dockerd.sh" start || rc=$?
	[ $rc = 0 ] || exit $rc
	sh "$repo/testnet/docker/image.sh" "$BIN" "$MESHP2P_IMAGE" || exit $?
	[ -f "$MESHP2P_MODELS/$MESHP2P_MODEL" ] || { echo "testnet.sh: no model $MESHP2P_MODELS/$MESHP2P_MODEL" >&2; exit 1; }
	"$BIN" key show --data-dir "$MESHP2P_STATE/relay" 2>/dev/null >"$MESHP2P_STATE/relay.id"
	rm -f "$MESHP2P_STATE/relay/node.json"
	dc up -d relay router1 router2 a b
	wait_healthy relay router1 router2 a b
	echo "testnet.sh: up: relay $(cat "$MESHP2P_STATE/relay.id") at 198.51.100.10, a behind router1, b behind router2"
}

cmd_check() {
	"$BIN" generate --local --model "$MESHP2P_MODELS/$MESHP2P_MODEL" --prompt "$PROMPT" --max-tokens "$TOKENS" --json >"$MESHP2P_STATE/local.json"
	dc run --rm -T client generate --model "${MESHP2P_MODEL%.gguf}" --prompt "$PROMPT" --max-tokens "$TOKENS" --json \
		--reachability private --dht-mode client --wait 45s >"$MESHP2P_STATE/swarm.json"
	want=$(tokens "$MESHP2P_STATE/local.json")
	got=$(tokens "$MESHP2P_STATE/swarm.json")
	if [ -z "$got" ] || [ "$got" != "$want" ]; then
		echo "testnet.sh: check FAILED: swarm $got, local $want" >&2
		exit 1
	fi
	seam=$(dc logs --no-color a | grep "seam to next hop open" | tail -1)
	case "$seam" in
	*path=direct*) ;;
	*)
		echo "testnet.sh: check FAILED: the seam a -> b (home 1 -> home 2) is not direct: $seam" >&2
		exit 1
		;;
	esac
	echo "testnet.sh: check ok: $TOKENS tokens through relay -> a (NAT 1) -> b (NAT 2) equal --local; seam a -> b hole-punched:"
	echo "  $seam"
}

cmd_fit() {
	fit=$MESHP2P_STATE/fit
	if [ ! -f "$fit/shards/fit.L4-6.gguf" ]; then
		mkdir -p "$fit/shards"
		# 6 layers, ~260 MiB of f32 weights: bigger than FIT_MEM (200m).
		"$BIN" shard synth --arch llama --layers 6 --embd 1024 --ff 2304 --heads 8 --kv-heads 8 --name fit -o "$fit/fit.gguf" >/dev/null 2>&1
		"$BIN" shard split "$fit/fit.gguf" --ranges 0-2,2-4,4-6 -o "$fit/shards" >/dev/null 2>&1
	fi
	size=$(wc -c <"$fit/fit.gguf")
	echo "testnet.sh: fit: model $(echo "$size" | awk '{printf "%.1f", $1 / 1048576}') MiB, limit $FIT_MEM per container"
	dc rm -fsv fitwhole >/dev/null 2>&1 || true
	rc=0
	dc --profile fit run --name meshp2p-fitwhole -T fitwhole >/dev/null 2>&1 || rc=$?
	oom=$(docker inspect -f '{{.State.OOMKilled}}' meshp2p-fitwhole 2>/dev/null || echo unknown)
	docker rm -f meshp2p-fitwhole >/dev/null 2>&1 || true
	if [ "$oom" != true ]; then
		echo "testnet.sh: fit FAILED: the whole model in one $FIT_MEM container was not OOM-killed (exit $rc, OOMKilled=$oom)" >&2
		exit 1
	fi
	echo "testnet.sh: fit: whole model in one $FIT_MEM container: OOM-killed (exit $rc)"
	dc --profile fit up -d fit1 fit2 fit3
	wait_healthy fit1 fit2 fit3
	"$BIN" generate --local --model "$fit/fit.gguf" --prompt "$PROMPT" --max-tokens "$FIT_TOKENS" --json >"$MESHP2P_STATE/fit-local.json"
	dc run --rm -T client generate --model fit --prompt "$PROMPT" --max-tokens "$FIT_TOKENS" --json \
		--reachability private --dht-mode client --wait 45s >"$MESHP2P_STATE/fit-swarm.json"
	want=$(tokens "$MESHP2P_STATE/fit-local.json")
	got=$(tokens "$MESHP2P_STATE/fit-swarm.json")
	if [ -z "$got" ] || [ "$got" != "$want" ]; then
		echo "testnet.sh: fit FAILED: swarm $got, local $want" >&2
		exit 1
	fi
	for s in fit1 fit2 fit3; do
		id=$(dc --profile fit ps -q "$s")
		peak=$(docker exec "$id" cat /sys/fs/cgroup/memory/memory.max_usage_in_bytes 2>/dev/null || docker exec "$id" cat /sys/fs/cgroup/memory.peak 2>/dev/null || echo 0)
		echo "testnet.sh: fit: $s peak memory $((peak / 1048576)) MiB of $FIT_MEM"
	done
	echo "testnet.sh: fit ok: $FIT_TOKENS tokens equal --local (outside the limits); $(tps "$MESHP2P_STATE/fit-swarm.json") tokens/s across fit1..fit3, $(tps "$MESHP2P_STATE/fit-local.json") tokens/s --local"
}

cmd_down() {
	# After a run whose dockerd died (killed with the terminal, a crash),
	# start one to remove what it still knows about.
	if [ -f "$MESHP2P_STATE/host.before" ] && ! docker version >/dev/null 2>&1; then
		sh "$repo/testnet/docker/dockerd.sh" start >/dev/null 2>&1 || true
	fi
	if docker version >/dev/null 2>&1; then
		dc --profile fit --profile tools --profile scale down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true
		docker rm -f meshp2p-fitwhole >/dev/null 2>&1 || true
		docker image rm -f "$MESHP2P_IMAGE" >/dev/null 2>&1 || true
	fi
	sh "$repo/testnet/docker/dockerd.sh" stop
	if [ -f "$MESHP2P_STATE/host.before" ]; then
		# Links a killed dockerd left half made (a veth pair still on the
		# host, a network bridge): Docker's names, not there before up.
		for l in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//'); do
			case "$l" in
			veth* | br-*) grep -q "^$l " "$MESHP2P_STATE/host.before" || ip link del "$l" 2>/dev/null || true ;;
			esac
		done
		sh "$repo/testnet/docker/dockerd.sh" snapshot >"$MESHP2P_STATE/host.after"
		if ! diff "$MESHP2P_STATE/host.before" "$MESHP2P_STATE/host.after" >&2; then
			echo "testnet.sh: the host's network state differs from before up (above)" >&2
			return 1
		fi
		[ "${1:-}" = quiet ] || echo "testnet.sh: down: host iptables, ip_forward, links, addresses and routes as before up"
	fi
	rm -rf "$MESHP2P_STATE"
}

# scale N: N more nodes behind router 2 (self-placing, or NODE_LAYERS).
cmd_scale() {
	dc --profile scale up -d --scale node="${1:?usage: testnet.sh scale N}" node
	wait_healthy node
}

case "${1:-}" in
up) cmd_up ;;
scale) cmd_scale "${2:-}" ;;
check) cmd_check ;;
fit) cmd_fit ;;
down) cmd_down ;;
compose)
	shift
	dc "$@"
	;;
*)
	echo "usage: $0 up|check|scale N|fit|down|compose ARGS..." >&2
	exit 2
	;;
esac
