package main

import (
	"slices"
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	const pkgA = "github.com/neuron-tai/meshp2p/a"
	for _, tc := range []struct {
		name string
		in   string
		want []string
	}{
		{"all passed", "ok  \t" + pkgA + "\t1.2s\n?   \tgithub.com/x/b\t[no test files]\n", nil},
		{
			"failed tests and subtests",
			"ok  \tgithub.com/x/b\t0.1s\n" +
				"--- FAIL: TestHeal (12.31s)\n" +
				"    --- FAIL: TestHeal/five_nodes,_two_killed (12.30s)\n" +
				"        heal_test.go:80: boom\n" +
				"--- FAIL: TestOther (0.00s)\n" +
				"FAIL\n" +
				"FAIL\t" + pkgA + "\t13.0s\n" +
				"ok  \tgithub.com/x/c\t0.1s\nFAIL\n",
			[]string{
				"FAIL " + pkgA + " TestHeal (12.31s)",
				"FAIL " + pkgA + " TestHeal/five_nodes,_two_killed (12.30s)",
				"FAIL " + pkgA + " TestOther (0.00s)",
			},
		},
		{
			"verbose output",
			"=== RUN   TestChurnSoak\n    soak_test.go:1: lost 1\n--- FAIL: TestChurnSoak (300.00s)\nFAIL\nFAIL\tgithub.com/x/soak\t301.2s\nFAIL\n",
			[]string{"FAIL github.com/x/soak TestChurnSoak (300.00s)"},
		},
		{
			"timeout names the running tests",
			"panic: test timed out after 25m0s\n\trunning tests:\n\t\tTestA (24m59s)\n\t\tTestB/sub (3m0s)\n\ngoroutine 1 [running]:\nFAIL\t" + pkgA + "\t1500.1s\n",
			[]string{"FAIL " + pkgA + " TestA (timed out after 25m0s)", "FAIL " + pkgA + " TestB/sub (timed out after 25m0s)"},
		},
		{
			"panic in a test",
			"--- FAIL: TestNil (0.01s)\npanic: runtime error: invalid memory address or nil pointer dereference [recovered]\n\tpanic: x\nFAIL\t" + pkgA + "\t0.3s\n",
			[]string{"FAIL " + pkgA + " TestNil (0.01s)", "FAIL " + pkgA + " (panic: runtime error: invalid memory address or nil pointer dereference [recovered])"},
		},
		{
			"build failure",
			"# " + pkgA + "\na.go:1: syntax error\nFAIL\t" + pkgA + " [build failed]\n",
			[]string{"FAIL " + pkgA + " [build failed]"},
		},
		{
			"failure with no test named (TestMain exit)",
			"some output\nFAIL\t" + pkgA + "\t0.2s\n",
			[]string{"FAIL " + pkgA + " no failing test named: see its output above"},
		},
		{
			"fuzz failure names the input",
			"--- FAIL: FuzzFrame (1.20s)\n    --- FAIL: FuzzFrame (0.00s)\n        frame_test.go:9: bad\n    Failing input written to testdata/fuzz/FuzzFrame/abc123\nFAIL\nexit status 1\nFAIL\t" + pkgA + "\t1.3s\n",
			[]string{"FAIL " + pkgA + " FuzzFrame (1.20s) input testdata/fuzz/FuzzFrame/abc123", "FAIL " + pkgA + " FuzzFrame (0.00s) input testdata/fuzz/FuzzFrame/abc123"},
		},
		{
			"a passing package after a failure starts clean",
			"--- FAIL: TestX (0.00s)\nFAIL\t" + pkgA + "\t0.1s\n--- FAIL: TestY (0.00s)\n--- PASS: TestY (0.00s)\nok  \tgithub.com/x/b\t0.1s\n",
			[]string{"FAIL " + pkgA + " TestX (0.00s)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := summarize(strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
