package main

import (
	"context"
	"errors"
	"io"
)

// runShardVerify implements "meshp2p shard verify". Placeholder: the lead
// replaces it (gguf.VerifyShard / gguf.CheckShard do the digest checks).
func runShardVerify(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	return errors.New("not implemented yet")
}
