package main

import (
	"fmt"
	"os"
	"testing"
)

// TestMain points the default data dir ($MESHP2P_DATA_DIR) at a directory
// of this test run: commands the tests run without --data-dir (generate
// and serve keep their client identity and vocabularies there) never
// write into the user's ~/.meshp2p. Processes the tests start inherit it.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "meshp2p-test-data-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("MESHP2P_DATA_DIR", dir)
	// No config file: the tests (and the processes they start) must not
	// read the user's ~/.config/meshp2p/config.toml; TestConfigFileCLI
	// names its own.
	os.Setenv(configEnv, "")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
