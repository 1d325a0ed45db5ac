package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// router-rules prints the namespace routers' rules for the interfaces that
// hold the given addresses (here loopback for both sides), and refuses
// bad input with a usage error.
func TestTestnetRouterRules(t *testing.T) {
	var o, e bytes.Buffer
	if err := runTestnet(context.Background(), &o, &e, []string{"router-rules", "--lan", "127.0.0.0/8", "--wan", "127.0.0.1/32"}); err != nil {
		t.Fatalf("%v: %s", err, e.String())
	}
	for _, w := range []string{":FORWARD DROP", "-A INPUT -i lo -j DROP\n", "-A POSTROUTING -s 127.0.0.0/8 -o lo -j MASQUERADE\n", "COMMIT\n"} {
		if !strings.Contains(o.String(), w) {
			t.Errorf("rules lack %q:\n%s", w, o.String())
		}
	}
	o.Reset()
	if err := runTestnet(context.Background(), &o, &e, []string{"router-rules", "--lan", "127.0.0.0/8", "--wan", "127.0.0.0/8", "--nat", "symmetric", "--open-firewall"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(o.String(), "MASQUERADE --random-fully") || strings.Contains(o.String(), "DROP") {
		t.Errorf("symmetric, open firewall:\n%s", o.String())
	}
	for _, tc := range []struct {
		args  []string
		usage bool
	}{
		{[]string{"--wan", "127.0.0.0/8"}, true},
		{[]string{"--lan", "10.0.0.300/24", "--wan", "127.0.0.0/8"}, true},
		{[]string{"--lan", "127.0.0.0/8", "--wan", "127.0.0.0/8", "--nat", "full-cone"}, true},
		{[]string{"--lan", "127.0.0.0/8", "--wan", "127.0.0.0/8", "extra"}, true},
		{[]string{"--lan", "240.0.0.0/24", "--wan", "127.0.0.0/8"}, false}, // no such interface
	} {
		err := runTestnet(context.Background(), &o, &e, append([]string{"router-rules"}, tc.args...))
		if err == nil || errors.Is(err, errUsage) != tc.usage {
			t.Errorf("%q: err %v, want usage error %v", tc.args, err, tc.usage)
		}
	}
}
