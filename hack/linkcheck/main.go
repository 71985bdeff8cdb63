// Command linkcheck checks that every relative link of the Markdown files it is given
// resolves: the file or directory exists, and an anchor (#...) names a heading of the
// target file, as GitHub makes anchors of headings. make lint runs it on README.md and
// docs/. It prints each broken link as file:line and exits 1 if there is any.
//
// Usage: go run ./hack/linkcheck FILE.md...
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

func main() {
	broken := 0
	for _, f := range os.Args[1:] {
		problems, err := check(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		for _, p := range problems {
			fmt.Println(p)
		}
		broken += len(problems)
	}
	if broken > 0 {
		fmt.Printf("%d broken link(s)\n", broken)
		os.Exit(1)
	}
}

// link matches a Markdown link's target: ](target) or ](target "title").
var link = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// check returns the broken relative links of the Markdown file path, as "file:line: why".
func check(path string) ([]string, error) {
	body, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", path, err)
	}
	var problems []string
	fenced := false
	for i, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if fenced {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(line, -1) {
			if why := resolve(path, m[1]); why != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: %s: %s", path, i+1, m[1], why))
			}
		}
	}
	return problems, nil
}

// resolve says why target, a link in the file from, does not resolve; "" when it does.
func resolve(from, target string) string {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return "" // not relative: not checked here
	}
	file, anchor, _ := strings.Cut(target, "#")
	dest := from
	if file != "" {
		dest = filepath.Join(filepath.Dir(from), file)
		fi, err := os.Stat(dest)
		if err != nil {
			return "no such file"
		}
		if fi.IsDir() {
			if anchor != "" {
				return "an anchor in a directory"
			}
			return ""
		}
	}
	if anchor == "" || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	body, err := os.ReadFile(dest)
	if err != nil {
		return "no such file"
	}
	if !anchors(string(body))[anchor] {
		return "no such heading"
	}
	return ""
}

// anchors returns the anchors GitHub makes of the headings of a Markdown text: lower case,
// spaces as dashes, punctuation other than dashes and underscores left out, and "-1", "-2"
// after repeats.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := slug(title)
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// slug is GitHub's anchor of a heading's text.
func slug(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}
