package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/neuron-tai/meshp2p/engine"
)

// deviceFlags choose where a command runs layers: --device and
// --backend-dir (docs/gpu.md).
type deviceFlags struct {
	device, backendDir string
}

func (d *deviceFlags) register(fs *flag.FlagSet, what string) {
	fs.StringVar(&d.device, "device", "", what+": cpu, vulkan0, cuda0, ... (default: the fastest real device found — the discrete GPU with the most memory whose backend library is loaded, else the CPU; integrated GPUs and software devices such as lavapipe only when named; meshp2p version lists them)")
	fs.StringVar(&d.backendDir, "backend-dir", "", "directories holding GPU backend libraries built by make gpu (libggml-vulkan.so and its .meshp2p stamp), separated by ':' (default: $MESHP2P_BACKEND_DIR, else lib/ beside the executable and ../lib/meshp2p)")
}

// dirs are the backend directories to load.
func (d *deviceFlags) dirs() []string {
	if d.backendDir != "" {
		return filepath.SplitList(d.backendDir)
	}
	return engine.DefaultBackendDirs()
}

// choose loads the backend libraries (unless the CPU is named) and
// returns the device, saying on log which one and why.
func (d *deviceFlags) choose(log *slog.Logger) (engine.Device, error) {
	name := strings.ToLower(strings.TrimSpace(d.device))
	if name == "cpu" {
		dev, err := engine.SelectDevice("cpu")
		return dev, err
	}
	libs := engine.LoadBackends(d.dirs()...)
	for _, lib := range libs {
		if lib.Err != nil {
			log.Warn("backend library not loaded", "path", lib.Path, "err", lib.Err)
		}
	}
	dev, err := engine.SelectDevice(name)
	if err != nil {
		return engine.Device{}, fmt.Errorf("--device %s: %w", d.device, err)
	}
	switch {
	case name != "" && name != "auto":
		log.Info("device", "device", dev.Name, "description", dev.Description, "memory_gib", gib(dev.TotalBytes), "class", dev.Class())
	case dev.IsCPU():
		log.Info("device: the CPU (no GPU found: build a GPU backend with make gpu, docs/gpu.md; software devices run only when named)", "device", dev.Name, "backend_libraries", len(libs))
	default:
		log.Info("device: the fastest found; --device cpu keeps the layers on the CPU", "device", dev.Name, "description", dev.Description, "memory_gib", gib(dev.TotalBytes))
	}
	return dev, nil
}

func gib(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<30)) }

// printDevices lists the backend libraries and devices (meshp2p version).
func printDevices(w io.Writer, dirs []string) {
	libs := engine.LoadBackends(dirs...)
	if len(libs) == 0 {
		fmt.Fprintf(w, "backend libraries: none in %s (make gpu builds one; docs/gpu.md)\n", strings.Join(dirs, ", "))
	}
	for _, lib := range libs {
		st := "loaded"
		if lib.Err != nil {
			st = "NOT loaded: " + lib.Err.Error()
		}
		fmt.Fprintf(w, "backend library: %s %s (%s)\n", lib.Name, lib.Path, st)
	}
	for _, d := range engine.Devices() {
		soft := ""
		if d.Software {
			soft = ", software: used only when named"
		}
		fmt.Fprintf(w, "device: %-8s %s — %s, %s GiB free of %s GiB%s\n", d.Name, d.Description, d.Type, gib(d.FreeBytes), gib(d.TotalBytes), soft)
	}
}
