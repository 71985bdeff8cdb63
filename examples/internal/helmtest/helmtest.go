// Package helmtest runs the real helm on the example charts, for their tests: helm is built
// by the go command from the tools module hack/tools/helm/go.mod (helm.sh/helm/v4, through
// the module proxy, then from the build cache), as make lint builds golangci-lint. A test
// that cannot build it fails; it never skips. It is an example's helper, not part of
// quiesce's API.
package helmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/quiesce-dev/quiesce/examples/internal/runner"
)

// buildTimeout bounds the go command that builds helm: a second when the build cache has
// it, minutes when it is cold (make test builds it first, outside go test's -timeout: a
// plain go test on a cold cache needs -timeout above that).
const buildTimeout = 30 * time.Minute

// runTimeout bounds each helm command.
const runTimeout = 2 * time.Minute

var build struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of the helm binary, building it on the first call.
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		root, err := runner.ModuleRoot(ctx)
		if err != nil {
			build.err = err
			return
		}
		cmd := exec.CommandContext(ctx, "go", "tool", "-modfile=hack/tools/helm/go.mod", "-n", "helm")
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			build.err = fmt.Errorf("failed to build helm (go tool -modfile=hack/tools/helm/go.mod helm): %w: %s",
				err, stderr.Bytes())
			return
		}
		build.path = strings.TrimSpace(string(out))
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.path
}

// Run runs helm with args and returns its standard output, or an error holding its
// standard error. helm's own directories are t's: nothing outside is read or written.
func Run(t testing.TB, args ...string) (string, error) {
	t.Helper()
	bin := Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "kubeconfig"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w: %s%s", strings.Join(args, " "), err, stderr.String(),
			stdout.String())
	}
	return stdout.String(), nil
}

// ValuesFile writes values (YAML: a nil value removes the chart's key) to a file of t's and
// returns its path, for -f.
func ValuesFile(t testing.TB, values map[string]any) string {
	t.Helper()
	b, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Template renders chart for release name in namespace, its values overridden by values,
// and returns the manifests by template file name ("deployment.yaml"), or helm's error:
// values.schema.json refuses the values, or a template fails.
func Template(t testing.TB, chart, name, namespace string, values map[string]any) (map[string]string, error) {
	t.Helper()
	out, err := Run(t, "template", name, chart, "--namespace", namespace, "-f", ValuesFile(t, values))
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for doc := range strings.SplitSeq(out, "---\n") {
		source, body, ok := strings.Cut(doc, "\n")
		if src, isSource := strings.CutPrefix(source, "# Source: "); ok && isSource {
			files[path.Base(src)] += body
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("helm template rendered no manifest: %q", out)
	}
	return files, nil
}

// Lint runs helm lint --strict on chart with values (a warning fails it too).
func Lint(t testing.TB, chart string, values map[string]any) error {
	t.Helper()
	_, err := Run(t, "lint", "--strict", chart, "-f", ValuesFile(t, values))
	return err
}

// WithoutSchema copies chart to a directory of t's without its values.schema.json, to show
// what the templates alone make of values the schema refuses.
func WithoutSchema(t testing.TB, chart string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(chart))
	if err := os.CopyFS(dst, os.DirFS(chart)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dst, "values.schema.json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return dst
}
