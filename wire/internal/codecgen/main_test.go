package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTheCodecIsGenerated: codec_gen.go is what the types make of it.
func TestTheCodecIsGenerated(t *testing.T) {
	want, err := Generate("../..")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("../..", Output))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not what the types make of it: run go generate ./wire", Output)
	}
}

// TestWhatTheCodecCannotWriteIsRefused: a field of a type the codec does
// not know, or a type with JSON methods of its own, stops the generator
// rather than being written in some other way than encoding/json's.
func TestWhatTheCodecCannotWriteIsRefused(t *testing.T) {
	for _, src := range []string{
		"type T struct{ X map[string]int }",
		"type T struct{ X int }",
		"type T struct{ X *uint64 }",
		"type T struct{ X []string }",
		"type T struct{ X [2]U }\ntype U struct{}",
		"type T struct{ X string `json:\",string\"` }",
		"type T struct{ X string `json:\"a<b\"` }",
		"type T struct{ X, Y string `json:\"x\"` }",
		"type T struct{ U `json:\"u\"` }\ntype U struct{}",
		"type T struct{ X U }\ntype U struct{}\n\nfunc (U) MarshalJSON() ([]byte, error) { return nil, nil }",
		"type T struct{ X U }\ntype U string\n\nfunc (*U) UnmarshalText([]byte) error { return nil }",
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "t.go"), []byte("package p\n\n"+src+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.structOf("T"); err == nil {
			t.Errorf("%s: generated", src)
		}
	}
}

// TestEmbeddedStructsAreInlined: an embedded struct's fields are members
// of the struct that embeds it, where it embeds it, exported or not, as
// encoding/json has them.
func TestEmbeddedStructsAreInlined(t *testing.T) {
	dir := t.TempDir()
	src := "package p\n\ntype T struct {\n\tA string `json:\"a\"`\n\tu\n\tB bool `json:\"b\"`\n}\n\ntype u struct {\n\tX string `json:\"x\"`\n\ty string\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "t.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := load(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.structOf("T")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range st.fields {
		names = append(names, f.jsonName)
	}
	if got := strings.Join(names, " "); got != "a x b" {
		t.Fatalf("members %q, want \"a x b\"", got)
	}
}
