package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docs/helm.md quotes this example truly: in its code blocks, each line below a comment
// naming a file of the example ("# examples/cobra-operator/chart/values.yaml") is a line of
// that file (both trimmed, runs of blanks made one), and at least one line is quoted.
func TestHelmDocExcerpts(t *testing.T) {
	md, err := os.ReadFile(filepath.Join("..", "..", "docs", "helm.md"))
	if err != nil {
		t.Fatal(err)
	}
	normalise := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	var lines map[string]bool // the named file's lines; nil: none named
	checked := 0
	for i, line := range strings.Split(string(md), "\n") {
		l := normalise(line)
		switch {
		case strings.HasPrefix(l, "```"):
			lines = nil
		case strings.HasPrefix(l, "# examples/cobra-operator/"):
			b, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(strings.TrimPrefix(l, "# "))))
			if err != nil {
				t.Fatalf("docs/helm.md, line %d: %v", i+1, err)
			}
			lines = map[string]bool{}
			for _, fl := range strings.Split(string(b), "\n") {
				lines[normalise(fl)] = true
			}
		case lines != nil && l != "":
			if !lines[l] {
				t.Errorf("docs/helm.md, line %d: the file it quotes has no line `%s`", i+1, l)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Error("docs/helm.md quotes no line of examples/cobra-operator")
	}
}
