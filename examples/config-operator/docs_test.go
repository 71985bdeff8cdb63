package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The subsections of docs/adoption.md, "An operator that is not a scaffold", that must quote
// this example.
var quotingSections = []string{
	"### Configured by a file",
	"### A webhook server built elsewhere",
	"### Your own test suites",
	"### Controllers you don't own",
	"### Helm",
}

// TestAdoptionExcerpts checks that docs/adoption.md quotes this example truly: see
// checkExcerpts.
func TestAdoptionExcerpts(t *testing.T) {
	md, err := os.ReadFile(filepath.Join("..", "..", "docs", "adoption.md"))
	if err != nil {
		t.Fatal(err)
	}
	problems, quoted := checkExcerpts(string(md), filepath.Join("..", ".."))
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("lines checked by section: %v", quoted)
	for _, s := range quotingSections {
		if quoted[s] == 0 {
			t.Errorf("docs/adoption.md: %q quotes no line of examples/config-operator", s)
		}
	}
}

// The check finds a line that is not in the file it names, a line of code under no file,
// and a file that does not exist (whose lines are then under no file).
func TestAdoptionExcerptsCanFail(t *testing.T) {
	md := "### A\n```go\n// examples/config-operator/main.go\nq, err := runnable.Setup(cfg, &mgrOpts, qopts)\n" +
		"q, err := runnable.Setup(cfg, &mgrOpts, runnable.Options{})\n```\n" +
		"```yaml\nterminationGracePeriodSeconds: 45\n# examples/config-operator/chart/missing.yaml\nx: 1\n```\n"
	problems, quoted := checkExcerpts(md, filepath.Join("..", ".."))
	want := []string{
		"examples/config-operator/main.go has no line `q, err := runnable.Setup(cfg, &mgrOpts, runnable.Options{})`",
		"line 8: `terminationGracePeriodSeconds: 45` is under no file",
		"examples/config-operator/chart/missing.yaml",
		"line 10: `x: 1` is under no file",
	}
	if len(problems) != len(want) {
		t.Fatalf("problems = %q, want %d", problems, len(want))
	}
	for i, w := range want {
		if !strings.Contains(problems[i], w) {
			t.Errorf("problem %d = %q, want it to contain %q", i, problems[i], w)
		}
	}
	if quoted["### A"] != 1 {
		t.Errorf("quoted = %v, want 1 line in ### A", quoted)
	}
}

// checkExcerpts checks the fenced code blocks of md that quote examples/config-operator. In
// such a block, a comment line naming a file of the example, "// examples/config-operator/
// main.go" or "# examples/config-operator/chart/values.yaml", says which file the lines below
// it are from; each of those lines that is neither blank nor a comment ("//" or "#") must be
// a line of that file, both trimmed and their runs of blanks made one (gofmt aligns fields
// in columns). It returns the problems, and how many lines each "###" section quotes.
func checkExcerpts(md, root string) (problems []string, quoted map[string]int) {
	quoted = map[string]int{}
	section, inBlock := "", false
	var block []string // the current block's lines, numbered from start
	start := 0
	for i, line := range strings.Split(md, "\n") {
		t := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(t, "```") && !inBlock:
			inBlock, block, start = true, block[:0], i+2
		case strings.HasPrefix(t, "```"):
			inBlock = false
			p, n := checkBlock(block, start, root)
			problems = append(problems, p...)
			quoted[section] += n
		case inBlock:
			block = append(block, line)
		case strings.HasPrefix(line, "### ") || strings.HasPrefix(line, "## "):
			section = line
		}
	}
	return problems, quoted
}

// checkBlock checks one block whose first line is md's line start; it returns its problems
// and the number of lines it checked, 0 for a block that names no file of the example.
func checkBlock(block []string, start int, root string) (problems []string, checked int) {
	const prefix = "examples/config-operator/"
	names := false
	for _, l := range block {
		names = names || strings.Contains(l, prefix)
	}
	if !names {
		return nil, 0
	}
	var file string
	lines := map[string]bool{} // file's lines, normalised
	for i, l := range block {
		t := normalise(l)
		switch {
		case t == "":
		case strings.HasPrefix(t, "//") || strings.HasPrefix(t, "#"):
			name := strings.TrimSpace(strings.TrimLeft(t, "/#"))
			if !strings.HasPrefix(name, prefix) {
				continue // a comment of the excerpt
			}
			file, lines = strings.Fields(name)[0], map[string]bool{}
			b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
			if err != nil {
				problems = append(problems, "docs/adoption.md: "+err.Error())
				file = ""
			}
			for _, fl := range strings.Split(string(b), "\n") {
				lines[normalise(fl)] = true
			}
		case file == "":
			problems = append(problems, "docs/adoption.md, line "+strconv.Itoa(start+i)+": `"+t+"` is under no file "+
				"(a comment naming examples/config-operator/... above it) in a block that quotes the example")
		case !lines[t]:
			problems = append(problems, "docs/adoption.md, line "+strconv.Itoa(start+i)+": "+file+" has no line `"+t+"`")
		default:
			checked++
		}
	}
	return problems, checked
}

func normalise(s string) string { return strings.Join(strings.Fields(s), " ") }
