package idem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines bounds the functions of the product: a function longer
// than a screen or two mixes concerns that deserve names of their own.
const maxFuncLines = 100

// notProduct are the trees whose code is not the product: tests and the
// test kits they share, the benchmark tools and the examples.
var notProduct = []string{
	"examples",
	"cmd/idem/internal/tools",
	"internal/testkit",
	"store/storetest",
}

// No function of the product, in any module of the repository, is longer
// than maxFuncLines.
func TestNoLongFunctions(t *testing.T) {
	t.Parallel()
	for _, p := range notProduct {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("exempt tree %s: %v (moved? the exemption would no longer hold)", p, err)
		}
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		path = filepath.ToSlash(path)
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || isNotProduct(path)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if lines > maxFuncLines {
				t.Errorf("%s:%d: %s is %d lines long; the product's functions stay within %d",
					path, fset.Position(fd.Pos()).Line, fd.Name.Name, lines, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func isNotProduct(path string) bool {
	for _, p := range notProduct {
		if path == p {
			return true
		}
	}
	return false
}
