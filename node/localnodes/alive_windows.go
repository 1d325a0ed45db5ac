package localnodes

import (
	"errors"

	"golang.org/x/sys/windows"
)

// stillActive is the exit code GetExitCodeProcess gives a process that
// has not ended (STILL_ACTIVE).
const stillActive = 259

// Alive reports whether process pid exists and has not ended: a process
// of another user (access denied) exists. Before this, Windows counted
// every pid as alive, so the file of a node that was killed or crashed
// (Task Manager, a closed console) kept taking a share of the CPUs and a
// line in `meshp2p ps` until it was removed by hand.
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return errors.Is(err, windows.ERROR_ACCESS_DENIED)
	}
	defer windows.CloseHandle(h)
	var code uint32
	if err := windows.GetExitCodeProcess(h, &code); err != nil {
		return true
	}
	return code == stillActive
}
