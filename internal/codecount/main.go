// Command codecount counts what the structure review (issue 38) asked to
// keep from growing, over the module's non-test, non-generated Go files,
// and fails when a count is over its ceiling: functions longer than
// -long lines (-max-long of them), the methods of node.Node
// (-max-node-methods) and of the placement seam, the interface
// node.windowHost (-max-window-host). `make lint` runs it with the counts of the day: a
// change that lowers one lowers its ceiling in the Makefile too, so it
// cannot silently grow back.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	root := flag.String("root", ".", "module root")
	long := flag.Int("long", 80, "a function longer than this many lines counts as long")
	maxLong := flag.Int("max-long", -1, "most long functions allowed (-1: report only)")
	maxNode := flag.Int("max-node-methods", -1, "most methods of node.Node allowed (-1: report only)")
	maxHost := flag.Int("max-window-host", -1, "most methods of the interface node.windowHost allowed (-1: report only)")
	verbose := flag.Bool("v", false, "list the long functions")
	flag.Parse()
	c, err := count(*root, *long)
	if err != nil {
		fmt.Fprintln(os.Stderr, "codecount:", err)
		os.Exit(2)
	}
	fmt.Printf("codecount: %d functions over %d lines (ceiling %d), node.Node has %d methods (ceiling %d), node.windowHost %d (ceiling %d)\n", len(c.long), *long, *maxLong, c.nodeMethods, *maxNode, c.hostMethods, *maxHost)
	if *verbose {
		for _, l := range c.long {
			fmt.Println("  " + l)
		}
	}
	failed := false
	if *maxLong >= 0 && len(c.long) > *maxLong {
		fmt.Fprintf(os.Stderr, "codecount: %d functions over %d lines, more than the %d allowed; split one (make lint-counts lists them):\n  %s\n", len(c.long), *long, *maxLong, strings.Join(c.long, "\n  "))
		failed = true
	}
	if *maxNode >= 0 && c.nodeMethods > *maxNode {
		fmt.Fprintf(os.Stderr, "codecount: node.Node has %d methods, more than the %d allowed: give the new behaviour an owner of its own\n", c.nodeMethods, *maxNode)
		failed = true
	}
	if *maxHost >= 0 && c.hostMethods > *maxHost {
		fmt.Fprintf(os.Stderr, "codecount: the placement seam node.windowHost has %d methods, more than the %d allowed\n", c.hostMethods, *maxHost)
		failed = true
	}
	if failed {
		os.Exit(1)
	}
}

type counts struct {
	long        []string // file:line name (lines)
	nodeMethods int
	hostMethods int // of the interface node.windowHost
}

func count(root string, long int) (counts, error) {
	var c counts
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") || strings.HasPrefix(d.Name(), "zz_") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if f.Name.Name == "node" && filepath.ToSlash(filepath.Dir(rel)) == "node" {
			c.hostMethods += interfaceMethods(f, "windowHost")
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if lines > long {
				c.long = append(c.long, fmt.Sprintf("%s:%d %s (%d lines)", rel, fset.Position(fn.Pos()).Line, fn.Name.Name, lines))
			}
			if fn.Recv != nil && f.Name.Name == "node" && filepath.ToSlash(filepath.Dir(rel)) == "node" && recvName(fn.Recv) == "Node" {
				c.nodeMethods++
			}
		}
		return nil
	})
	sort.Strings(c.long)
	return c, err
}

// recvName is the receiver's type name (pointer or not).
func recvName(fl *ast.FieldList) string {
	if len(fl.List) == 0 {
		return ""
	}
	t := fl.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// interfaceMethods counts the methods of the interface type name declared
// in f (0 if f does not declare it).
func interfaceMethods(f *ast.File, name string) int {
	n := 0
	ast.Inspect(f, func(x ast.Node) bool {
		ts, ok := x.(*ast.TypeSpec)
		if !ok || ts.Name.Name != name {
			return true
		}
		if it, ok := ts.Type.(*ast.InterfaceType); ok {
			n += len(it.Methods.List)
		}
		return false
	})
	return n
}
