package testnet

import (
	"errors"
	"syscall"
)

// groupAttr puts a namespace process into its own process group (killed
// as a whole) and SIGKILLs it if we die (the signal survives the exec by
// `ip netns exec`).
func groupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killPID sends SIGKILL to pid (a negative pid: its process group).
func killPID(pid int) { _ = syscall.Kill(pid, syscall.SIGKILL) }

// pidExists reports whether signal 0 reaches pid (EPERM: it exists).
func pidExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
