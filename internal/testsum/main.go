// Command testsum reads the output of `go test` (plain or -v, one package
// or many, several runs appended) and prints one line per failed test with
// its package, so a failure in a 20-minute `make test` is visible in the
// last lines of its output (scripts/test.sh runs it at the end).
//
//	FAIL github.com/neuron-tai/meshp2p/node TestModelSwitch/extras (12.31s)
//	FAIL github.com/neuron-tai/meshp2p/soak TestChurnSoak (timed out after 35m0s)
//	FAIL github.com/neuron-tai/meshp2p/engine (panic: runtime error: ...; no test named)
//
// It reads standard input or the files named as arguments, prints nothing
// when nothing failed, and exits 1 when it printed a failure, 0 otherwise.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

func main() {
	var in io.Reader = os.Stdin
	if len(os.Args) > 1 {
		var rs []io.Reader
		for _, name := range os.Args[1:] {
			f, err := os.Open(name)
			if err != nil {
				fmt.Fprintln(os.Stderr, "testsum:", err)
				os.Exit(2)
			}
			defer f.Close()
			rs = append(rs, f)
		}
		in = io.MultiReader(rs...)
	}
	lines, err := summarize(in)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	if len(lines) > 0 {
		os.Exit(1)
	}
}

var (
	// "--- FAIL: TestX/sub (1.23s)", indented four spaces per subtest level.
	failRE = regexp.MustCompile(`^\s*--- FAIL: (\S+) \(([0-9.]+s)\)`)
	// The package's closing line: "ok  \tpkg\t1.2s", "FAIL\tpkg\t1.2s",
	// "FAIL\tpkg [build failed]", "?   \tpkg\t[no test files]".
	okRE      = regexp.MustCompile(`^(ok|\?)\s+(\S+)`)
	pkgFailRE = regexp.MustCompile(`^FAIL\s+(\S+)(?:\s+(.*))?$`)
	panicRE   = regexp.MustCompile(`^panic: (.*)$`)
	timeoutRE = regexp.MustCompile(`^panic: test timed out after (\S+)`)
	// A test still running when the binary timed out: "\t\tTestX (24m59s)".
	runningRE = regexp.MustCompile(`^\t\t(\S+) \(\S+\)$`)
	fuzzInRE  = regexp.MustCompile(`Failing input written to (\S+)`)
)

// pkgState is what was seen of the package whose output is being read.
type pkgState struct {
	failed    []string // "TestX (1.2s)", in order seen
	panic     string   // the first panic's message
	timeout   string   // the duration of a test-binary timeout
	running   []string // the tests running at that timeout
	inRunning bool
	fuzzInput string
}

// summarize returns one line per failed test, per package that failed
// without naming a test, in the order the output closed them.
func summarize(r io.Reader) ([]string, error) {
	var out []string
	var st pkgState
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if st.inRunning {
			if m := runningRE.FindStringSubmatch(line); m != nil {
				st.running = append(st.running, m[1])
				continue
			}
			st.inRunning = false
		}
		switch {
		case failRE.MatchString(line):
			m := failRE.FindStringSubmatch(line)
			st.failed = append(st.failed, m[1]+" ("+m[2]+")")
		case timeoutRE.MatchString(line):
			st.timeout = timeoutRE.FindStringSubmatch(line)[1]
		case strings.TrimSpace(line) == "running tests:" && st.timeout != "":
			st.inRunning = true
		case panicRE.MatchString(line):
			if st.panic == "" {
				st.panic = panicRE.FindStringSubmatch(line)[1]
			}
		case fuzzInRE.MatchString(line):
			st.fuzzInput = fuzzInRE.FindStringSubmatch(line)[1]
		case okRE.MatchString(line):
			st = pkgState{}
		case pkgFailRE.MatchString(line):
			m := pkgFailRE.FindStringSubmatch(line)
			out = append(out, st.lines(m[1], m[2])...)
			st = pkgState{}
		}
	}
	return out, sc.Err()
}

// lines are the summary lines of a failed package; rest is what its FAIL
// line said after the name ("12.3s", "[build failed]").
func (st pkgState) lines(pkg, rest string) []string {
	var out []string
	for _, t := range st.failed {
		l := "FAIL " + pkg + " " + t
		if st.fuzzInput != "" && strings.HasPrefix(t, "Fuzz") {
			l += " input " + st.fuzzInput
		}
		out = append(out, l)
	}
	for _, t := range st.running {
		out = append(out, "FAIL "+pkg+" "+t+" (timed out after "+st.timeout+")")
	}
	switch {
	case st.timeout != "" && len(st.running) == 0:
		out = append(out, "FAIL "+pkg+" (timed out after "+st.timeout+")")
	case st.panic != "" && st.timeout == "":
		out = append(out, "FAIL "+pkg+" (panic: "+st.panic+")")
	case len(out) == 0:
		why := strings.TrimSpace(rest)
		if why == "" || !strings.HasPrefix(why, "[") {
			why = "no failing test named: see its output above"
		}
		out = append(out, "FAIL "+pkg+" "+why)
	}
	return out
}
