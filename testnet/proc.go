package testnet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// ChildEnv is the environment variable that selects a child role when a
// test binary re-executes itself inside a namespace (see StartSelf and
// ChildRole).
const ChildEnv = "MESHP2P_TESTNET_CHILD"

// ChildRole returns the role a re-executed test binary should play, or ""
// in the parent. The idiom, in a _test.go file:
//
//	func TestMain(m *testing.M) {
//		if role := testnet.ChildRole(); role != "" {
//			os.Exit(runChild(role, os.Args[1:])) // prints JSON lines on stdout
//		}
//		os.Exit(m.Run())
//	}
func ChildRole() string { return os.Getenv(ChildEnv) }

// Limits on what a Proc keeps of its stdout in memory (the files keep all).
const (
	maxLineLen = 64 << 10
	maxLines   = 4096
)

// ErrExited: the process exited before the awaited line appeared.
var ErrExited = errors.New("testnet: process exited")

// Proc is a process running inside a node's namespace. Its stdout and
// stderr go to files in the topology's log dir; stdout lines are also kept
// (bounded) for WaitLine/WaitEvent.
type Proc struct {
	Node       string
	Name       string // unique per topology: <node>.<n>.<base of cmd>
	PID        int
	StdoutPath string
	StderrPath string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit status, valid after done

	mu      sync.Mutex
	lines   [][]byte
	dropped int
	changed chan struct{} // closed and replaced on every new line
	partial []byte
}

// ProcOptions tune StartWith.
type ProcOptions struct {
	Env  []string // extra KEY=VALUE, added to this process's environment
	Name string   // label for log files (default: base name of cmd)
}

// Start runs cmd with args inside node's namespace (`ip netns exec`),
// records its PID and captures its output. The process is killed (its
// whole process group, by PID) when ctx is done, on Close, and — via the
// parent-death signal — when this process dies.
func (t *Topology) Start(ctx context.Context, node, cmd string, args ...string) (*Proc, error) {
	return t.StartWith(ctx, node, ProcOptions{}, cmd, args...)
}

// StartSelf re-executes the running binary (os.Executable) inside node's
// namespace with ChildEnv=role, passing args. See ChildRole.
func (t *Topology) StartSelf(ctx context.Context, node, role string, args ...string) (*Proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("testnet: own executable: %w", err)
	}
	return t.StartWith(ctx, node, ProcOptions{Env: []string{ChildEnv + "=" + role}, Name: role}, exe, args...)
}

// StartWith is Start with options.
func (t *Topology) StartWith(ctx context.Context, node string, opts ProcOptions, cmd string, args ...string) (*Proc, error) {
	n, err := t.Node(node)
	if err != nil {
		return nil, err
	}
	seq, logDir, err := t.nextProc()
	if err != nil {
		return nil, err
	}
	label := opts.Name
	if label == "" {
		label = filepath.Base(cmd)
	}
	p := &Proc{
		Node:    node,
		Name:    fmt.Sprintf("%s.%d.%s", node, seq, label),
		done:    make(chan struct{}),
		changed: make(chan struct{}),
	}
	stdout, stderr, err := p.createLogs(logDir)
	if err != nil {
		return nil, err
	}

	c := exec.Command("ip", append([]string{"netns", "exec", n.NetNS, cmd}, args...)...)
	c.Env = append(os.Environ(), opts.Env...)
	c.Stdout = io.MultiWriter(stdout, p)
	c.Stderr = stderr
	// Own process group (killed as a whole); SIGKILL if we die.
	c.SysProcAttr = groupAttr()
	p.cmd = c

	if err := t.launch(p, cmd); err != nil {
		stdout.Close()
		stderr.Close()
		return nil, err
	}
	go p.reap(stdout, stderr)
	go func() {
		select {
		case <-ctx.Done():
			p.kill()
		case <-p.done:
		}
	}()
	return p, nil
}

// nextProc numbers a new process of the topology and returns the log dir
// for its files, created on first use (ErrClosed after Close).
func (t *Topology) nextProc() (seq int, logDir string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, "", ErrClosed
	}
	t.nproc++
	seq = t.nproc
	if t.logDir == "" {
		dir, err := os.MkdirTemp("", "testnet-"+t.Prefix+"-")
		if err != nil {
			return 0, "", fmt.Errorf("testnet: log dir: %w", err)
		}
		t.logDir, t.ownLog = dir, true
	}
	return seq, t.logDir, nil
}

// createLogs creates p's stdout and stderr files in logDir.
func (p *Proc) createLogs(logDir string) (stdout, stderr *os.File, err error) {
	p.StdoutPath = filepath.Join(logDir, p.Name+".stdout")
	p.StderrPath = filepath.Join(logDir, p.Name+".stderr")
	stdout, err = os.Create(p.StdoutPath)
	if err != nil {
		return nil, nil, fmt.Errorf("testnet: %w", err)
	}
	stderr, err = os.Create(p.StderrPath)
	if err != nil {
		stdout.Close()
		return nil, nil, fmt.Errorf("testnet: %w", err)
	}
	return stdout, stderr, nil
}

// launch starts p's command (cmd in p.Node, for the error) and adds p to
// the topology's processes, under t.mu so that Close either sees p or
// keeps it from starting (ErrClosed).
func (t *Topology) launch(p *Proc, cmd string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("testnet: start %s in %s: %w", cmd, p.Node, err)
	}
	p.PID = p.cmd.Process.Pid
	t.procs = append(t.procs, p)
	return nil
}

// reap waits for p's exit, closes its output files, keeps a last stdout
// line that had no newline, and closes p.done.
func (p *Proc) reap(stdout, stderr *os.File) {
	p.err = p.cmd.Wait()
	stdout.Close()
	stderr.Close()
	p.mu.Lock()
	if len(p.partial) > 0 {
		p.addLine(p.partial)
		p.partial = nil
	}
	p.mu.Unlock()
	close(p.done)
}

// Write receives the process's stdout (io.Writer for exec.Cmd).
func (p *Proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	data := b
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			if len(p.partial) < maxLineLen {
				p.partial = append(p.partial, data[:min(len(data), maxLineLen-len(p.partial))]...)
			}
			break
		}
		line := data[:i]
		if len(p.partial) > 0 {
			line = append(p.partial, line[:min(len(line), max(0, maxLineLen-len(p.partial)))]...)
			p.partial = nil
		} else if len(line) > maxLineLen {
			line = line[:maxLineLen]
		}
		p.addLine(bytes.Clone(line))
		data = data[i+1:]
	}
	return len(b), nil
}

// addLine keeps line (mu held) and wakes waiters.
func (p *Proc) addLine(line []byte) {
	if len(p.lines) >= maxLines {
		p.lines = p.lines[1:]
		p.dropped++
	}
	p.lines = append(p.lines, line)
	close(p.changed)
	p.changed = make(chan struct{})
}

// Lines returns the stdout lines kept so far (at most the last 4096).
func (p *Proc) Lines() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.lines...)
}

// WaitLine waits for a stdout line for which match is true (lines seen
// before the call count) and returns it. It fails with ErrExited if the
// process exits first, or with ctx's error.
func (p *Proc) WaitLine(ctx context.Context, match func(line []byte) bool) ([]byte, error) {
	next := 0
	for {
		p.mu.Lock()
		start := next - p.dropped
		if start < 0 {
			start = 0
		}
		var found []byte
		for _, l := range p.lines[start:] {
			if match(l) {
				found = l
				break
			}
		}
		next = p.dropped + len(p.lines)
		changed := p.changed
		p.mu.Unlock()
		if found != nil {
			return found, nil
		}
		select {
		case <-changed:
		case <-p.done:
			// One last look: the final partial line may have arrived.
			p.mu.Lock()
			tail := p.lines[max(0, next-p.dropped):]
			p.mu.Unlock()
			for _, l := range tail {
				if match(l) {
					return l, nil
				}
			}
			return nil, fmt.Errorf("%w: %s (pid %d): %v; stderr: %s", ErrExited, p.Name, p.PID, p.err, p.StderrTail(2048))
		case <-ctx.Done():
			return nil, fmt.Errorf("testnet: waiting on %s (pid %d): %w; stderr: %s", p.Name, p.PID, ctx.Err(), p.StderrTail(2048))
		}
	}
}

// Event is the minimal shape of a child's JSON line: {"event": "...", ...}.
type Event struct {
	Event string `json:"event"`
	Error string `json:"error,omitempty"`
}

// ErrChildFailed: the child reported {"event":"error","error":"..."}.
var ErrChildFailed = errors.New("testnet: child reported an error")

// WaitEvent waits for a JSON line whose "event" is name and decodes it
// into v (if v is not nil). A line with event "error" ends the wait with
// ErrChildFailed.
func (p *Proc) WaitEvent(ctx context.Context, name string, v any) error {
	var failed string
	line, err := p.WaitLine(ctx, func(l []byte) bool {
		var e Event
		if json.Unmarshal(l, &e) != nil {
			return false
		}
		if e.Event == "error" {
			failed = e.Error
			return true
		}
		return e.Event == name
	})
	if err != nil {
		return err
	}
	if failed != "" {
		return fmt.Errorf("%w: %s: %s", ErrChildFailed, p.Name, failed)
	}
	if v == nil {
		return nil
	}
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("testnet: %s: event %s: %w", p.Name, name, err)
	}
	return nil
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait waits for the process to exit and returns its exit error.
func (p *Proc) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Kill sends SIGKILL to the process group and waits (up to 5 s) for exit.
func (p *Proc) Kill() error {
	p.kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("testnet: %s (pid %d) did not exit after SIGKILL", p.Name, p.PID)
	}
}

func (p *Proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	if p.PID > 0 {
		killPID(-p.PID) // the group (Setpgid: pgid == pid)
		killPID(p.PID)
	}
}

// StderrTail returns up to n bytes from the end of the stderr file.
func (p *Proc) StderrTail(n int) string { return fileTail(p.StderrPath, n) }

func fileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(0, st.Size()-int64(n))
	b := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	return string(b)
}

// Procs returns the processes started so far.
func (t *Topology) Procs() []*Proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]*Proc(nil), t.procs...)
}
