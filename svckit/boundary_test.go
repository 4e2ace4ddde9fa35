package svckit

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// handlerRoots are the trees (relative to svckit/) of the workers' request
// handlers, which return wrapped sentinels: their codes come from codeTable
// (Errorf, Status), never from a status built on the spot.
var handlerRoots = []string{"../decode-svc", "../prefill-svc"}

// inlineStatus are the grpc/status functions that give an error a code of
// the caller's choosing.
var inlineStatus = map[string]bool{"Error": true, "Errorf": true, "New": true, "Newf": true}

// TestNoInlineStatus fails on a call of status.Error, Errorf, New or Newf
// in a non-test file of the workers: a handler wraps a sentinel
// (svckit.Errorf, fmt.Errorf with %w) and codeTable gives the code, so that
// the same failure has the same code everywhere. A code a peer chose is
// relayed with PeerErrorf. (svckit/workerapi cannot import svckit, whose
// tests import it, and keeps its one InvalidArgument.)
func TestNoInlineStatus(t *testing.T) {
	fset := token.NewFileSet()
	files := 0
	for _, root := range handlerRoots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			files++
			name := ""
			for _, imp := range f.Imports {
				if p, _ := strconv.Unquote(imp.Path.Value); p == "google.golang.org/grpc/status" {
					name = "status"
					if imp.Name != nil {
						name = imp.Name.Name
					}
				}
			}
			if name == "" {
				return nil
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == name && inlineStatus[sel.Sel.Name] {
					t.Errorf("%s: status.%s: return a wrapped sentinel (svckit.Errorf) and let codeTable give the code", fset.Position(sel.Pos()), sel.Sel.Name)
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files < 10 {
		t.Fatalf("read only %d files: is the walk reading the source tree?", files)
	}
}
