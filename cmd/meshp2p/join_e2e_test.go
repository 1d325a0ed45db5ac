package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// joinRun is TestJoinToken's swarm: real meshp2p processes on loopback,
// every byte they print kept, to look for the token in.
type joinRun struct {
	t     *testing.T
	bin   string
	dir   string
	procs []*bgProc
	seen  []*syncBuf // everything the processes printed
}

// cli runs meshp2p to its end with env added; it returns stdout, stderr
// and the exit status.
func (r *joinRun) cli(env []string, args ...string) (string, string, int) {
	r.t.Helper()
	c := exec.Command(r.bin, args...)
	c.Env = append(append(os.Environ(), joinEnv+"="), env...)
	out, errb := &syncBuf{}, &syncBuf{}
	c.Stdout, c.Stderr = out, errb
	r.seen = append(r.seen, out, errb)
	done := make(chan error, 1)
	if err := c.Start(); err != nil {
		r.t.Fatal(err)
	}
	go func() { done <- c.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		_ = c.Process.Kill() // ours, by PID
		r.t.Fatalf("meshp2p %s: still running after 2 min\n%s", args[0], errb.String())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errb.String(), ee.ExitCode()
	} else if err != nil {
		r.t.Fatal(err)
	}
	return out.String(), errb.String(), 0
}

// start runs meshp2p start in the background until its "ready" line;
// debug logging (-v), so the test sees everything it could log.
func (r *joinRun) start(args ...string) string {
	r.t.Helper()
	c := exec.Command(r.bin, append([]string{"start", "-v", "--test-mode", "--threads", "1"}, args...)...)
	c.Env = append(os.Environ(), joinEnv+"=")
	out, errb := &syncBuf{}, &syncBuf{}
	c.Stdout, c.Stderr = out, errb
	r.seen = append(r.seen, out, errb)
	if err := c.Start(); err != nil {
		r.t.Fatal(err)
	}
	p := &bgProc{cmd: c, done: make(chan struct{})}
	go func() { _ = c.Wait(); close(p.done) }()
	r.procs = append(r.procs, p)
	ready := regexp.MustCompile(`(?m)^ready`)
	for deadline := time.Now().Add(90 * time.Second); !ready.MatchString(out.String()); time.Sleep(50 * time.Millisecond) {
		select {
		case <-p.done:
			r.t.Fatalf("start %q exited:\n%s\n%s", args, out.String(), errb.String())
		default:
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("start %q: not ready\n%s\n%s", args, out.String(), errb.String())
		}
	}
	return out.String()
}

func (r *joinRun) stop() {
	for _, p := range r.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM) // ours, by PID
	}
	for _, p := range r.procs {
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// Issue 41 item 3: node A starts with a swarm key; meshp2p invite makes
// a token from A's data dir; node B joins with start --join TOKEN alone,
// and generate --join (the token in a file), status ($MESHP2P_JOIN) and
// a host:port bootstrap all reach the swarm, generate writing what
// --local writes. Conflicting or damaged input is a usage error, and the
// token appears in no output but invite's stdout: not in A's or B's
// debug logs, not in any error.
func TestJoinToken(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a swarm of processes")
	}
	model := testmodels.Path(t, "stories260K.gguf")
	r := &joinRun{t: t, bin: testbin.CLI(t), dir: t.TempDir()}
	defer r.stop()
	key := filepath.Join(r.dir, "swarm.key")
	if _, errs, code := r.cli(nil, "key", "swarm-gen", "-o", key); code != 0 {
		t.Fatalf("swarm-gen: %s", errs)
	}
	portA, portB := strconv.Itoa(freePort(t)), strconv.Itoa(freePort(t))
	dirA := filepath.Join(r.dir, "a")
	outA := r.start("--model", model, "--layers", "0-3", "--network", "joinnet", "--swarm-key", key,
		"--listen", "/ip4/127.0.0.1/tcp/"+portA, "--data-dir", dirA)
	if !strings.Contains(outA, "to join: run 'meshp2p invite --data-dir "+dirA+"' here") {
		t.Fatalf("start printed no join line:\n%s", outA)
	}
	began := time.Now()
	token, errs, code := r.cli(nil, "invite", "--data-dir", dirA)
	token = strings.TrimSpace(token)
	if code != 0 || !strings.HasPrefix(token, "mp1_") || !strings.Contains(errs, "SECRET") || !strings.Contains(errs, "TCP port "+portA) {
		t.Fatalf("invite: exit %d, stdout %q, stderr %q", code, token, errs)
	}
	t.Logf("invite: %d-character token in %v", len(token), time.Since(began).Round(time.Millisecond))
	tokFile := filepath.Join(r.dir, "join.token")
	if _, errs, code := r.cli(nil, "invite", "--data-dir", dirA, "-o", tokFile); code != 0 {
		t.Fatalf("invite -o: %s", errs)
	}
	if st, err := os.Stat(tokFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("invite -o wrote %v (%v), want mode 0600", st, err)
	}
	api := "127.0.0.1:" + strconv.Itoa(freePort(t))
	dirB := filepath.Join(r.dir, "b")
	outB := r.start("--model", model, "--layers", "3-5", "--join", token, "--listen", "/ip4/127.0.0.1/tcp/"+portB, "--data-dir", dirB, "--api", api)
	if !strings.Contains(outB, "to join: run 'meshp2p invite --data-dir "+dirB+" --join TOKEN' (TOKEN: the one this node joined with)") {
		t.Fatalf("B (joined by token) printed no join line naming --join:\n%s", outB)
	}
	// B has no key file: invite needs the token it joined with, and
	// then names B.
	if _, errs, code := r.cli(nil, "invite", "--data-dir", dirB); code != 2 || !strings.Contains(errs, "it was started with --join") {
		t.Fatalf("invite for B without --join: exit %d, %s", code, errs)
	}
	if _, errs, code := r.cli(nil, "invite", "--data-dir", dirB, "--join", "@"+tokFile); code != 0 || !strings.Contains(errs, "TCP port "+portB) {
		t.Fatalf("invite for B: exit %d, %s", code, errs)
	}
	// start --api's gateway peer joins with the token's key too.
	if body, err := completeWithin(api, 30*time.Second); err != nil {
		t.Fatalf("B's --api: %v %s", err, body)
	}

	gen := []string{"generate", "--model", "stories260K", "--prompt", "Once upon a time", "--max-tokens", "24", "--wait", "30s", "--data-dir", filepath.Join(r.dir, "client")}
	local, errs, code := r.cli(nil, "generate", "--local", "--model", model, "--prompt", "Once upon a time", "--max-tokens", "24")
	if code != 0 || strings.TrimSpace(local) == "" {
		t.Fatalf("--local: exit %d %s", code, errs)
	}
	for name, c := range map[string]struct {
		env  []string
		args []string
	}{
		"--join @file":    {nil, []string{"--join", "@" + tokFile}},
		"$MESHP2P_JOIN":   {[]string{joinEnv + "=" + token}, nil},
		"host:port + key": {nil, []string{"--bootstrap", "127.0.0.1:" + portB, "--swarm-key", key, "--network", "joinnet"}},
	} {
		began := time.Now()
		out, errs, code := r.cli(c.env, append(gen, c.args...)...)
		if code != 0 || out != local {
			t.Fatalf("generate with %s: exit %d, %q (--local %q)\n%s", name, code, out, local, errs)
		}
		t.Logf("generate with %s: %v", name, time.Since(began).Round(time.Millisecond))
	}
	if out, errs, code := r.cli([]string{joinEnv + "=" + token}, "status"); code != 0 || !strings.Contains(out, "stories260K") || !strings.Contains(out, "routable") {
		t.Fatalf("status with $MESHP2P_JOIN: exit %d\n%s\n%s", code, out, errs)
	}
	r.checkRefusals(gen, token, key)
	r.stop()
	for _, b := range r.seen[1:] { // [0]: swarm-gen's stdout
		if s := b.String(); strings.Contains(s, token) || strings.Contains(s, token[4:40]) {
			if line := strings.TrimSpace(s); strings.HasPrefix(line, "mp1_") && !strings.ContainsAny(line, " \n") {
				continue // an invite's stdout: the one place a token belongs
			}
			t.Fatalf("the token appears in a process's output:\n%s", s)
		}
	}
}

// checkRefusals: a token with --swarm-key, a token of another --network,
// a truncated token, a world-readable token file and a host:port without
// a swarm key are usage errors (exit 2) that say why.
func (r *joinRun) checkRefusals(gen []string, token, key string) {
	t := r.t
	loose := filepath.Join(r.dir, "loose.token")
	if err := os.WriteFile(loose, []byte(token), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--join", token, "--swarm-key", key}, "--join carries the swarm key; drop --swarm-key"},
		{[]string{"--join", token, "--network", "other"}, `--join is for --network "joinnet", not "other"`},
		{[]string{"--join", token[:len(token)-2]}, "checksum mismatch"},
		{[]string{"--join", "@" + loose}, "run chmod 600"},
		{[]string{"--bootstrap", "127.0.0.1:1", "--network", "joinnet"}, "host:port works in a private swarm only"},
	} {
		_, errs, code := r.cli(nil, append(gen, c.args...)...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Fatalf("generate %q: exit %d, stderr %q; want exit 2 and %q", c.args[:min(2, len(c.args))], code, errs, c.want)
		}
	}
}

// completeWithin posts a short completion to the API at addr until it
// answers 200 or d has passed.
func completeWithin(addr string, d time.Duration) (string, error) {
	req := `{"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 8}`
	var last string
	for deadline := time.Now().Add(d); ; time.Sleep(200 * time.Millisecond) {
		resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(req))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return string(b), nil
			}
			last = resp.Status + " " + string(b)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return last, fmt.Errorf("no completion within %v", d)
		}
	}
}
