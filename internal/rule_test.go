package internal_test

import (
	"os"
	"strings"
	"testing"
)

// TestSetupMisuseRuleInEveryPackage: the rule for setup misuse is stated in the same words
// in the doc.go of every package of the API.
func TestSetupMisuseRuleInEveryPackage(t *testing.T) {
	var first, firstPkg string
	for _, pkg := range []string{"drain", "drain/draintest", "runnable", "reconcilers", "lifecycle", "shutdowntest"} {
		b, err := os.ReadFile("../" + pkg + "/doc.go")
		if err != nil {
			t.Fatal(err)
		}
		doc := string(b)
		i := strings.Index(doc, "// Setup misuse, one rule in every quiesce package:")
		if i < 0 {
			t.Errorf("%s/doc.go does not state the rule for setup misuse", pkg)
			continue
		}
		rule, _, _ := strings.Cut(doc[i:], "\n//\n")
		if first == "" {
			first, firstPkg = rule, pkg
		} else if rule != first {
			t.Errorf("%s/doc.go states the rule in other words than %s/doc.go:\n%s\nvs\n%s", pkg, firstPkg, rule, first)
		}
	}
}
