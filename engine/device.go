package engine

/*
#cgo !windows LDFLAGS: -rdynamic -ldl
#include <stdlib.h>
#include "ggml-backend.h"
#include "vkenum.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// Errors a caller branches on when choosing a device.
var (
	// ErrNoDevice: the named device does not exist on this machine (or
	// its backend library is not loaded).
	ErrNoDevice = errors.New("engine: no such device")
	// ErrBackendLib: a backend library is missing, fails to load, or was
	// built from other sources than this binary (its stamp).
	ErrBackendLib = errors.New("engine: backend library")
	// ErrDeviceMemory: what is to be loaded does not fit the device.
	ErrDeviceMemory = errors.New("engine: not enough device memory")
)

// Device is a compute device in ggml's backend registry: the CPU, or one
// that a backend library loaded by LoadBackends brought (Vulkan, CUDA).
type Device struct {
	// Name is how users name it: "cpu", "vulkan0", "cuda1" (ggml's
	// device name, lower-cased).
	Name string
	// Backend is ggml's registry name: "CPU", "Vulkan", "CUDA".
	Backend     string
	Description string
	// Type: "cpu", "gpu", "igpu" or "accel".
	Type string
	// Software: a GPU API device that runs on the CPU (Mesa's lavapipe,
	// SwiftShader): never chosen unless named.
	Software   bool
	FreeBytes  uint64
	TotalBytes uint64
	dev        C.ggml_backend_dev_t
}

// IsCPU reports whether d is ggml's CPU device (also the zero Device).
func (d Device) IsCPU() bool { return d.Type == "" || d.Type == "cpu" }

// Class is the backend class users and adverts see: "cpu", "vulkan",
// "cuda", "metal".
func (d Device) Class() string {
	if d.IsCPU() {
		return "cpu"
	}
	return strings.ToLower(d.Backend)
}

// KernelClass is engine.KernelClass for the CPU; for another device, its
// backend, the device (model and driver as the backend describes it) and
// the llama.cpp revision: hops of one class compute alike (docs/gpu.md
// says how far), across classes only to a tolerance.
func (d Device) KernelClass() string {
	if d.IsCPU() {
		return KernelClass()
	}
	desc := d.Description
	if len(desc) > maxClassDevice {
		desc = desc[:maxClassDevice] // adverts bound the class (route.MaxKernelClass)
	}
	return fmt.Sprintf("%s/%s/llama.cpp@%s/fa", d.Class(), desc, llamaCommit)
}

// maxClassDevice bounds the device description in a kernel class, so the
// class stays within what adverts carry (256 bytes).
const maxClassDevice = 160

func (d Device) String() string {
	s := fmt.Sprintf("%s (%s", d.Name, d.Description)
	if d.TotalBytes > 0 {
		s += fmt.Sprintf(", %.1f GiB", float64(d.TotalBytes)/(1<<30))
	}
	if d.Software {
		s += ", software"
	}
	return s + ")"
}

// BackendLib is a backend library LoadBackends found.
type BackendLib struct {
	Name string // "vulkan", "cuda"
	Path string
	Err  error // nil: loaded
}

// backendLibs records what LoadBackends did. ggml's backend registry is
// process-wide (a library loaded once serves every model and shard), so
// this mirrors it; it is not configuration.
var backendLibs struct {
	sync.Mutex
	loaded map[string]BackendLib // by path
	order  []string
	dirs   []string // searched so far
	// software names the Vulkan devices the system's loader types as CPU.
	software map[string]bool
}

// BackendStamp is what the stamp file beside a backend library
// (<library>.meshp2p, written by make gpu) must say: the sources it was
// built from. The library runs against this binary's ggml (exported
// with -rdynamic), so any other revision is refused before it is loaded.
func BackendStamp() string { return "ollama " + ollamaVersion + " llama.cpp " + llamaCommit }

// DefaultBackendDirs are where LoadBackends looks unless told otherwise:
// $MESHP2P_BACKEND_DIR (a list), else lib/ beside the executable and
// ../lib/meshp2p from it (where make gpu and an install put them).
func DefaultBackendDirs() []string {
	if v := os.Getenv("MESHP2P_BACKEND_DIR"); v != "" {
		return filepath.SplitList(v)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	d := filepath.Dir(exe)
	return []string{filepath.Join(d, "lib"), filepath.Join(d, "..", "lib", "meshp2p")}
}

// LoadBackends loads the backend libraries (libggml-<name>.so, CPU and
// base excepted) in dirs into ggml's registry, each file once per
// process, and returns every library it has seen, loaded or not (Err says
// why not: no stamp, another revision, a load failure such as a missing
// libvulkan1). A missing directory is not an error.
func LoadBackends(dirs ...string) []BackendLib {
	backendLibs.Lock()
	defer backendLibs.Unlock()
	if backendLibs.loaded == nil {
		backendLibs.loaded = map[string]BackendLib{}
		backendLibs.software = map[string]bool{}
	}
	for _, dir := range dirs {
		if !slices.Contains(backendLibs.dirs, dir) {
			backendLibs.dirs = append(backendLibs.dirs, dir)
		}
		paths, _ := filepath.Glob(filepath.Join(dir, "libggml-*.so"))
		slices.Sort(paths)
		for _, p := range paths {
			name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "libggml-"), ".so")
			if name == "base" || name == "cpu" || strings.HasPrefix(name, "cpu-") {
				continue
			}
			abs, err := filepath.Abs(p)
			if err != nil {
				abs = p
			}
			if _, ok := backendLibs.loaded[abs]; ok {
				continue
			}
			lib := BackendLib{Name: name, Path: abs}
			for _, q := range backendLibs.order {
				if o := backendLibs.loaded[q]; o.Name == name && o.Err == nil {
					// One registration per backend: a second would list
					// every device twice under the same names.
					lib.Err = fmt.Errorf("%w: %s not loaded: the %s backend is already loaded from %s", ErrBackendLib, abs, name, o.Path)
				}
			}
			if lib.Err == nil {
				lib.Err = loadBackendLib(name, abs)
			}
			backendLibs.loaded[abs] = lib
			backendLibs.order = append(backendLibs.order, abs)
		}
	}
	out := make([]BackendLib, 0, len(backendLibs.order))
	for _, p := range backendLibs.order {
		out = append(out, backendLibs.loaded[p])
	}
	return out
}

// loadBackendLib checks a library's stamp and loads it. Called with
// backendLibs held.
func loadBackendLib(name, path string) error {
	stamp, err := os.ReadFile(path + ".meshp2p")
	if err != nil {
		return fmt.Errorf("%w: %s has no stamp (%s.meshp2p): not built by make gpu for this binary; rebuild it with make gpu", ErrBackendLib, path, filepath.Base(path))
	}
	if got := strings.TrimSpace(string(stamp)); got != BackendStamp() {
		return fmt.Errorf("%w: %s was built from %q, this binary is %q: rebuild it with make gpu", ErrBackendLib, path, got, BackendStamp())
	}
	if name == "vulkan" {
		vulkanVisibility()
	}
	initBackend()
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	if C.ggml_backend_load(cp) == nil {
		return fmt.Errorf("%w: ggml could not load %s (see the log above: a missing driver library such as libvulkan1?)", ErrBackendLib, path)
	}
	return nil
}

// vulkanVisibility lists the system's Vulkan devices before ggml-vulkan
// starts and remembers which are software (CPU-type: lavapipe), to show
// them as such and use them only when named. ggml-vulkan hides CPU-type
// devices unless GGML_VK_VISIBLE_DEVICES names them; its own choice
// otherwise (supported GPUs only, one driver per GPU) is better than any
// list, so the engine names devices only on a machine whose devices are
// all CPU-type (a machine without a GPU, CI), and never over the user's
// setting. Called with backendLibs held, before ggml-vulkan starts
// (LoadBackends is meant to run at start, before models load).
func vulkanVisibility() {
	var devs [64]C.mp_vk_device
	n := int(C.mp_vk_enumerate(&devs[0], C.int(len(devs))))
	var idx []string
	allCPU := n > 0
	for i := 0; i < n; i++ {
		if devs[i]._type == 4 { // VK_PHYSICAL_DEVICE_TYPE_CPU
			backendLibs.software[C.GoString(&devs[i].name[0])] = true
		} else {
			allCPU = false
		}
		idx = append(idx, strconv.Itoa(i))
	}
	if _, set := os.LookupEnv("GGML_VK_VISIBLE_DEVICES"); !set && allCPU {
		os.Setenv("GGML_VK_VISIBLE_DEVICES", strings.Join(idx, ","))
	}
	// Fused kernels (add+rms_norm, multi-add, MoE top-k) round
	// differently from the ops they replace, and a fusion that spans two
	// layers cannot happen where a shard ends: with them a shard chain
	// would differ from the whole model. Off, unless the user says.
	for _, k := range vulkanExactEnv {
		if _, set := os.LookupEnv(k); !set {
			os.Setenv(k, "1")
		}
	}
}

// vulkanExactEnv are ggml-vulkan's switches the engine turns on so that
// a shard chain computes what the whole model computes (docs/gpu.md).
var vulkanExactEnv = []string{"GGML_VK_DISABLE_FUSION", "GGML_VK_DISABLE_MULTI_ADD"}

// Devices lists the devices in ggml's registry: the CPU, then what the
// loaded backend libraries found, with their memory as the backend
// reports it now.
func Devices() []Device {
	initBackend()
	backendLibs.Lock()
	soft := maps.Clone(backendLibs.software)
	backendLibs.Unlock()
	var out []Device
	for i := 0; i < int(C.ggml_backend_dev_count()); i++ {
		dev := C.ggml_backend_dev_get(C.size_t(i))
		var free, total C.size_t
		C.ggml_backend_dev_memory(dev, &free, &total)
		d := Device{
			Name:        strings.ToLower(C.GoString(C.ggml_backend_dev_name(dev))),
			Backend:     C.GoString(C.ggml_backend_reg_name(C.ggml_backend_dev_backend_reg(dev))),
			Description: strings.TrimSpace(C.GoString(C.ggml_backend_dev_description(dev))),
			FreeBytes:   uint64(free), TotalBytes: uint64(total), dev: dev,
		}
		switch C.ggml_backend_dev_type(dev) {
		case C.GGML_BACKEND_DEVICE_TYPE_CPU:
			d.Type = "cpu"
		case C.GGML_BACKEND_DEVICE_TYPE_GPU:
			d.Type = "gpu"
		case C.GGML_BACKEND_DEVICE_TYPE_IGPU:
			d.Type = "igpu"
		default:
			d.Type = "accel"
		}
		d.Software = soft[d.Description]
		if d.Type == "accel" {
			continue // BLAS-like helpers of the CPU, not a place for layers
		}
		out = append(out, d)
	}
	return out
}

// SelectDevice returns the device named name ("cpu", "vulkan0", ...;
// case does not matter). "" or "auto" picks the fastest real device it
// can tell: a discrete GPU before an integrated one, more memory first,
// the CPU when there is none; software devices only when named. An
// unknown name gets ErrNoDevice listing what there is, and, when the
// backend it needs did not load, why.
func SelectDevice(name string) (Device, error) {
	devs := Devices()
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" || name == "auto" {
		// Discrete GPUs only: an integrated one shares the host's memory
		// and is often slower than the CPU it sits beside; name it to
		// use it.
		best := devs[0]
		for _, d := range devs {
			if d.Type != "gpu" || d.Software {
				continue
			}
			if best.Type == "cpu" || d.TotalBytes > best.TotalBytes {
				best = d
			}
		}
		return best, nil
	}
	for _, d := range devs {
		if d.Name == name {
			return d, nil
		}
	}
	var have []string
	for _, d := range devs {
		have = append(have, d.Name)
	}
	e := &NoDeviceError{Name: name, Have: have}
	backend := strings.TrimRight(name, "0123456789")
	for _, lib := range LoadBackends() {
		// A loaded copy explains more than a refused one.
		if lib.Name == backend && (e.Lib.Path == "" || e.Lib.Err != nil && lib.Err == nil) {
			e.Lib = lib
		}
	}
	if e.Lib.Path != "" {
		return Device{}, e
	}
	e.Lib.Name = backend
	backendLibs.Lock()
	e.Searched = slices.Clone(backendLibs.dirs)
	backendLibs.Unlock()
	return Device{}, e
}

// NoDeviceError says which device was asked for, what there is, and why
// its backend has none: not built, not loaded (Lib.Err), or no such index.
type NoDeviceError struct {
	Name string
	Have []string
	Lib  BackendLib // the backend library the name needs ("" Path: none found)
	// Searched are the directories LoadBackends looked in.
	Searched []string
}

func (e *NoDeviceError) Error() string {
	msg := fmt.Sprintf("engine: no device %q (this machine has: %s)", e.Name, strings.Join(e.Have, ", "))
	switch {
	case e.Lib.Err != nil:
		return msg + "; " + e.Lib.Err.Error()
	case e.Lib.Path != "":
		return msg + fmt.Sprintf("; the %s backend (%s) found no such device", e.Lib.Name, e.Lib.Path)
	case e.Lib.Name != "" && e.Lib.Name != "cpu":
		where := "nowhere yet"
		if len(e.Searched) > 0 {
			where = strings.Join(e.Searched, ", ")
		}
		return msg + fmt.Sprintf("; no %s backend library is loaded (searched: %s): build it with `make gpu` (docs/gpu.md), which puts it in bin/lib beside the binary, or name its directory with --backend-dir",
			e.Lib.Name, where)
	}
	return msg
}

func (e *NoDeviceError) Unwrap() []error {
	if e.Lib.Err != nil {
		return []error{ErrNoDevice, e.Lib.Err}
	}
	return []error{ErrNoDevice}
}

// Memory is the device's free and total memory now, as its backend
// reports it (FreeBytes, TotalBytes: when it was listed).
func (d Device) Memory() (free, total uint64) {
	if d.dev == nil {
		return d.FreeBytes, d.TotalBytes
	}
	var f, t C.size_t
	C.ggml_backend_dev_memory(d.dev, &f, &t)
	return uint64(f), uint64(t)
}

// CheckFits returns ErrDeviceMemory when need bytes exceed what d has
// free now (the CPU: its memory as ggml reports it).
func (d Device) CheckFits(need uint64) error {
	d.FreeBytes, d.TotalBytes = d.Memory()
	if d.FreeBytes > 0 && need > d.FreeBytes {
		return fmt.Errorf("%w: %.2f GiB needed, %s has %.2f GiB free of %.2f GiB",
			ErrDeviceMemory, float64(need)/(1<<30), d.Name, float64(d.FreeBytes)/(1<<30), float64(d.TotalBytes)/(1<<30))
	}
	return nil
}

// MixedTolerance bounds the logits of a route that mixes backend classes
// against the CPU's whole model (max |Δlogit|): 2.5× the worst measured
// on lavapipe (0.041, qwen3moe q8_0; docs/gpu.md).
const MixedTolerance = 0.1
