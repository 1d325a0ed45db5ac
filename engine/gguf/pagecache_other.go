//go:build !linux

package gguf

import "os"

// dropPageCache does nothing where the platform has no posix_fadvise.
func dropPageCache(*os.File) {}
