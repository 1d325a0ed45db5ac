package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
)

const keyUsage = `Usage:
  meshp2p key show [--data-dir DIR]   print this node's peer id (creates the identity if absent)
  meshp2p key swarm-gen [-o FILE]     write a new private-swarm key (default ./swarm.key; "-" for stdout)
`

// runKey implements "meshp2p key show|swarm-gen".
func runKey(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: key needs a subcommand (show or swarm-gen)", errUsage)
	}
	switch args[0] {
	case "show":
		return runKeyShow(stdout, stderr, args[1:])
	case "swarm-gen":
		return runKeySwarmGen(stdout, stderr, args[1:])
	case "-h", "--help", "help":
		fmt.Fprint(stdout, keyUsage)
		return nil
	default:
		return fmt.Errorf("%w: unknown key subcommand %q", errUsage, args[0])
	}
}

func runKeyShow(stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("key show", stdout, "")
	dataDir := fs.String("data-dir", defaultDataDir(), "node data directory (holds "+p2p.IdentityFile+")")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *dataDir == "" {
		return fmt.Errorf("%w: --data-dir is required (no home directory found)", errUsage)
	}
	key, created, err := p2p.LoadOrCreateIdentity(*dataDir)
	if err != nil {
		return err
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return fmt.Errorf("deriving peer id: %w", err)
	}
	if created {
		fmt.Fprintf(stderr, "created new identity %s\n", filepath.Join(*dataDir, p2p.IdentityFile))
	}
	fmt.Fprintln(stdout, id)
	return nil
}

func runKeySwarmGen(stdout, stderr io.Writer, args []string) error {
	fset := cmdFlagSet("key swarm-gen", stdout, "")
	out := fset.String("o", "swarm.key", `output file ("-" writes to stdout); never overwritten`)
	if err := parseFlags(fset, args); err != nil {
		return err
	}
	if *out == "-" {
		key, err := p2p.GenerateSwarmKey()
		if err != nil {
			return err
		}
		psk, err := p2p.DecodeSwarmKey(key)
		if err != nil {
			return err
		}
		if _, err := stdout.Write(key); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "swarm key fingerprint %s\n", p2p.SwarmKeyFingerprint(psk))
		return nil
	}
	fp, err := p2p.WriteSwarmKey(*out)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s already exists; refusing to overwrite it", *out)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (fingerprint %s); give it to every member and start nodes with --swarm-key %s (private swarms are TCP-only)\n", *out, fp, *out)
	return nil
}

// parseFlags parses args and rejects positional arguments; usage errors wrap
// errUsage, --help returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return nil
}

// defaultDataDir is $MESHP2P_DATA_DIR, else %LOCALAPPDATA%\meshp2p on
// Windows (per user, not roamed: keys and shard caches stay on the
// machine), else ~/.meshp2p ("" if there is no home directory).
func defaultDataDir() string {
	if d := os.Getenv("MESHP2P_DATA_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("LOCALAPPDATA"); d != "" && runtime.GOOS == "windows" {
		return filepath.Join(d, "meshp2p")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".meshp2p")
}
