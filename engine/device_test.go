package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testgpu"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// vulkanDevice loads make gpu's Vulkan library and returns vulkan0 (on
// machines without a GPU: Mesa's lavapipe, a software device that is used
// only when named, as here).
func vulkanDevice(t testing.TB) Device {
	t.Helper()
	dir := testgpu.Dir(t, "vulkan")
	for _, lib := range LoadBackends(dir) {
		if lib.Name == "vulkan" && lib.Err != nil {
			testgpu.Missing(t, fmt.Sprintf("loading %s: %v", lib.Path, lib.Err))
		}
	}
	d, err := SelectDevice("vulkan0")
	if err != nil {
		testgpu.Missing(t, err.Error())
	}
	t.Logf("device %s: kernel class %s", d, d.KernelClass())
	return d
}

func TestDevicesAndNames(t *testing.T) {
	vulkan := false // with the Vulkan library loaded when make gpu built it
	if d := os.Getenv("MESHP2P_BACKEND_DIR"); d != "" || os.Getenv("MESHP2P_GPU_TESTS") == "require" {
		vulkanDevice(t)
		vulkan = true
	}
	devs := Devices()
	if len(devs) == 0 || devs[0].Name != "cpu" || !devs[0].IsCPU() || devs[0].TotalBytes == 0 {
		t.Fatalf("devices %+v: want the CPU first, with its memory", devs)
	}
	for _, name := range []string{"cpu", "CPU", " cpu "} {
		if d, err := SelectDevice(name); err != nil || !d.IsCPU() {
			t.Fatalf("SelectDevice(%q) = %v, %v", name, d, err)
		}
	}
	d, err := SelectDevice("")
	if err != nil || d.Software {
		t.Fatalf("default device %v, %v: never a software device", d, err)
	}
	vk9 := "no vulkan backend library is loaded"
	if vulkan {
		vk9 = "found no such device"
	}
	for _, tc := range []struct{ name, want string }{
		{"vulkan9", vk9},
		{"cuda0", "no cuda backend library is loaded"},
		{"tpu", `no device "tpu" (this machine has: cpu`},
	} {
		_, err := SelectDevice(tc.name)
		var nd *NoDeviceError
		if !errors.Is(err, ErrNoDevice) || !errors.As(err, &nd) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("SelectDevice(%q) = %v: want ErrNoDevice naming %q", tc.name, err, tc.want)
		}
	}
	if err := (Device{Name: "x", FreeBytes: 1 << 20, TotalBytes: 1 << 21}).CheckFits(2 << 20); !errors.Is(err, ErrDeviceMemory) {
		t.Fatalf("CheckFits over free memory: %v", err)
	}
}

// TestBackendLibraryRefused: a library without a stamp, with another
// revision's stamp, or that ggml cannot load is refused with
// ErrBackendLib, and a device of that backend then names the reason.
func TestBackendLibraryRefused(t *testing.T) {
	for _, tc := range []struct {
		name, stamp, want string
	}{
		{"nostamp", "", "has no stamp"},
		{"revision", "ollama v0.0.1 llama.cpp 0000000", "was built from"},
		{"garbage", BackendStamp(), "could not load"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			lib := filepath.Join(dir, "libggml-fakegpu"+tc.name+".so")
			if err := os.WriteFile(lib, []byte("not an ELF file"), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.stamp != "" {
				if err := os.WriteFile(lib+".meshp2p", []byte(tc.stamp+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var got *BackendLib
			for _, l := range LoadBackends(dir) {
				if l.Path == lib {
					got = &l
				}
			}
			if got == nil || !errors.Is(got.Err, ErrBackendLib) || !strings.Contains(got.Err.Error(), tc.want) {
				t.Fatalf("library %+v: want ErrBackendLib saying %q", got, tc.want)
			}
			_, err := SelectDevice("fakegpu" + tc.name + "0")
			if !errors.Is(err, ErrNoDevice) || !errors.Is(err, ErrBackendLib) {
				t.Fatalf("device of a refused backend: %v", err)
			}
		})
	}
}

// TestVulkanParity: on the Vulkan device, the whole model and its 2- and
// 3-shard chains give identical tokens and bit-identical logits, per
// architecture and weight type (the same batches reach every layer).
func TestVulkanParity(t *testing.T) {
	dev := vulkanDevice(t)
	dir := t.TempDir()
	prompt := []int32{1, 300, 311, 262, 290, 340, 259, 371, 301, 302, 303, 280}
	for _, m := range parityModels {
		if m.name == "qwen3moe_q4_k_m" {
			// Its first decode on lavapipe takes ~3 minutes (the MoE
			// k-quant pipelines' LLVM compile); qwen3moe_q8_0 covers
			// MoE and llama/qwen2 q4_k_m the k-quants.
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			checkParityOn(t, dev, makeParityModel(t, m, dir), prompt, 8)
		})
	}
	t.Run("stories260K", func(t *testing.T) {
		checkParityOn(t, dev, testmodels.Path(t, "stories260K.gguf"), []int32{1, 403, 407, 283, 261, 327}, 16)
	})
}

// loadMixed splits path len(devs) ways and opens shard i on devs[i].
func loadMixed(t testing.TB, path string, devs []Device) []*Shard {
	t.Helper()
	var out []*Shard
	for i, dev := range devs {
		out = append(out, loadShardsOn(t, dev, path, len(devs), parityCfg)[i])
	}
	return out
}

// TestMixedRouteTolerance measures a route that mixes the Vulkan device
// with the CPU against the whole model on the CPU, over several
// architectures, weight types and prompts: the largest logit difference
// must stay under MixedTolerance, and the figures (max |Δlogit|, greedy
// agreement) are what docs/gpu.md reports.
func TestMixedRouteTolerance(t *testing.T) {
	vk := vulkanDevice(t)
	cpu := Device{}
	ctx := context.Background()
	dir := t.TempDir()
	models := map[string]string{"stories260K": testmodels.Path(t, "stories260K.gguf")}
	// make gpu-tolerance measures every model (about 8 minutes on
	// lavapipe); make test the quick two.
	full := os.Getenv("MESHP2P_GPU_TOLERANCE") == "full"
	for _, m := range parityModels {
		switch m.name {
		case "qwen2_f32":
			models[m.name] = makeParityModel(t, m, dir)
		case "llama_q4_k_m", "qwen3moe_q8_0":
			if full {
				models[m.name] = makeParityModel(t, m, dir)
			}
		}
	}
	const steps = 16
	for name, path := range models {
		t.Run(name, func(t *testing.T) {
			ref := loadShards(t, path, 1, parityCfg)
			routes := map[string][]*Shard{
				"vulkan,cpu,cpu": loadMixed(t, path, []Device{vk, cpu, cpu}),
				"cpu,vulkan,cpu": loadMixed(t, path, []Device{cpu, vk, cpu}),
				"vulkan,vulkan":  loadMixed(t, path, []Device{vk, vk}),
			}
			for rname, chain := range routes {
				var worst float64
				agree, total, same := 0, 0, 0
				for p := range 12 {
					prompt := []int32{1}
					for j := range 4 + p%5 {
						prompt = append(prompt, int32(260+(p*37+j*11)%100)) // under every test vocabulary's 372
					}
					want, err := RunChain(ctx, ref, prompt, ChainOptions{Steps: steps, Logits: true})
					if err != nil {
						t.Fatal(err)
					}
					got, err := RunChain(ctx, chain, prompt, ChainOptions{Steps: steps, Logits: true})
					if err != nil {
						t.Fatal(err)
					}
					equal := true
					for i := range want.Tokens {
						if got.Tokens[i] != want.Tokens[i] {
							equal = false
							break // later steps see other contexts
						}
						worst = max(worst, MaxAbsDiff(got.Logits[i], want.Logits[i]))
						agree++
					}
					total += len(want.Tokens)
					if equal {
						same++
					}
				}
				t.Logf("%s vs cpu whole: max |Δlogit| %.3g, greedy agreement %d/%d tokens, %d/12 generations identical", rname, worst, agree, total, same)
				if worst > MixedTolerance {
					t.Fatalf("%s: max |Δlogit| %.3g over the documented %g", rname, worst, MixedTolerance)
				}
			}
		})
	}
}

// TestVulkanHopPassesCrossClassAudit: an honest Vulkan hop audited by a
// CPU replay (another kernel class: the sketch tolerance of verified
// hops) is never convicted, nor a CPU hop by a Vulkan replay — on every
// prefill and decode row of the first shard of each model.
func TestVulkanHopPassesCrossClassAudit(t *testing.T) {
	vk := vulkanDevice(t)
	dir := t.TempDir()
	models := map[string]string{"stories260K": testmodels.Path(t, "stories260K.gguf")}
	for _, m := range parityModels {
		switch m.name {
		case "qwen2_f32", "llama_q8_0", "qwen3moe_f32":
			models[m.name] = makeParityModel(t, m, dir)
		}
	}
	ctx := context.Background()
	for name, path := range models {
		t.Run(name, func(t *testing.T) {
			rows := func(dev Device) [][]float32 {
				s := loadShardsOn(t, dev, path, 2, parityCfg)[0]
				x, err := s.OpenSession(SessionKey{ID: [16]byte{7}}, SessionParams{KVTokens: 64})
				if err != nil {
					t.Fatal(err)
				}
				defer x.Close()
				var out [][]float32
				toks := []int32{1, 300, 311, 262, 290, 340, 259, 371}
				pos := 0
				for i, in := range [][]int32{toks, {301}, {302}, {303}} {
					o, err := x.Forward(ctx, Input{Pos: pos, Tokens: in})
					if err != nil {
						t.Fatalf("forward %d: %v", i, err)
					}
					pos += len(in)
					w := len(o.Hidden) / len(in)
					for r := range in {
						out = append(out, o.Hidden[r*w:(r+1)*w])
					}
				}
				return out
			}
			cpu, gpu := rows(Device{}), rows(vk)
			var worst float64
			for i := range cpu {
				for _, pair := range [][2][]float32{{gpu[i], cpu[i]}, {cpu[i], gpu[i]}} {
					signed, replay := pair[0], pair[1]
					if why := session.SketchTolerance.Compare([]*meshp2pb.SketchRow{session.SketchRow(signed, session.SketchK)}, [][]float32{replay}); why != "" {
						t.Fatalf("row %d: an honest hop would be convicted across cpu/vulkan: %s", i, why)
					}
				}
				var scale float64
				for _, v := range cpu[i] {
					scale = max(scale, math.Abs(float64(v)))
				}
				worst = max(worst, MaxAbsDiff(cpu[i], gpu[i])/scale)
			}
			t.Logf("%s: %d rows, max |Δhidden| %.2g of the row's largest value (tolerance %g)", name, len(cpu), worst, session.SketchTolerance.Abs)
		})
	}
}

// TestBackendLoadedOnce: a second copy of a loaded backend (bin/lib and
// .cache/gpu/lib, say) is not registered again, so devices are not listed
// twice under the same names.
func TestBackendLoadedOnce(t *testing.T) {
	vulkanDevice(t)
	dir := t.TempDir()
	src := filepath.Join(testgpu.Dir(t, "vulkan"), "libggml-vulkan.so")
	for _, f := range []string{"", ".meshp2p"} {
		b, err := os.ReadFile(src + f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "libggml-vulkan.so"+f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n := len(Devices())
	found := false
	for _, l := range LoadBackends(dir) {
		if strings.HasPrefix(l.Path, dir) {
			found = true
			if !errors.Is(l.Err, ErrBackendLib) || !strings.Contains(l.Err.Error(), "already loaded") {
				t.Fatalf("second copy: %+v", l)
			}
		}
	}
	if !found {
		t.Fatalf("the second copy in %s was not seen", dir)
	}
	if m := len(Devices()); m != n {
		t.Fatalf("%d devices after loading a second copy, %d before", m, n)
	}
}
