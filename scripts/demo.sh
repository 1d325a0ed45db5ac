#!/bin/sh
# make demo: three nodes on this machine serve one model split three ways, a
# thin client (no weights) generates through them, and the tokens are checked
# against the whole model run in-process (--local).
#
# Nodes and client are started exactly as the README tells users to, with
# normal flags only: a loopback listen address and no UPnP, so the demo
# touches neither the network nor the router.
#
#   MODEL=path.gguf make demo    any other GGUF model (default: models/stories260K.gguf)
#   PROMPT="..." TOKENS=N        what to generate
#   WAIT=15s                     how long the client looks for the swarm
set -eu
BIN=${BIN:-bin/meshp2p}
MODEL=${MODEL:-models/stories260K.gguf}
PROMPT=${PROMPT:-Once upon a time}
TOKENS=${TOKENS:-57} # 57: the end of the first paragraph of the default story
WAIT=${WAIT:-15s}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/meshp2p-demo.XXXXXX")
PIDS=""
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ ! -f "$MODEL" ]; then
	echo "demo: model $MODEL not found (MODEL=path.gguf make demo)" >&2
	exit 1
fi
NL=$($BIN shard inspect --json --no-fingerprint "$MODEL" | sed -n 's/.*"n_layer": *\([0-9]*\).*/\1/p' | head -1)
if [ -z "$NL" ] || [ "$NL" -lt 3 ]; then
	echo "demo: $MODEL has ${NL:-no} layers; the demo splits a model three ways" >&2
	exit 1
fi
A=$((NL / 3 + (NL % 3 > 0))); B=$((A + (NL - A) / 2 + ((NL - A) % 2 > 0)))
echo "== model $MODEL: $NL layers, split 0-$A, $A-$B, $B-$NL"

# The flags a user adds for a swarm on one machine (see "Use it" in docs/reference.md).
net="--network demo --listen /ip4/127.0.0.1/tcp/0 --port-mapping=false"

peer_of() { sed -n 's/.*"peer_id": *"\([^"]*\)".*/\1/p' "$WORK/$1/node.json"; }
first_addr() { sed -n 's/.*"\(\/ip4\/127[^"]*\/p2p\/[^"]*\)".*/\1/p' "$1" | head -1; }
short() { printf '…%s' "$(printf %s "$1" | tail -c 8)"; }

start_node() { # name range [bootstrap]
	mkdir -p "$WORK/$1"
	echo "   $BIN start $net --model $MODEL --layers $2${3:+ --bootstrap <n1>}"
	$BIN start $net --data-dir "$WORK/$1" --model "$MODEL" --layers "$2" ${3:+--bootstrap "$3"} >"$WORK/$1.out" 2>"$WORK/$1.log" &
	PIDS="$PIDS $!"
	i=0
	while [ ! -s "$WORK/$1/node.json" ]; do
		i=$((i + 1))
		if [ $i -gt 600 ]; then echo "node $1 did not start:"; cat "$WORK/$1.log"; exit 1; fi
		sleep 0.1
	done
	echo "   $1 serves layers $2 as $(short "$(peer_of "$1")")"
}

echo "== starting 3 nodes"
start_node n1 "0-$A" ""
BOOT=$(first_addr "$WORK/n1/node.json")
start_node n2 "$A-$B" "$BOOT"
start_node n3 "$B-$NL" "$BOOT"
NAME=$(sed -n 's/.*"model": *"\([^"]*\)".*/\1/p' "$WORK/n1/node.json" | head -1)

echo "== reference: the whole model in this process"
echo "   $BIN generate --local --model $MODEL --prompt \"$PROMPT\" --max-tokens $TOKENS"
$BIN generate --local --model "$MODEL" --prompt "$PROMPT" --max-tokens "$TOKENS" --json >"$WORK/local.json"

echo "== generating through the swarm (a thin client: no weights, vocabulary fetched from a peer)"
echo "   $BIN generate $net --bootstrap <n1> --model $NAME --prompt \"$PROMPT\" --max-tokens $TOKENS --wait $WAIT"
if ! $BIN generate $net --bootstrap "$BOOT" --model "$NAME" --prompt "$PROMPT" --max-tokens "$TOKENS" \
	--wait "$WAIT" --json >"$WORK/swarm.json" 2>"$WORK/swarm.log"; then
	echo "== FAILED: the client did not generate through the swarm within $WAIT:"
	sed 's/^/   /' "$WORK/swarm.log"
	for n in n1 n2 n3; do echo "   -- $n log (last lines):"; tail -5 "$WORK/$n.log" | sed 's/^/      /'; done
	exit 1
fi

# Fields of the indented JSON that generate --json prints.
field() { sed -n "s/^  \"$1\": *\"*\([^\",]*\)\"*,*\$/\1/p" "$2" | head -1; }
tokens() { tr -d ' \n' <"$1" | sed -n 's/.*"tokens":\[\([^]]*\)\].*/\1/p'; }
text() { # the "text" string, JSON escapes undone
	sed -n 's/^  "text": "\(.*\)",$/\1/p' "$1" |
		sed -e 's/\\\\/\x01/g' -e 's/\\"/"/g' -e 's/\\n/\n/g' -e 's/\\t/\t/g' -e 's/\\r//g' \
			-e 's/\\u003c/</g' -e 's/\\u003e/>/g' -e 's/\\u0026/\&/g' -e 's/\x01/\\/g'
}
route() { # one line per hop: peer start end reach
	awk '/^  "route": \[/ { in_r = 1; next }
		in_r && /^  \]/ { exit }
		in_r && /"peer":/ { gsub(/[",]/, "", $2); p = $2 }
		in_r && /"start":/ { gsub(/,/, "", $2); s = $2 }
		in_r && /"end":/ { gsub(/,/, "", $2); e = $2 }
		in_r && /"reach":/ { gsub(/[",]/, "", $2); r = $2 }
		in_r && /^    }/ { print p, s, e, r; r = "" }' "$1"
}
name_of() { for n in n1 n2 n3; do [ "$(peer_of $n)" = "$1" ] && { echo "$n"; return; }; done; echo "?"; }

echo
printf '%s' "$PROMPT"
text "$WORK/swarm.json"
echo
echo "== route"
route "$WORK/swarm.json" | while read -r p s e r; do
	echo "   layers $s-$e on $(name_of "$p") ($(short "$p"), ${r:-direct})"
done
echo "$(field ttft_ms "$WORK/swarm.json") $(field ms_per_token "$WORK/swarm.json") $(field reroutes "$WORK/swarm.json")" |
	awk '{ printf "   first token after %.1f ms, then %.2f ms/token; %d reroutes\n", $1, $2, $3 }'

l=$(tokens "$WORK/local.json")
s=$(tokens "$WORK/swarm.json")
if [ -n "$l" ] && [ "$l" = "$s" ]; then
	echo "== OK: the swarm's $(echo "$l" | tr ',' '\n' | wc -l) tokens are identical to the whole model's (--local)"
else
	echo "== MISMATCH: the swarm's tokens differ from the whole model's (--local)"
	echo "   local: [$l]"
	echo "   swarm: [$s]"
	echo "   local text: $PROMPT$(text "$WORK/local.json")"
	exit 1
fi
