package compose

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/status"
)

type genJSON struct {
	Tokens     []int32 `json:"tokens"`
	Text       string  `json:"text"`
	MsPerToken float64 `json:"ms_per_token"`
	Route      []struct {
		Peer       string `json:"peer"`
		Start, End int
	} `json:"route"`
}

// The compose testnet end to end, as `make testnet-docker` runs it: build
// the offline image, start relay, two NAT routers and a node behind each,
// generate from a client behind router 1 (tokens equal to --local, route
// relay -> a -> b), require the a -> b seam (home 1 to home 2) to be hole
// punched and the direct connection to arrive from router 1's WAN address,
// scale two self-placing nodes in (--scale node=2, no NODE_LAYERS: sized by
// their containers' memory limit, then by --memory), stop a and b, let the
// two close the gap and generate through their windows, run the fit
// profile (a model bigger than one container's memory limit: OOM-killed
// whole, equal to --local across three limited containers), then tear
// everything down, with the host's iptables, forwarding, links, addresses
// and routes as before. Skips where Docker cannot run (not installed, no
// daemon and not root).
func TestComposeTestnet(t *testing.T) {
	if testing.Short() {
		t.Skip("container testnet: not in -short")
	}
	if os.Getenv("MESHP2P_DOCKER_TEST") != "1" {
		t.Skip("container testnet: run by make test-docker (MESHP2P_DOCKER_TEST=1), never next to the namespace NAT tests")
	}
	for _, tool := range []string{"docker", "dockerd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("container testnet: %s not installed (make deps installs docker.io and docker-compose as root)", tool)
		}
	}
	if _, err := exec.LookPath("docker-compose"); err != nil {
		if exec.Command("docker", "compose", "version").Run() != nil {
			t.Skip("container testnet: neither docker-compose nor docker compose is installed")
		}
	}
	// The committed model (models/README.md), as make testnet-docker uses.
	models, err := filepath.Abs("../../models")
	if err != nil {
		t.Fatal(err)
	}
	model := filepath.Join(models, "stories260K.gguf")
	bin := testbin.CLI(t)
	script, err := filepath.Abs("testnet.sh")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a hang guard: 75-87 s on this 2-core machine at load 5-6
	defer cancel()
	env := append(os.Environ(), "MESHP2P_BIN="+bin, "MESHP2P_MODELS="+models,
		"MESHP2P_COMPOSE_STATE=/tmp/meshp2p-compose-test", "COMPOSE_PROJECT_NAME=meshp2ptest", "MESHP2P_IMAGE=meshp2p:composetest",
		"MESHP2P_FIT_TOKENS=12") // the fit model's three hops are slow on a loaded 2-core machine
	sh := func(ctx context.Context, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "sh", append([]string{script}, args...)...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if err != nil {
			return out.String(), fmt.Errorf("testnet.sh %s: %w\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
		}
		return out.String(), nil
	}

	t0 := time.Now()
	out, err := sh(ctx, "up")
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		out, err := sh(dctx, "down")
		if err != nil {
			t.Errorf("teardown: %v", err)
			return
		}
		t.Logf("%s", strings.TrimSpace(out))
	})
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 3 {
		t.Skipf("container testnet: Docker cannot run here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("up in %v: %s", time.Since(t0).Round(time.Millisecond), strings.TrimSpace(out))

	const prompt, maxTok = "Once upon a time", "24"
	lout, err := exec.CommandContext(ctx, bin, "generate", "--local", "--model", model, "--prompt", prompt, "--max-tokens", maxTok, "--json").Output()
	if err != nil {
		t.Fatalf("local: %v", err)
	}
	var want, got genJSON
	if err := json.Unmarshal(lout, &want); err != nil {
		t.Fatal(err)
	}
	sout, err := sh(ctx, "compose", "run", "--rm", "-T", "client", "generate", "--model", "stories260K", "--prompt", prompt,
		"--max-tokens", maxTok, "--json", "--reachability", "private", "--dht-mode", "client", "--wait", "45s")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(sout), &got); err != nil {
		t.Fatalf("client output %q: %v", sout, err)
	}
	if len(want.Tokens) == 0 || fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) || len(got.Route) != 3 {
		t.Fatalf("swarm %v (route %+v)\nlocal %v", got.Tokens, got.Route, want.Tokens)
	}
	t.Logf("%d tokens through relay -> a (NAT 1) -> b (NAT 2) equal --local: %q", len(got.Tokens), got.Text)
	logs, err := sh(ctx, "compose", "logs", "--no-color", "a")
	if err != nil {
		t.Fatal(err)
	}
	var seam string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "seam to next hop open") {
			seam = l
		}
	}
	if !strings.Contains(seam, "path=direct") {
		t.Fatalf("the seam a -> b (home 1 -> home 2) is not hole-punched: %q\n%s", seam, logs)
	}
	t.Logf("home-to-home seam: %s", strings.TrimSpace(seam))
	// Through both NATs: b (home 2) holds an established TCP connection
	// from router 1's WAN address, and none from home 1's LAN.
	tcp, err := sh(ctx, "compose", "exec", "-T", "b", "cat", "/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	peers := establishedPeers(t, tcp)
	if !slices.Contains(peers, "198.51.100.11") || slices.ContainsFunc(peers, func(p string) bool { return strings.HasPrefix(p, "10.0.1.") }) {
		t.Fatalf("b's established TCP peers %v: want router 1's WAN 198.51.100.11, nothing from 10.0.1.0/24", peers)
	}
	t.Logf("b's established TCP peers: %v", peers)

	// --scale without NODE_LAYERS: two nodes behind router 2 start without
	// --layers and place themselves (docs/placement.md). First with the
	// default budget: the room under the container's mem_limit (NODE_MEM,
	// 1g) less the reserve, not the host's MemAvailable. Then again (the
	// containers are recreated) with --memory 13.9M: by the placement
	// estimate (node.ModelSizing; mostly fixed buffers, KV of --ctx and
	// the default --prefix-cache, counted twice for the batch-invariant
	// engine's compaction) stories260K's windows need 12.04 MiB for one
	// middle layer, +1.68 per layer, +1.27 with the output head, so 13.9M
	// holds at most 2 layers (2-4: 13.72) and the only window with the
	// last layer is 4-5 (13.31; 3-5: 15.00). a and b stop; the two must
	// split the gap 2-5 between them (2-4 and 4-5), and a generation
	// through them equals --local. The one test-only
	// value: a 3 s rebalance interval (default 2 min).
	idRelay := nodeInfo(t, sh, ctx, "relay").PeerID
	var ids string
	scaleIn := func(nodeArgs, budgetFrom string) map[string]bool {
		env = append(env, "NODE_ARGS=--rebalance-interval 3s "+nodeArgs)
		t1 := time.Now()
		if _, err := sh(ctx, "scale", "2"); err != nil {
			t.Fatal(err)
		}
		ids, err = sh(ctx, "compose", "--profile", "scale", "ps", "-q", "node")
		if err != nil {
			t.Fatal(err)
		}
		scaled := map[string]bool{}
		for _, id := range strings.Fields(ids) {
			in := nodeInfo(t, sh, ctx, "", id)
			lg, err := exec.CommandContext(ctx, "docker", "logs", id).CombinedOutput()
			if err != nil {
				t.Fatalf("docker logs %s: %v", id, err)
			}
			placing, chose := logLine(string(lg), "placing layers"), logLine(string(lg), "placement: chose layers")
			from := strings.TrimPrefix(logField(placing, "budget_from="), "\"")
			if !strings.HasPrefix(from, budgetFrom) || chose == "" {
				t.Fatalf("scaled node %s did not place itself within a budget from %s:\n%s", id, budgetFrom, lg)
			}
			t.Logf("scaled node %s: layers %d-%d; %s", in.PeerID, in.Start, in.End, strings.TrimSpace(placing))
			scaled[in.PeerID] = true
		}
		if len(scaled) != 2 {
			t.Fatalf("%d scaled nodes, want 2", len(scaled))
		}
		m := clientStatus(t, sh, ctx)
		seen := 0
		for _, s := range m.Shards {
			// Live not required: a client's one probe of a node that just
			// started behind router 2 can miss it (its relay reservation
			// may not be there yet); the advert says it chose its window.
			if scaled[s.Peer] && !s.Planned {
				seen++
			}
		}
		if seen != 2 || !m.Routable {
			t.Fatalf("status: %d of the 2 scaled nodes serving, routable %v: %+v", seen, m.Routable, m)
		}
		t.Logf("scaled in %v: status replicas per layer %v", time.Since(t1).Round(time.Millisecond), m.Replicas)
		return scaled
	}
	scaleIn("", "cgroup")
	scaled := scaleIn("--memory 13.9M", "--memory")

	if _, err := sh(ctx, "compose", "stop", "-t", "10", "a", "b"); err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	var m status.Model
	for {
		m = clientStatus(t, sh, ctx)
		ok := m.Routable
		for _, s := range m.Shards {
			// a's and b's adverts linger until they expire, listed dead
			ok = ok && (!s.Live || (s.Peer == idRelay || scaled[s.Peer]) && !s.Planned)
		}
		if ok {
			break
		}
		if ctx.Err() != nil || time.Since(t2) > 90*time.Second {
			t.Fatalf("the scaled nodes did not close the gap a and b left: %+v", m)
		}
		time.Sleep(2 * time.Second)
	}
	var windows []string
	for _, s := range m.Shards {
		if !s.Live {
			continue
		}
		windows = append(windows, fmt.Sprintf("%d-%d", s.Start, s.End))
	}
	t.Logf("a and b stopped: routable again on %v within %v", windows, time.Since(t2).Round(time.Millisecond))
	sout, err = sh(ctx, "compose", "run", "--rm", "-T", "client", "generate", "--model", "stories260K", "--prompt", prompt,
		"--max-tokens", maxTok, "--json", "--reachability", "private", "--dht-mode", "client", "--wait", "45s")
	if err != nil {
		t.Fatal(err)
	}
	got = genJSON{}
	if err := json.Unmarshal([]byte(sout), &got); err != nil {
		t.Fatalf("client output %q: %v", sout, err)
	}
	hops := 0
	for _, h := range got.Route {
		if scaled[h.Peer] {
			hops++
		}
	}
	if fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) || hops != 2 {
		t.Fatalf("through the self-placed nodes: %v (route %+v)\nlocal %v", got.Tokens, got.Route, want.Tokens)
	}
	t.Logf("%d tokens through route %+v (2 self-placed hops) equal --local", len(got.Tokens), got.Route)
	for _, id := range strings.Fields(ids) {
		if lg, err := exec.CommandContext(ctx, "docker", "logs", id).CombinedOutput(); err == nil {
			if mv := logLine(string(lg), "placement: moving"); mv != "" {
				t.Logf("scaled node moved: %s", strings.TrimSpace(mv))
			}
		}
	}

	fout, err := sh(ctx, "fit")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fout, "OOM-killed") || !strings.Contains(fout, "fit ok") {
		t.Fatalf("fit: %s", fout)
	}
	t.Logf("%s", strings.TrimSpace(fout))
}

// establishedPeers reads /proc/net/tcp text: the remote IPv4 addresses of
// established connections.
func establishedPeers(t *testing.T, procNetTCP string) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(procNetTCP, "\n")[1:] {
		f := strings.Fields(l)
		if len(f) < 4 || f[3] != "01" {
			continue
		}
		hexIP, _, ok := strings.Cut(f[2], ":")
		v, err := strconv.ParseUint(hexIP, 16, 32)
		if !ok || err != nil || len(hexIP) != 8 {
			t.Fatalf("/proc/net/tcp line %q", l)
		}
		ip := netip.AddrFrom4([4]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)}).String()
		if !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	return out
}

type nodeJSON struct {
	PeerID     string `json:"peer_id"`
	Start, End int
}

type shJSON func(context.Context, ...string) (string, error)

// nodeInfo is a container's /data/node.json: of service svc, or of the
// container id when svc is "".
func nodeInfo(t *testing.T, sh shJSON, ctx context.Context, svc string, id ...string) nodeJSON {
	t.Helper()
	var out []byte
	var err error
	if svc != "" {
		var s string
		s, err = sh(ctx, "compose", "exec", "-T", svc, "cat", "/data/node.json")
		out = []byte(s)
	} else {
		out, err = exec.CommandContext(ctx, "docker", "exec", id[0], "cat", "/data/node.json").Output()
	}
	var in nodeJSON
	if err == nil {
		err = json.Unmarshal(out, &in)
	}
	if err != nil || in.PeerID == "" {
		t.Fatalf("node.json of %s%v: %v (%q)", svc, id, err, out)
	}
	return in
}

// clientStatus is `status --json` from a client behind router 1 (the
// status document, package status): the stories260K model's entry.
func clientStatus(t *testing.T, sh shJSON, ctx context.Context) status.Model {
	t.Helper()
	out, err := sh(ctx, "compose", "run", "--rm", "-T", "client", "status", "--json", "--wait", "20s")
	if err != nil {
		t.Fatal(err)
	}
	var doc status.Document
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("status --json %q: %v", out, err)
	}
	for _, m := range doc.Models {
		if m.Name == "stories260K" {
			return m
		}
	}
	t.Fatalf("status --json: no stories260K: %s", out)
	return status.Model{}
}

// logLine is the last line of a log holding sub ("" when none).
func logLine(log, sub string) string {
	var l string
	for _, s := range strings.Split(log, "\n") {
		if strings.Contains(s, sub) {
			l = s
		}
	}
	return l
}

// logField is what follows key in a log line, up to the next space.
func logField(line, key string) string {
	_, v, _ := strings.Cut(line, key)
	v, _, _ = strings.Cut(v, " ")
	return v
}
