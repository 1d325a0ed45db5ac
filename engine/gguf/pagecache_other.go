//go:build !linux

package gguf

import (
	"context"
	"os"
)

// dropPageCache does nothing where the platform has no posix_fadvise.
func dropPageCache(*os.File) {}

// WarmPages does nothing where the platform has no madvise: the engine's
// mapping reads the file as usual.
func WarmPages(context.Context, string, func(float64)) (int64, error) { return 0, nil }
