package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCount(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	body := func(n int) string { return "{\n" + strings.Repeat("\t_ = 1\n", n-2) + "}\n" }
	write("a/a.go", "package a\n\nfunc short() "+body(80)+"\nfunc long() "+body(81))
	write("a/a_test.go", "package a\n\nfunc longTest() "+body(200)) // tests do not count
	write("a/x.pb.go", "package a\n\nfunc gen() "+body(200))        // nor generated code
	write("node/node.go", "package node\n\ntype Node struct{}\n\nfunc (n *Node) A() {}\nfunc (Node) B() {}\nfunc (o *Other) C() {}\n\ntype Other struct{}\n\ntype windowHost interface {\n\ta()\n\tb(int) error\n}\n")
	write("other/node.go", "package other\n\ntype Node struct{}\n\nfunc (n *Node) D() {}\n") // another package's Node
	c, err := count(root, 80)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.long) != 1 || !strings.Contains(c.long[0], "a/a.go:") || !strings.Contains(c.long[0], "long (81 lines)") {
		t.Fatalf("long functions %v, want only a.long of 81 lines", c.long)
	}
	if c.nodeMethods != 2 {
		t.Fatalf("node.Node methods %d, want 2", c.nodeMethods)
	}
	if c.hostMethods != 2 {
		t.Fatalf("node.windowHost methods %d, want 2", c.hostMethods)
	}
}
