#!/bin/sh
# make demo: a 3-node swarm on loopback serving one model split 3 ways, and
# a generation through it compared with the whole model run in-process.
#   MODEL=path.gguf make demo    use a real model instead of a synthesized one
#   PROMPT="..." TOKENS=N        what to generate
set -eu
BIN=${BIN:-bin/meshp2p}
PROMPT=${PROMPT:-Once upon a time}
TOKENS=${TOKENS:-32}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/meshp2p-demo.XXXXXX")
PIDS=""
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

if [ -z "${MODEL:-}" ]; then
	SYNTH=1
	MODEL=$WORK/demo-llama.gguf
	echo "== synthesizing a random-weight llama model (no download needed; MODEL=path.gguf for a real one)"
	$BIN shard synth --arch llama --layers 6 --embd 256 --heads 8 --kv-heads 4 --ff 768 --seed 7 --name demo-llama -o "$MODEL"
fi
NL=$($BIN shard inspect --json --no-fingerprint "$MODEL" | sed -n 's/.*"n_layer": *\([0-9]*\).*/\1/p' | head -1)
A=$((NL / 3 + (NL % 3 > 0))); B=$((A + (NL - A) / 2 + ((NL - A) % 2 > 0)))
echo "== model $MODEL: $NL layers, split 0-$A, $A-$B, $B-$NL"

common="--network demo --test-mode --port-mapping=false --listen /ip4/127.0.0.1/tcp/0"
start_node() { # dir range bootstrap
	mkdir -p "$WORK/$1"
	$BIN start $common --data-dir "$WORK/$1" --model "$MODEL" --layers "$2" ${3:+--bootstrap "$3"} >"$WORK/$1.out" 2>"$WORK/$1.log" &
	PIDS="$PIDS $!"
	i=0
	while [ ! -s "$WORK/$1/node.json" ]; do
		i=$((i + 1))
		if [ $i -gt 600 ]; then echo "node $1 did not start:"; cat "$WORK/$1.log"; exit 1; fi
		sleep 0.1
	done
	echo "   node $1 serving layers $2: $(sed -n 's/.*"peer_id": *"\([^"]*\)".*/\1/p' "$WORK/$1/node.json")"
}
first_addr() { sed -n 's/.*"\(\/ip4\/127[^"]*\/p2p\/[^"]*\)".*/\1/p' "$1" | head -1; }

echo "== starting 3 nodes on loopback"
start_node n1 "0-$A" ""
BOOT=$(first_addr "$WORK/n1/node.json")
start_node n2 "$A-$B" "$BOOT"
start_node n3 "$B-$NL" "$BOOT"

echo "== reference: whole model in-process (--local)"
$BIN generate --local --model "$MODEL" --prompt "$PROMPT" --max-tokens "$TOKENS" --json >"$WORK/local.json"
echo "== generating through the swarm (thin client: no weights, vocabulary fetched from a peer)"
[ -n "${SYNTH:-}" ] && echo "   (random weights: expect gibberish text; the point is that it equals the whole model's)"
NAME=$(sed -n 's/.*"model": *"\([^"]*\)".*/\1/p' "$WORK/n1/node.json")
$BIN generate $common --bootstrap "$BOOT" --model "$NAME" --prompt "$PROMPT" --max-tokens "$TOKENS" --wait 60s
$BIN generate $common --bootstrap "$BOOT" --model "$NAME" --prompt "$PROMPT" --max-tokens "$TOKENS" --wait 60s --json >"$WORK/swarm.json" 2>"$WORK/swarm.log"
l=$(tr -d ' \n' <"$WORK/local.json" | sed -n 's/.*"tokens":\[\([^]]*\)\].*/\1/p')
s=$(tr -d ' \n' <"$WORK/swarm.json" | sed -n 's/.*"tokens":\[\([^]]*\)\].*/\1/p')
if [ -n "$l" ] && [ "$l" = "$s" ]; then
	echo "== OK: the swarm's tokens are identical to the whole model's ($(echo "$l" | tr ',' '\n' | wc -l) tokens)"
else
	echo "== MISMATCH: local [$l] swarm [$s]"
	exit 1
fi
