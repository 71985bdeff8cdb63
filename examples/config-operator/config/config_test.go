package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/scheme"

	"github.com/quiesce-dev/quiesce/examples/config-operator/config"
)

// A file with only what is required gets the documented defaults: the manager's, and
// quiesce's (zero Options: runnable's own defaults).
func TestDefaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("publishURL: http://store\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	mgrOpts, qopts, err := c.Options(scheme.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	if mgrOpts.Metrics.BindAddress != ":8080" || mgrOpts.HealthProbeBindAddress != ":8081" ||
		*mgrOpts.GracefulShutdownTimeout != config.DefaultGracefulShutdownTimeout || mgrOpts.WebhookServer == nil {
		t.Errorf("manager Options = %+v, want the defaults and a webhook server", mgrOpts)
	}
	if qopts.GracePeriod != 0 || qopts.ShutdownDelay != 0 || qopts.CancelAfter != 0 {
		t.Errorf("quiesce Options = %+v, want the zero Options", qopts)
	}
}

// Errors name what is wrong in the file.
func TestErrors(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"publishURL: http://store\nmetricsAddres: :8080\n", `unknown field "metricsAddres"`},
		// Outer keys are case-sensitive too: with encoding/json's folding, the key sorted last
		// would replace the real one (quiesce's settings, the store's URL).
		{"publishURL: http://store\nquiesce: {gracePeriod: 20s}\nquie\u017fce: {gracePeriod: 1ns}\n", "unknown field \"quie\u017fce\""},
		{"publishURL: http://store\npublishurl: http://elsewhere\n", `unknown field "publishurl"`},
		{"publishURL: http://store\npublishURL: http://elsewhere\n", `key "publishURL" already set`},
		{"publishURL: http://store\ngracefulShutdownTimeout: \"30\"\n", "missing unit in duration"},
		{"metricsAddr: :8080\n", "publishURL is not set"},
		{"publishURL: \"http://store\\u2028\"\n", `publishURL is "http://store\u2028": set an http(s) URL of printable ASCII`},
		{"publishURL: store\n", "set an http(s) URL"},
		{"publishURL: http://store\nwebhook: {certDir: \"/certs\\u2028\"}\n", "webhook.certDir is"},
		{"publishURL: http://store\nquiesce: {gracePeriod: 10s, cancelAfter: 12s}\n",
			"quiesce.cancelAfter (CancelAfter) (12s) must be below quiesce.gracePeriod (GracePeriod) (10s)"},
	} {
		c, err := config.Parse([]byte(tc.file))
		if err == nil {
			_, _, err = c.Options(scheme.Scheme)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one with %q", tc.file, err, tc.want)
		}
	}
}
