package placement

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cgroupV1Unlimited: a cgroup v1 memory.limit_in_bytes at or above this is
// "no limit" (the kernel reports PAGE_COUNTER_MAX pages, 9223372036854771712
// with 4 KiB pages).
const cgroupV1Unlimited = 1 << 62

// cgroupV1Room is memory.limit_in_bytes − memory.usage_in_bytes of this
// process's cgroup v1 memory controller (false when there is none, or no
// limit). Docker on a cgroup v1 host (Debian's docker.io 20.10 here) puts
// a container's mem_limit there, and mounts the container's own cgroup at
// /sys/fs/cgroup/memory while /proc/self/cgroup still names the host path
// (/docker/<id>): the path is tried first, then the mount's root.
func cgroupV1Room() (int64, bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	dir, ok := CgroupV1MemoryPath(string(b))
	if !ok {
		return 0, false
	}
	for _, base := range []string{filepath.Join("/sys/fs/cgroup/memory", dir), "/sys/fs/cgroup/memory"} {
		lim, err := os.ReadFile(filepath.Join(base, "memory.limit_in_bytes"))
		if err != nil {
			continue
		}
		use, _ := os.ReadFile(filepath.Join(base, "memory.usage_in_bytes"))
		return CgroupV1Room(string(lim), string(use))
	}
	return 0, false
}

// CgroupV1MemoryPath is the memory controller's path in a /proc/self/cgroup
// ("4:memory:/docker/abc", or "3:cpu,memory:/x").
func CgroupV1MemoryPath(procCgroup string) (string, bool) {
	for _, l := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) == 3 {
			for _, c := range strings.Split(f[1], ",") {
				if c == "memory" {
					return f[2], true
				}
			}
		}
	}
	return "", false
}

// CgroupV1Room is what memory.limit_in_bytes leaves given
// memory.usage_in_bytes (false for the "unlimited" value or a file that
// does not parse).
func CgroupV1Room(limit, usage string) (int64, bool) {
	l, err := strconv.ParseInt(strings.TrimSpace(limit), 10, 64)
	if err != nil || l >= cgroupV1Unlimited {
		return 0, false
	}
	return CgroupRoom(limit, usage)
}
