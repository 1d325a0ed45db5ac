package main

import (
	"context"
	"errors"
	"io"
)

// runGenerate is a placeholder until the generate subcommand lands.
func runGenerate(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	return errors.New("not implemented yet")
}
