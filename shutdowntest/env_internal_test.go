package shutdowntest

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestOperatorEnv(t *testing.T) {
	t.Setenv("QUIESCE_TEST_SECRET", "s3cret")
	t.Setenv("QUIESCE_TEST_WANTED", "yes")
	t.Setenv("GODEBUG", "profstackdepth=256")
	t.Setenv("KUBECONFIG", "/the/test's/own")
	env := operatorEnv("/tmp/kc", []string{"QUIESCE_TEST_WANTED", "QUIESCE_TEST_UNSET", "KUBECONFIG"})
	for _, want := range []string{"KUBECONFIG=/tmp/kc", "QUIESCE_TEST_WANTED=yes", "GODEBUG=profstackdepth=256"} {
		if !slices.Contains(env, want) {
			t.Errorf("env %q lacks %q", env, want)
		}
	}
	for _, kv := range env {
		switch kv {
		case "QUIESCE_TEST_SECRET=s3cret", "KUBECONFIG=/the/test's/own":
			t.Errorf("env %q holds %q, which is not allowed", env, kv)
		}
		if kv == "QUIESCE_TEST_UNSET=" {
			t.Errorf("env %q holds an unset variable", env)
		}
	}
}

// A typed-nil Output is nil (quiesce's rule for plug-ins): the log goes nowhere, instead of
// a nil dereference at the operator's first line.
func TestTypedNilOutputIsNone(t *testing.T) {
	o := Options{Binary: "/bin/true", Kubeconfig: "/kc", Output: (*bytes.Buffer)(nil)}
	if err := o.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if o.Output != io.Discard {
		t.Errorf("Output = %#v, want io.Discard", o.Output)
	}
}

// An operator whose webhook server found no certificate (the Environment installs no
// webhook) is told how to fix the spec; other failures get no hint.
func TestStartHint(t *testing.T) {
	missing := `ERROR	setup	Failed to run manager	{"error": "open /tmp/k8s-webhook-server/serving-certs/tls.crt: no such file or directory"}`
	if h := startHint([]string{"INFO starting", missing}); !strings.Contains(h, "WebhookInstallOptions.Paths") {
		t.Errorf("startHint = %q, want it to name WebhookInstallOptions.Paths", h)
	}
	if h := startHint([]string{`ERROR	setup	Failed to run manager	{"error": "boom"}`}); h != "" {
		t.Errorf("startHint of another failure = %q, want none", h)
	}
}
