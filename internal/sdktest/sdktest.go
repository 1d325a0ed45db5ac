// Package sdktest runs the official client SDKs' scripts of
// api/testdata/sdk (Node.js: @anthropic-ai/sdk and ollama, versions pinned
// by its package-lock.json) against a meshp2p API: api's tests run them
// against a scripted backend, cmd/meshp2p's against a swarm. Each script
// prints a JSON summary of what it got and exits non-zero when an
// assertion fails. The modules are installed by `sh scripts/node-deps.sh`;
// without node or them, Available says so and tests skip.
package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// The scripts and their environment.
const (
	Anthropic = "anthropic.mjs" // @anthropic-ai/sdk: messages.create, messages.stream, a tool_use round trip
	Ollama    = "ollama.mjs"    // ollama: chat, generate (whole and streamed), list, show, version, tool calls

	EnvBaseURL   = "MESHP2P_BASE_URL"   // the server's root URL (no /v1): each SDK adds its paths
	EnvAPIKey    = "MESHP2P_API_KEY"    // the API key ("": none configured)
	EnvModel     = "MESHP2P_MODEL"      // the model to ask for
	EnvMaxTokens = "MESHP2P_MAX_TOKENS" // max_tokens / num_predict of the text requests (default 32)
	// EnvToolsOptional ("1") lets ollama.mjs pass when the model answers
	// its tool question in text (Ollama has no tool_choice to force a
	// call; the Anthropic script forces one): summary "tools" is then
	// {"skipped": …} and the checks after it do not run.
	EnvToolsOptional = "MESHP2P_TOOLS_OPTIONAL"
)

// Dir is api/testdata/sdk of this checkout.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "api", "testdata", "sdk")
}

// ErrUnavailable is wrapped by Available's error.
var ErrUnavailable = errors.New("sdktest: the SDK scripts cannot run here")

// Available reports why the scripts cannot run (nil: they can): node
// missing, or the modules not installed.
func Available() error {
	if _, err := exec.LookPath("node"); err != nil {
		return fmt.Errorf("%w: node is not installed (sh scripts/node-deps.sh installs it and the SDKs)", ErrUnavailable)
	}
	for _, m := range []string{"@anthropic-ai/sdk", "ollama"} {
		if _, err := os.Stat(filepath.Join(Dir(), "node_modules", m, "package.json")); err != nil {
			return fmt.Errorf("%w: %s is not installed in %s (run sh scripts/node-deps.sh)", ErrUnavailable, m, Dir())
		}
	}
	return nil
}

// Run runs script (Anthropic, Ollama) with node, env added to this
// process's environment, and returns the summary it printed (its last
// line of output). When the script fails the error carries its output
// (and the summary is returned when it printed one: its "error" says what
// failed).
func Run(ctx context.Context, script string, env map[string]string) (map[string]any, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "node", filepath.Join(Dir(), script))
	cmd.Dir = Dir()
	cmd.Env = os.Environ()
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cmd.Env = append(cmd.Env, k+"="+env[k])
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var summary map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &summary); err != nil {
		summary = nil
	}
	switch {
	case runErr != nil:
		return summary, fmt.Errorf("sdktest: %s: %w\nstdout:\n%s\nstderr:\n%s", script, runErr, stdout.String(), stderr.String())
	case summary == nil:
		return nil, fmt.Errorf("sdktest: %s printed no JSON summary\nstdout:\n%s\nstderr:\n%s", script, stdout.String(), stderr.String())
	}
	return summary, nil
}
