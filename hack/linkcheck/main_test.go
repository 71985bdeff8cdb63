package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSlug(t *testing.T) {
	for title, want := range map[string]string{
		"How it works": "how-it-works",
		"Test it: `draintest` in kubebuilder's suite": "test-it-draintest-in-kubebuilders-suite",
		"What to hand to `reconcilers.Call`":          "what-to-hand-to-reconcilerscall",
		"snake_case and dashes-too":                   "snake_case-and-dashes-too",
	} {
		if got := slug(title); got != want {
			t.Errorf("slug(%q) = %q, want %q", title, got, want)
		}
	}
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("docs/other.md", "# Other\n## Twice\n## Twice\n")
	readme := write("README.md", "# Title\n## How it works\n"+
		"[ok](#how-it-works) [ok](docs/other.md#twice-1) [ok](docs) [web](https://example.com/x#y)\n"+
		"```\n[ignored](#in-a-code-block)\n```\n"+
		"[bad anchor](#nowhere) [bad file](docs/missing.md) [bad other](docs/other.md#twice-2)\n")
	got, err := check(readme)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		readme + ":7: #nowhere: no such heading",
		readme + ":7: docs/missing.md: no such file",
		readme + ":7: docs/other.md#twice-2: no such heading",
	}
	if !slices.Equal(got, want) {
		t.Errorf("check = %q, want %q", got, want)
	}
}
