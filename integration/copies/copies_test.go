// Package copies checks that the examples' copies of internal code are
// still copies. The examples may not import the library's internal/
// packages (a user copies an example into a module of their own), so
// examples/bench carries a renamed copy of internal/handwritten; this test
// fails when one side changes and the other does not.
package copies

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"path/filepath"
	"testing"
)

// decls returns the functions and constants of a Go file by name, each
// printed after renaming identifiers by rename.
func decls(t *testing.T, path string, rename map[string]string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0) // no comments: only code must agree
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			if to, ok := rename[id.Name]; ok {
				id.Name = to
			}
		}
		return true
	})
	out := map[string]string{}
	print := func(name string, node any) {
		var b bytes.Buffer
		if err := printer.Fprint(&b, fset, node); err != nil {
			t.Fatal(err)
		}
		out[name] = b.String()
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			print(d.Name.Name, d)
		case *ast.GenDecl:
			if d.Tok == token.CONST {
				for _, s := range d.Specs {
					print(s.(*ast.ValueSpec).Names[0].Name, s)
				}
			}
		}
	}
	return out
}

func TestExampleCopiesMatchInternal(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	handwritten := map[string]string{"Now": "handwrittenNow", "placeholder": "handwrittenPlaceholder", "ArgsPerRow": "handwrittenArgsPerRow", "Insert": "handwrittenRows"}
	for _, tc := range []struct {
		orig   string
		rename map[string]string
		copy   string
		names  []string // the renamed declarations the copy must hold
	}{
		{"internal/handwritten/handwritten.go", handwritten, "examples/bench/handwritten.go", []string{"handwrittenNow", "handwrittenPlaceholder", "handwrittenArgsPerRow", "handwrittenRows"}},
	} {
		orig := decls(t, filepath.Join(root, tc.orig), tc.rename)
		copied := decls(t, filepath.Join(root, tc.copy), nil)
		for _, name := range tc.names {
			if orig[name] == "" || copied[name] == "" {
				t.Errorf("%s or %s lacks %s", tc.orig, tc.copy, name)
				continue
			}
			if orig[name] != copied[name] {
				t.Errorf("%s's %s is no longer a copy of %s's:\n--- copy:\n%s\n--- internal (renamed):\n%s", tc.copy, name, tc.orig, copied[name], orig[name])
			}
		}
	}
}
