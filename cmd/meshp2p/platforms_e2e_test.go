package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// The release binaries of other platforms (make dist builds them into
// $MESHP2P_CROSS_BIN with scripts/cross.sh; make test and make
// test-platforms run these tests on them) run here under
// emulation: the Windows one under wine, the ARM64 one under qemu-user,
// the portable linux-amd64 one natively (and under qemu-x86_64 as an
// older CPU). docs/platforms.md.

// xbin is one platform's binary, wrapped in a shell script that runs it
// (under its emulator), so that every helper taking a binary path works.
type xbin struct {
	plat string // linux-amd64, linux-arm64, windows-amd64
	path string // the wrapper
	real string // the binary itself
}

// emulator returns the command line prefix that runs plat's programs
// here, or skips the test saying what is missing.
func emulator(t *testing.T, plat string) string {
	t.Helper()
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skipf("the platform tests run on linux/amd64 (this is %s/%s)", runtime.GOOS, runtime.GOARCH)
	}
	switch plat {
	case "windows-amd64":
		prefix := os.Getenv("MESHP2P_WINEPREFIX")
		if _, err := exec.LookPath("wine"); err != nil {
			t.Skip("wine is not installed (scripts/cross-deps.sh installs it as root): the Windows binary is not run")
		}
		if _, err := os.Stat(filepath.Join(prefix, "system.reg")); prefix == "" || err != nil {
			t.Skipf("no wine prefix at MESHP2P_WINEPREFIX=%q (scripts/wine/prefix.sh makes it; make test-platforms runs it)", prefix)
		}
		return fmt.Sprintf("WINEPREFIX=%q WINEDEBUG=-all exec wine", prefix)
	case "linux-arm64":
		if _, err := exec.LookPath("qemu-aarch64-static"); err != nil {
			t.Skip("qemu-aarch64-static is not installed (qemu-user-static; scripts/cross-deps.sh installs it as root): the ARM64 binary is not run")
		}
		return "exec qemu-aarch64-static -L /usr/aarch64-linux-gnu"
	}
	return "exec"
}

// emulated writes a shell script that runs real under plat's emulator.
func emulated(t *testing.T, plat, real string) string {
	t.Helper()
	w := filepath.Join(t.TempDir(), filepath.Base(real)+".sh")
	if err := os.WriteFile(w, fmt.Appendf(nil, "#!/bin/sh\n%s %q \"$@\"\n", emulator(t, plat), real), 0o755); err != nil {
		t.Fatal(err)
	}
	return w
}

// crossBin returns plat's wrapped binary, or skips the test saying what
// is missing.
func crossBin(t *testing.T, plat string) xbin {
	t.Helper()
	emulator(t, plat)
	dir := os.Getenv("MESHP2P_CROSS_BIN")
	if dir == "" {
		t.Skip("MESHP2P_CROSS_BIN is not set: make test (its last step, make test-platforms-run) and make test-platforms run these on the cross binaries of make dist (docs/platforms.md)")
	}
	real := filepath.Join(dir, "meshp2p-"+plat)
	if plat == "windows-amd64" {
		real += ".exe"
	}
	if _, err := os.Stat(real); err != nil {
		t.Skipf("%s was not built (%v): make test-platforms builds it where its cross compiler is installed", real, err)
	}
	return xbin{plat: plat, path: emulated(t, plat, real), real: real}
}

// TestPlatformUnitTests: the platform-specific code's own tests,
// cross-compiled (pure Go, no llama.cpp: minutes even with a cold cache)
// and run under the emulators: the data-dir lock (LockFileEx on Windows,
// flock on Linux ARM64), the failure memory's save lock across processes,
// the memory budget (GlobalMemoryStatusEx on Windows; /proc/meminfo and
// cgroups on Linux ARM64), the registry of local processes and the CPU
// share of co-located nodes (OpenProcess, GetProcessTimes and
// GetSystemTimes on Windows), and the frame codec. make
// test-platforms-unit runs it alone (MESHP2P_PLATFORM_UNIT=1); make
// test-platforms-run (make test's last step) with the release binaries'
// tests.
func TestPlatformUnitTests(t *testing.T) {
	if os.Getenv("MESHP2P_CROSS_BIN") == "" && os.Getenv("MESHP2P_PLATFORM_UNIT") == "" {
		t.Skip("neither MESHP2P_PLATFORM_UNIT nor MESHP2P_CROSS_BIN is set: make test-platforms-unit, make test and make test-platforms run these")
	}
	for _, tc := range []struct{ plat, pkg, run string }{
		{"windows-amd64", "internal/dirlock", "TestAcquireOtherProcess"},
		{"windows-amd64", "placement", "TestBudgetHost"},
		{"windows-amd64", "internal/failfile", "TestConcurrentSavesProcesses"},
		{"windows-amd64", "node/localnodes", "TestAlive"},
		{"windows-amd64", "node/cpushare", "TestMembers|TestThreadsLeaveBusyCPUs|TestThreadsCancelled|TestOthersTicksReadsMembers|TestGateClaims|TestGateConcurrent|TestGateAcrossProcesses"},
		{"windows-amd64", "proto/frame", "Test.*"},
		{"linux-arm64", "internal/dirlock", "TestAcquire|TestAcquireOtherProcess"},
		{"linux-arm64", "placement", "TestBudgetParsing|TestBudgetHost|TestCgroupV1"},
		{"linux-arm64", "internal/failfile", "TestConcurrentSavesProcesses"},
		{"linux-arm64", "node/localnodes", "TestAlive"},
		// Not TestGateAcrossProcesses: qemu-user answers a process's
		// reads of its own /proc/<pid>/stat itself, with another start
		// time than the host's /proc shows the others, so two emulated
		// members take each other for reused pids and drop each other's
		// files (a harness artifact; TestMembers registers its children
		// with start times the parent reads, and passes).
		{"linux-arm64", "node/cpushare", "TestMembers|TestThreadsLeaveBusyCPUs|TestThreadsCancelled|TestGateClaims|TestGateConcurrent"},
		{"linux-arm64", "proto/frame", "Test.*"},
	} {
		t.Run(tc.plat+"/"+tc.pkg, func(t *testing.T) {
			goos, goarch, _ := strings.Cut(tc.plat, "-")
			emulator(t, tc.plat) // skips without it
			bin := filepath.Join(t.TempDir(), strings.ReplaceAll(tc.pkg, "/", "_")+".test")
			build := exec.Command("go", "test", "-c", "-o", bin, "../../"+tc.pkg)
			build.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go test -c %s for %s: %v\n%s", tc.pkg, tc.plat, err, out)
			}
			c := exec.Command(emulated(t, tc.plat, bin), "-test.run", "^("+tc.run+")$", "-test.v", "-test.count=1")
			c.Dir = filepath.Join("..", "..", tc.pkg) // its testdata
			if tc.plat == "linux-arm64" {
				// Children of the test binary (other processes holding
				// locks) go through qemu too: there is no binfmt_misc.
				c.Env = append(os.Environ(), "MESHP2P_TEST_EXEC=qemu-aarch64-static")
			}
			out, err := c.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "--- PASS") {
				t.Fatalf("%s tests of %s: %v\n%s", tc.plat, tc.pkg, err, out)
			}
			for _, name := range strings.Split(tc.run, "|") {
				if !strings.ContainsAny(name, ".*") && !strings.Contains(string(out), "--- PASS: "+name+" ") {
					t.Errorf("%s: %s of %s did not run and pass:\n%s", tc.plat, name, tc.pkg, out)
				}
			}
			t.Logf("%s", out)
		})
	}
}

// output runs the binary and returns its stdout, failing on an error.
func (x xbin) output(t *testing.T, args ...string) string {
	t.Helper()
	var stderr strings.Builder
	c := exec.Command(x.path, args...)
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s%s", x.plat, args, err, out, stderr.String())
	}
	return string(out)
}

var platformOf = map[string]string{"linux-amd64": "linux/amd64", "linux-arm64": "linux/arm64", "windows-amd64": "windows/amd64"}

// TestPlatformVersion: each release binary runs `version` under its
// emulator and names its build, its SIMD level with the extensions it
// needs, and a batch-invariant CPU kernel class of its architecture.
func TestPlatformVersion(t *testing.T) {
	for _, plat := range []string{"linux-amd64", "linux-arm64", "windows-amd64"} {
		t.Run(plat, func(t *testing.T) {
			x := crossBin(t, plat)
			start := time.Now()
			out := x.output(t, "version")
			arch := strings.Split(platformOf[plat], "/")[1]
			for _, re := range []string{
				`(?m)^build: ` + platformOf[plat] + `, release build meshp2p-\S+-` + plat + `$`,
				`(?m)^simd: -march=\S+ \(needs [a-z0-9 ]+; this CPU has them`,
				`(?m)^kernel class: cpu/` + arch + `/\S+/fa \(batch-invariant\)$`,
			} {
				if !regexp.MustCompile(re).MatchString(out) {
					t.Errorf("version output lacks %s:\n%s", re, out)
				}
			}
			t.Logf("%s version (%.1f s):\n%s", plat, time.Since(start).Seconds(), out)
		})
	}
}

// TestPlatformCPURefused: a release binary on a CPU without its SIMD
// level's extensions stops at once with a message naming them (exit 3),
// instead of dying of SIGILL inside llama.cpp. qemu-user emulates the
// older CPUs: Nehalem (no AVX) for x86-64-v3, Cortex-A72 (ARMv8.0, the
// Raspberry Pi 4's: no dotprod, no fp16 arithmetic) for armv8.2-a.
func TestPlatformCPURefused(t *testing.T) {
	for _, tc := range []struct{ plat, qemu, cpu, lacks string }{
		{"linux-amd64", "qemu-x86_64-static", "Nehalem", "lacks avx avx2 fma bmi2"},
		{"linux-arm64", "qemu-aarch64-static", "cortex-a72", "lacks fp16 dotprod"},
	} {
		t.Run(tc.plat, func(t *testing.T) {
			x := crossBin(t, tc.plat)
			if _, err := exec.LookPath(tc.qemu); err != nil {
				t.Skipf("%s is not installed (qemu-user-static)", tc.qemu)
			}
			args := []string{"-cpu", tc.cpu, x.real, "version"}
			if tc.plat == "linux-arm64" {
				args = append([]string{"-L", "/usr/aarch64-linux-gnu"}, args...)
			}
			out, err := exec.Command(tc.qemu, args...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(string(out), tc.lacks) {
				t.Fatalf("%s on %s: %v (want exit 3 saying %q)\n%s", tc.plat, tc.cpu, err, tc.lacks, out)
			}
			t.Logf("%s on an emulated %s: %s", tc.plat, tc.cpu, strings.TrimSpace(string(out)))
		})
	}
}

// TestPlatformShardVerify: `shard verify` of stories260K on each
// platform: 2- and 3-shard chains equal the whole model bit for bit
// (parity 0) and give the native build's greedy tokens.
func TestPlatformShardVerify(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	want := runVerifyJSON(t, "--splits", "2,3", "--tokens", "8", model)
	for _, plat := range []string{"linux-arm64", "windows-amd64"} {
		t.Run(plat, func(t *testing.T) {
			x := crossBin(t, plat)
			start := time.Now()
			out := x.output(t, "shard", "verify", "--json", "--splits", "2,3", "--tokens", "8", model)
			var rep verifyReport
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("verify --json: %v\n%s", err, out)
			}
			checkReport(t, rep, []int{2, 3}, 8)
			if fmt.Sprint(rep.WholeTokens) != fmt.Sprint(want.WholeTokens) || rep.Fingerprint != want.Fingerprint {
				t.Errorf("%s: tokens %v fingerprint %s; native %v %s", plat, rep.WholeTokens, rep.Fingerprint, want.WholeTokens, want.Fingerprint)
			}
			t.Logf("%s: parity 0 over splits 2,3, 9 tokens equal to the native build's (%s; %.1f s)", plat, rep.KernelClass, time.Since(start).Seconds())
		})
	}
}

// TestPlatformMixedSwarm: one route over three platforms on loopback: a
// Linux node (the portable linux-amd64 build) serves layers 0-2 of
// stories260K, an ARM64 node (qemu) layer 2-3, a Windows node (wine)
// layers 3-5. A Linux client generates through them with audits on every
// generation (--audit-rate 1, the whole model as its auditor) until each
// hop was audited. Kernel classes: linux-amd64 and windows-amd64 share
// one (both x86-64-v3, gcc 12 and mingw-w64's gcc 12), so the Windows
// hop's audits compare exactly; the ARM64 class differs, so its audit
// uses the tolerance rule (docs/trust.md). The text must equal the Linux
// build's `generate --local`.
func TestPlatformMixedSwarm(t *testing.T) {
	if testing.Short() {
		t.Skip("three emulated nodes")
	}
	lin, arm, win := crossBin(t, "linux-amd64"), crossBin(t, "linux-arm64"), crossBin(t, "windows-amd64")
	model := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	netArgs := []string{"--network", "xplat", "--listen", "/ip4/127.0.0.1/tcp/0", "--port-mapping=false"}
	node := func(x xbin, layers string, boot string) *cliProc {
		start := time.Now()
		args := []string{"--model", model, "--layers", layers, "--bootstrap", boot}
		if x.plat != "windows-amd64" { // Windows' at its default: the gate
			args = append(args, "--threads", "1")
		}
		p := startCLI(t, x.path, filepath.Join(dir, x.plat), append(args, netArgs...)...)
		t.Logf("%s node (layers %s) up in %.1f s: %s", x.plat, layers, time.Since(start).Seconds(), p.peerID)
		return p
	}
	head := node(lin, "0-2", "")
	nodes := map[string]string{head.peerID: lin.plat}
	nodes[node(arm, "2-3", head.addr).peerID] = arm.plat
	winNode := node(win, "3-5", head.addr)
	nodes[winNode.peerID] = win.plat
	// The Windows node's decodes claim CPUs through the claims file it
	// maps (cpushare.Gate), like Linux's.
	if log := winNode.log.String(); !strings.Contains(log, "threads_by=gate") {
		t.Fatalf("the Windows node at default threads does not use the gate:\n%s", log)
	}
	classes := advertisedClasses(t, lin, nodes, append([]string{"--bootstrap", head.addr}, netArgs...))
	if !strings.HasPrefix(classes[arm.plat], "cpu/arm64/") || !strings.Contains(classes[arm.plat], "dotprod") || classes[win.plat] != classes[lin.plat] {
		t.Fatalf("advertised kernel classes %v: want ARM64's cpu/arm64/…dotprod…, Windows' equal to Linux's", classes)
	}
	t.Logf("advertised kernel classes: %v", classes)
	const prompt, n = "Once upon a time", 24
	want, _ := localText(t, lin.path, "--model", model, "--prompt", prompt, "--max-tokens", fmt.Sprint(n))
	audited := map[string]bool{}
	// One hop drawn per generation: 24 leave a hop unaudited with
	// probability 3·(2/3)^24 < 2e-4.
	for i := 0; i < 24 && len(audited) < 3; i++ {
		start := time.Now()
		out := lin.output(t, append([]string{"generate", "--json", "--data-dir", filepath.Join(dir, "client"), "--model", "stories260K",
			"--prompt", prompt, "--max-tokens", fmt.Sprint(n), "--wait", "2m", "--audit-rate", "1", "--audit-model", model,
			"--bootstrap", head.addr}, netArgs...)...)
		var res genResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("generate --json: %v\n%s", err, out)
		}
		if res.Text != want {
			t.Fatalf("generation %d through the mixed route differs from --local\nswarm %q\nlocal %q", i, res.Text, want)
		}
		var route []string
		for _, h := range res.Route {
			route = append(route, fmt.Sprintf("%s[%d,%d)", nodes[h.Peer], h.Start, h.End))
		}
		if len(res.Route) != 3 {
			t.Fatalf("route %v: want the three platforms' hops", route)
		}
		a := res.Audit
		if a == nil {
			t.Fatalf("generation %d was not audited (--audit-rate 1)", i)
		}
		plat := nodes[a.Peer]
		t.Logf("generation %d (%.1f s, %.0f ms/token) over %v: audit of the %s hop: %s exact=%v windows=%d %s",
			i, time.Since(start).Seconds(), res.MsPerToken, route, plat, a.Outcome, a.Exact, a.Windows, a.Reason)
		switch {
		case a.Outcome != "passed": // cached epochs too: the replay feeds the adopted inputs
			t.Fatalf("audit of the %s hop: %s (%s)", plat, a.Outcome, a.Reason)
		case plat == win.plat && !a.Exact:
			t.Errorf("the Windows hop's audit was not exact: its kernel class differs from the Linux auditor's")
		case plat == arm.plat && a.Exact:
			t.Errorf("the ARM64 hop's audit was exact: its kernel class equals the amd64 auditor's?")
		}
		audited[plat] = true
	}
	if len(audited) < 3 {
		t.Fatalf("hops audited: %v; want all three", audited)
	}
}

// advertisedClasses is each platform's kernel class as the swarm's
// status (the nodes' adverts) shows it, once every node's advert is in.
func advertisedClasses(t *testing.T, x xbin, nodes map[string]string, args []string) map[string]string {
	t.Helper()
	var doc struct {
		Models []struct {
			Shards []struct {
				Peer        string `json:"peer"`
				KernelClass string `json:"kernel_class"`
			} `json:"shards"`
		} `json:"models"`
	}
	classes := map[string]string{}
	for deadline := time.Now().Add(time.Minute); len(classes) < len(nodes) && time.Now().Before(deadline); time.Sleep(time.Second) {
		out := x.output(t, append([]string{"status", "--json"}, args...)...)
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("status --json: %v\n%s", err, out)
		}
		for _, m := range doc.Models {
			for _, sh := range m.Shards {
				classes[nodes[sh.Peer]] = sh.KernelClass
			}
		}
	}
	return classes
}

// TestPlatformWindowsDataDir: on Windows the default data dir is
// %LOCALAPPDATA%\meshp2p: under wine C:\users\<user>\AppData\Local\meshp2p
// of the prefix (wine sets LOCALAPPDATA from its profile).
func TestPlatformWindowsDataDir(t *testing.T) {
	x := crossBin(t, "windows-amd64")
	glob := filepath.Join(os.Getenv("MESHP2P_WINEPREFIX"), "drive_c", "users", "*", "AppData", "Local", "meshp2p")
	clean := func() {
		dirs, _ := filepath.Glob(glob)
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
	clean()
	t.Cleanup(clean)
	c := exec.Command(x.path, "key", "show")
	c.Env = append(os.Environ(), "MESHP2P_DATA_DIR=")
	out, err := c.CombinedOutput()
	keys, _ := filepath.Glob(filepath.Join(glob, "identity.key"))
	if err != nil || len(keys) != 1 || !strings.Contains(string(out), `\AppData\Local\meshp2p\identity.key`) {
		t.Fatalf("key show: %v; identity files %v\n%s", err, keys, out)
	}
	t.Logf("%s", out)
}

// TestPlatformDist: make dist's archives (MESHP2P_DIST="DIR VERSION",
// make test-platforms packs them): one per built platform, named
// meshp2p-VERSION-PLATFORM.tar.gz (.zip for Windows), holding the binary
// that was tested (built with -trimpath: no path of the clone in it), the
// README, the demo model and the license files, with its SHA-256 in
// DIR/SHA256SUMS.
func TestPlatformDist(t *testing.T) {
	dir, version, ok := strings.Cut(os.Getenv("MESHP2P_DIST"), " ")
	if !ok {
		t.Skip(`MESHP2P_DIST ("DIR VERSION") is not set: make test-platforms packs the archives and runs this`)
	}
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	for _, plat := range []string{"linux-amd64", "linux-arm64", "windows-amd64"} {
		t.Run(plat, func(t *testing.T) {
			exe, ext := "", ".tar.gz"
			if strings.HasPrefix(plat, "windows") {
				exe, ext = ".exe", ".zip"
			}
			bin, err := os.ReadFile(filepath.Join(os.Getenv("MESHP2P_CROSS_BIN"), "meshp2p-"+plat+exe))
			if err != nil {
				t.Skipf("%s was not built: %v", plat, err)
			}
			name := "meshp2p-" + version + "-" + plat
			archive, err := os.ReadFile(filepath.Join(dir, name+ext))
			if err != nil {
				t.Fatal(err)
			}
			files := archiveFiles(t, archive, ext)
			for _, f := range []string{"meshp2p" + exe, "README.md", "PLATFORMS.md", "models/stories260K.gguf", "LICENSES/llama.cpp.txt",
				"LICENSES/github.com_ollama_ollama-LICENSE.txt", "LICENSES/stories260K-model.md", "LICENSES/go.txt"} {
				if _, ok := files[name+"/"+f]; !ok {
					t.Errorf("%s%s lacks %s", name, ext, f)
				}
			}
			if sha256hex(files[name+"/meshp2p"+exe]) != sha256hex(bin) {
				t.Errorf("%s%s: its binary is not the tested bin/cross one", name, ext)
			}
			// -trimpath: no path of the build machine in a release binary.
			if root, err := filepath.Abs(filepath.Join("..", "..")); err != nil || bytes.Contains(bin, []byte(root+"/")) {
				t.Errorf("the %s binary holds this clone's path %s (built without -trimpath?)", plat, root)
			}
			if !strings.Contains(string(sums), sha256hex(archive)+"  "+name+ext+"\n") {
				t.Errorf("SHA256SUMS has no line for %s%s with its sum %s:\n%s", name, ext, sha256hex(archive), sums)
			}
			t.Logf("%s%s: %d files, %.1f MiB", name, ext, len(files), float64(len(archive))/(1<<20))
		})
	}
}

// archiveFiles reads a .tar.gz or .zip into memory: path → content.
func archiveFiles(t *testing.T, b []byte, ext string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	if ext == ".zip" {
		zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range zr.File {
			rc, err := f.Open()
			if err != nil {
				t.Fatal(err)
			}
			files[f.Name], err = io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		return files
	}
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if files[h.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
	}
}

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
