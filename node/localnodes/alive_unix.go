//go:build unix

package localnodes

import "syscall"

// Alive reports whether process pid exists.
func Alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
