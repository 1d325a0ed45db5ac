package testnet_test

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/neuron-tai/meshp2p/testnet"
)

// TestMain dispatches re-executed children (testnet.StartSelf) to their
// role; the parent runs the tests.
func TestMain(m *testing.M) {
	if role := testnet.ChildRole(); role != "" {
		os.Exit(runChild(role, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// children maps a role to its main. A child prints JSON lines on stdout
// ({"event": ...}) and exits 0 when done; on failure it prints
// {"event":"error","error":...} and exits 1.
var children = map[string]func(args []string) error{
	"sleep":   childSleep,
	"observe": childObserve,
	"probe":   childProbe,
	"listen":  childListen,
	"dial":    childDial,
	"relay":   childRelay,
	"peer":    childPeer,
}

func runChild(role string, args []string) int {
	f, ok := children[role]
	if !ok {
		emit(map[string]any{"event": "error", "error": "unknown child role " + role})
		return 2
	}
	if err := f(args); err != nil {
		emit(map[string]any{"event": "error", "error": err.Error()})
		return 1
	}
	return 0
}

// emit writes one JSON line to stdout.
func emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(fmt.Sprintf(`{"event":"error","error":%q}`, err.Error()))
	}
	os.Stdout.Write(append(b, '\n'))
}
