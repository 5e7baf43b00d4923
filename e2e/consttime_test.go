package e2e_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSecretsAreComparedInConstantTime reads the code that checks tokens
// and passwords: each comparison of a secret goes through
// subtle.ConstantTimeCompare, and no == or != touches a secret except to
// test it for emptiness. A timing test would be flaky; the code is what
// keeps the promise, so the test reads it.
func TestSecretsAreComparedInConstantTime(t *testing.T) {
	files := map[string][]string{
		"../broker/registry.go": {"authenticate"},
		"../natsbus/server.go":  {"Check"},
	}
	secret := func(e ast.Expr) bool {
		var name string
		switch x := e.(type) {
		case *ast.Ident:
			name = x.Name
		case *ast.SelectorExpr:
			name = x.Sel.Name
		case *ast.IndexExpr:
			return false
		default:
			return false
		}
		n := strings.ToLower(name)
		return strings.Contains(n, "token") || strings.Contains(n, "password") || n == "h"
	}
	for path, funcs := range files {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, filepath.Clean(path), nil, 0)
		require.NoError(t, err)
		found := map[string]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			fn, ok := n.(*ast.FuncDecl)
			if !ok {
				return true
			}
			constTime := false
			ast.Inspect(fn, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.CallExpr:
					if sel, ok := x.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "ConstantTimeCompare" {
						constTime = true
					}
				case *ast.BinaryExpr:
					if x.Op != token.EQL && x.Op != token.NEQ {
						return true
					}
					if lit, ok := x.Y.(*ast.BasicLit); ok && lit.Value == `""` {
						return true // an emptiness test
					}
					if secret(x.X) || secret(x.Y) {
						t.Errorf("%s: %s compares a secret with %s", path, fset.Position(x.Pos()), x.Op)
					}
				}
				return true
			})
			for _, want := range funcs {
				if fn.Name.Name == want {
					found[want] = true
					assert.True(t, constTime, "%s: %s compares secrets without subtle.ConstantTimeCompare", path, want)
				}
			}
			return true
		})
		for _, want := range funcs {
			assert.True(t, found[want], "%s: %s not found; update this test", path, want)
		}
	}
}
