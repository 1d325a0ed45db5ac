//go:build !windows

package placement

// hostAvailable: /proc/meminfo and the cgroup limits (Linux; elsewhere
// it fails: pass --memory).
func hostAvailable() (int64, string, error) { return linuxAvailable() }
