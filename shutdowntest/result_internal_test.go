package shutdowntest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/runnable"
)

// A line of examples/demo-operator's log (zap's development mode: console text, then the
// key/values as JSON).
const consoleLine = "2026-12-01T23:38:51Z\tERROR\tquiesce\tAbandoned calls still running after the grace period\t" +
	`{"gracePeriod": "2s", "sinceStop": "2.007s", "abandoned": 1, "calls": [{"name":"demo/hanging/hang-1/legacy-export",` +
	`"age":"2s","detached":true,"reconcileID":"b9456190-b6d0-4576-818e-401d8e90a083",` +
	`"where":"main.(*legacyClient).Export (controller.go:130)",` +
	`"handler":"main.(*ConfigMapReconciler).Reconcile.func2 (controller.go:64)"}], "error": "context deadline exceeded"}`

// The same in production mode (JSON), with more calls than the line names.
const jsonLine = `{"level":"error","ts":1764632331.5,"logger":"quiesce",` +
	`"msg":"Abandoned calls still running after the grace period","sinceStop":"25s","abandoned":22,` +
	`"calls":[{"name":"a/ns/x/export","age":"25s","detached":true,"where":"w","handler":"h"},` +
	`{"name":"a/ns/y","age":"25s","detached":false,"where":"w","handler":"h"}],"more":20,` +
	`"error":"context deadline exceeded","stacktrace":"main.main\n\t/src/main.go:1"}`

// jsonLineNames are the calls jsonLine names.
var jsonLineNames = []string{"a/ns/x/export", "a/ns/y"}

func TestAbandoned(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []string
		want  []string
		count int
	}{
		{"console", []string{"INFO\tStarting", consoleLine, "INFO\tWait completed"},
			[]string{"demo/hanging/hang-1/legacy-export"}, 1},
		{"json", []string{`{"msg":"Starting"}`, jsonLine}, jsonLineNames, 22},
		{"none", []string{"INFO\tAll calls returned"}, nil, 0},
		{"no JSON after the message", []string{"ERROR\t" + runnable.AbandonedMessage + " (cut)"}, nil, 0},
		{"the largest count counts", []string{jsonLine, consoleLine}, jsonLineNames, 22},
		{"a later line with a larger count", []string{consoleLine, jsonLine}, jsonLineNames, 22},
		// The operator itself logs quiesce's message later, with nothing abandoned: it lowers nothing.
		{"a forged abandoned: 0", []string{consoleLine, `{"level":"error","ts":2,"logger":"quiesce","msg":"` +
			runnable.AbandonedMessage + `","abandoned":0,"calls":[]}`}, []string{"demo/hanging/hang-1/legacy-export"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			names, count := abandoned(tc.lines)
			g.Expect(names).To(Equal(tc.want))
			g.Expect(count).To(Equal(tc.count))
		})
	}
}

// GaveUp reads the error of a line logged after SIGTERM: GaveUpText as its beginning, or as
// the last error of Manager.Start's aggregate; never a line that quotes the text elsewhere.
func TestGaveUpFromTheErrorField(t *testing.T) {
	const gaveUp = GaveUpText + " of 4s: context deadline exceeded"
	for _, tc := range []struct {
		name string
		line string
		want bool
	}{
		{"zap console", "T\tERROR\tsetup\tProblem running manager\t" + `{"error": "` + gaveUp + `"}`, true},
		{"slog text", `time=T level=ERROR msg="Problem running manager" err="` + gaveUp + `"`, true},
		{"logrus text", `time="T" level=error msg="Problem running manager" error="` + gaveUp + `"`, true},
		{"an aggregate", `{"level":"error","ts":1,"msg":"Problem running manager","error":"[failed to serve, ` + gaveUp + `]"}`, true},
		{"in a message", `{"level":"info","ts":1,"msg":"` + gaveUp + `"}`, false},
		{"in another key", `{"level":"info","ts":1,"msg":"Working","note":"` + gaveUp + `"}`, false},
		{"quoted inside an error", `{"level":"error","ts":1,"msg":"Reconciler error","error":"failed to sync: ` + gaveUp + `"}`, false},
		{"not a log line", gaveUp, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Result{Lines: []string{"INFO\tStarting manager", tc.line}, signaled: 1}
			if got := r.gaveUp(); got != tc.want {
				t.Errorf("gaveUp() = %t, want %t", got, tc.want)
			}
			if tc.want {
				r.signaled = 2 // logged before SIGTERM: not the manager's
				if r.gaveUp() {
					t.Error("gaveUp() = true from a line logged before SIGTERM")
				}
			}
		})
	}
}

func TestTimeline(t *testing.T) {
	g := NewWithT(t)
	lines := []string{
		"2026-12-02T00:27:43Z\tINFO\tsetup\tStarting manager",
		"2026-12-02T00:27:43Z\tINFO\tquiesce\tStop began\t" + `{"sinceStop": "0s", "shutdownDelay": "0s", "gracePeriod": "25s"}`,
		`{"level":"info","logger":"quiesce","msg":"Draining executor","gracePeriod":"25s","sinceStop":"1ms","pending":2}`,
		"2026-12-02T00:27:45Z\tINFO\tquiesce\tAll calls returned\t" + `{"gracePeriod": "25s", "sinceStop": "1.994s"}`,
		"2026-12-02T00:27:45Z\tINFO\tStopping and waiting for caches",
	}
	g.Expect(timeline(lines)).To(Equal([]Step{
		{"Stop began", "0s"}, {"Draining executor", "1ms"}, {"All calls returned", "1.994s"},
	}))
	g.Expect(timeline([]string{"INFO\tStarting"})).To(BeEmpty())
}

func TestLogExcerpt(t *testing.T) {
	g := NewWithT(t)
	g.Expect(logExcerpt(nil)).To(Equal("\t(none)"))
	g.Expect(logExcerpt([]string{"a", "b"})).To(Equal("\ta\n\tb"))

	lines := make([]string, 0, 100)
	for i := range 100 {
		lines = append(lines, fmt.Sprint("line ", i))
	}
	got := strings.Split(logExcerpt(lines), "\n")
	g.Expect(got).To(HaveLen(headLinesInErrors + 1 + lastLinesInErrors))
	g.Expect(got[0]).To(Equal("\tline 0"))
	g.Expect(got[headLinesInErrors]).To(Equal("\t... (75 lines left out)"))
	g.Expect(got[len(got)-1]).To(Equal("\tline 99"))
	g.Expect(lines).To(HaveLen(100)) // not modified
	g.Expect(lines[headLinesInErrors]).To(Equal("line 5"))
}

func TestMatchers(t *testing.T) {
	g := NewWithT(t)
	graceful := &Result{ExitCode: 0, Lines: []string{"INFO\tAll calls returned"}}
	hung := &Result{ExitCode: 1, Lines: []string{consoleLine}}
	hung.Abandoned, hung.AbandonedCount = abandoned(hung.Lines)
	killed := &Result{ExitCode: 0, Killed: true}

	g.Expect(graceful).To(HaveExitedGracefully())
	g.Expect(hung).NotTo(HaveExitedGracefully())
	g.Expect(killed).NotTo(HaveExitedGracefully())
	g.Expect(hung).To(HaveAbandoned("demo/hanging/hang-1/legacy-export"))
	g.Expect(hung).To(HaveAbandoned(ContainSubstring("legacy-export")))
	g.Expect(graceful).NotTo(HaveAbandoned(ContainSubstring("legacy-export")))
	g.Expect(graceful).To(HaveLogged("All calls returned"))
	g.Expect(graceful).To(HaveLogged(MatchRegexp(`All calls \w+`)))
	g.Expect(hung).NotTo(HaveLogged("All calls returned"))

	msg := HaveExitedGracefully().FailureMessage(hung)
	g.Expect(msg).To(ContainSubstring("exited with code 1, abandoning 1 call(s): [demo/hanging/hang-1/legacy-export]"))
	g.Expect(HaveExitedGracefully().FailureMessage(killed)).To(ContainSubstring("a second SIGTERM or SIGKILL"))
	_, err := HaveExitedGracefully().Match("not a result")
	g.Expect(err).To(MatchError(ContainSubstring("expect a shutdowntest.Result or *shutdowntest.Result, got string")))
}

func TestKubebuilderFlags(t *testing.T) {
	g := NewWithT(t)
	e := Endpoints{Metrics: "127.0.0.1:1", Probe: "127.0.0.1:2", Debug: "127.0.0.1:3"}
	g.Expect(KubebuilderFlags(e)).To(Equal([]string{
		"--metrics-bind-address=127.0.0.1:1", "--metrics-secure=false", "--quiesce-debug-address=127.0.0.1:3",
		"--health-probe-bind-address=127.0.0.1:2",
	}))

	g.Expect(KubebuilderFlags(Endpoints{Metrics: "m", Probe: "p", MetricsSecure: true, LeaderElectionNamespace: "ns",
		MetricsCertDir: "/tmp/metrics"})).
		To(Equal([]string{"--metrics-bind-address=m", "--metrics-cert-path=/tmp/metrics", "--health-probe-bind-address=p",
			"--leader-elect"}))

	env := &envtest.Environment{}
	webhookEndpoints(env, &e) // no webhook installed
	g.Expect(e.Webhook).To(BeEmpty())
	env.WebhookInstallOptions = envtest.WebhookInstallOptions{
		LocalServingHost: "127.0.0.1", LocalServingPort: 9443, LocalServingCertDir: "/tmp/certs",
		ValidatingWebhooks: []*admissionv1.ValidatingWebhookConfiguration{{}},
	}
	webhookEndpoints(env, &e)
	g.Expect(e.Webhook).To(Equal("127.0.0.1:9443"))
	g.Expect(KubebuilderFlags(e)).To(ContainElements("--webhook-cert-path=/tmp/certs", "--webhook-port=9443"))
}

func TestBuildFlags(t *testing.T) {
	g := NewWithT(t)
	var race []string // what Build adds
	if raceEnabled {
		race = append(race, "-race")
	}
	g.Expect(buildFlags(nil)).To(Equal(race), "the operator is built as the test is")
	g.Expect(buildFlags([]string{"-tags=e2e"})).To(Equal(append(race, "-tags=e2e")))
	for _, said := range [][]string{{"-race"}, {"-race=false"}, {"--race=true"}, {"-tags=e2e", "-race=0"}} {
		g.Expect(buildFlags(said)).To(Equal(said), "the caller said")
	}
}

func TestReadLines(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"lines", "a\nb\n", []string{"a", "b"}},
		{"no end at the end", "a\nb", []string{"a", "b"}},
		{"crlf", "a\r\nb\r\n", []string{"a", "b"}},
		{"empty lines", "\n\na\n", []string{"", "", "a"}},
		{"at the limit", strings.Repeat("x", maxLineBytes) + "\nb\n", []string{strings.Repeat("x", maxLineBytes), "b"}},
		{"one byte over", strings.Repeat("x", maxLineBytes+1) + "\nb\n",
			[]string{strings.Repeat("x", maxLineBytes) + " [... 1 bytes cut]", "b"}},
		{"5 MiB, then more", strings.Repeat("y", 5<<20) + "\nafter\nand after\n",
			[]string{strings.Repeat("y", maxLineBytes) + " [... 4194304 bytes cut]", "after", "and after"}},
		{"cut at the end", strings.Repeat("z", maxLineBytes+10),
			[]string{strings.Repeat("z", maxLineBytes) + " [... 10 bytes cut]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			var got []string
			readLines(strings.NewReader(tc.in), func(l string) { got = append(got, l) })
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

func TestMatchersTakeResultValuesAndFailOnNil(t *testing.T) {
	g := NewWithT(t)
	hung := Result{ExitCode: 1, Lines: []string{consoleLine}}
	hung.Abandoned, hung.AbandonedCount = abandoned(hung.Lines)
	g.Expect(hung).To(HaveAbandoned(ContainSubstring("legacy-export")))
	g.Expect(hung).To(HaveLogged("Abandoned calls"))
	g.Expect(hung).NotTo(HaveExitedGracefully())

	// exit 0 with abandoned calls: a main that ignores the Runnable's Err.
	ignored := hung
	ignored.ExitCode = 0
	g.Expect(ignored).NotTo(HaveExitedGracefully())
	g.Expect(HaveExitedGracefully().FailureMessage(ignored)).To(ContainSubstring("exited with code 0, abandoning 1 call(s)"))

	var nilResult *Result
	for _, m := range []types.GomegaMatcher{HaveExitedGracefully(), HaveAbandoned("x"), HaveLogged("x")} {
		_, err := m.Match(nilResult)
		g.Expect(err).To(MatchError(ContainSubstring("got a nil *shutdowntest.Result (did Stop fail?")))
		_, err = m.Match(3)
		g.Expect(err).To(MatchError(ContainSubstring("got int")))
	}
}

func TestBinaryName(t *testing.T) {
	g := NewWithT(t)
	g.Expect(binaryName("/src/jobset", ".")).To(Equal("jobset"))
	g.Expect(binaryName("/src/jobset", "./")).To(Equal("jobset"))
	g.Expect(binaryName("/src/op", "./cmd")).To(Equal("cmd"))
	g.Expect(binaryName("/src/op/cmd", "..")).To(Equal("op"))
	g.Expect(binaryName("/src/op", "sigs.k8s.io/jobset/cmd/manager")).To(Equal("manager"))
	g.Expect(binaryName("/", ".")).To(Equal("operator"))
}

func TestKubeconfigFromREST(t *testing.T) {
	g := NewWithT(t)
	cfg := &rest.Config{
		Host: "https://127.0.0.1:6443", BearerToken: "token",
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca"), CertData: []byte("cert"), KeyData: []byte("key")},
		Impersonate:     rest.ImpersonationConfig{UserName: "someone", Groups: []string{"g"}},
	}
	data, err := kubeconfigFromREST(cfg)
	g.Expect(err).NotTo(HaveOccurred())
	back, err := clientcmd.RESTConfigFromKubeConfig(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(back.Host).To(Equal(cfg.Host))
	g.Expect(back.BearerToken).To(Equal("token"))
	g.Expect(back.TLSClientConfig.CAData).To(Equal([]byte("ca")))
	g.Expect(back.TLSClientConfig.CertData).To(Equal([]byte("cert")))
	g.Expect(back.TLSClientConfig.KeyData).To(Equal([]byte("key")))
	g.Expect(back.Impersonate.UserName).To(Equal("someone"))
	g.Expect(back.Impersonate.Groups).To(Equal([]string{"g"}))
}

func TestFreeWebhookPort(t *testing.T) {
	g := NewWithT(t)
	env := &envtest.Environment{WebhookInstallOptions: envtest.WebhookInstallOptions{
		LocalServingHost: "127.0.0.1", LocalServingPort: 9443, LocalServingCertDir: "/tmp/certs",
		ValidatingWebhooks: []*admissionv1.ValidatingWebhookConfiguration{{}},
	}}
	e, err := endpoints(Options{Env: env})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(e.Webhook).To(Equal("127.0.0.1:9443"), "Env's port by default")

	for range 3 {
		e, err := endpoints(Options{Env: env, FreeWebhookPort: true})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(e.Webhook).To(HavePrefix("127.0.0.1:"))
		g.Expect(e.Webhook).NotTo(Equal("127.0.0.1:9443"))
		g.Expect(e.WebhookCertDir).To(Equal("/tmp/certs"))
	}
	e, err = endpoints(Options{Env: &envtest.Environment{}, FreeWebhookPort: true})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(e.Webhook).To(BeEmpty(), "no webhook installed: none")
}

// The harness's client never follows a redirect: the token would go with it (here to
// another port in clear). The 3xx is what get returns.
func TestNoRedirectWithTheToken(t *testing.T) {
	var mu sync.Mutex
	var elsewhere []string
	other := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		elsewhere = append(elsewhere, r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	defer other.Close()
	redirecting := httptest.NewServer(http.RedirectHandler(other.URL+"/debug/quiesce", http.StatusFound))
	defer redirecting.Close()

	_, status, err := get(t.Context(), httpClient(nil, false), redirecting.URL+"/debug/quiesce", "secret-token")
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusFound {
		t.Errorf("status = %d, want %d (the redirect, not followed)", status, http.StatusFound)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(elsewhere) != 0 {
		t.Errorf("the redirect's target got %d request(s), Authorization %q", len(elsewhere), elsewhere)
	}
}
