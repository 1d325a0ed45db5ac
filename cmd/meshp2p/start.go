package main

import (
	"context"
	"errors"
	"io"
)

// runStart is a placeholder until the start subcommand lands.
func runStart(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	return errors.New("not implemented yet")
}
