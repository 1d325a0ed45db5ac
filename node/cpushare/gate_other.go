//go:build !unix && !windows

package cpushare

import (
	"errors"
	"os"
)

// mapShared: no shared mapping here; the static share applies.
func mapShared(*os.File, int) ([]byte, func(), error) {
	return nil, nil, errors.New("no shared mapping on this platform")
}
