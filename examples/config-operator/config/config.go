package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/quiesce-dev/quiesce/runnable"
)

// LeaderElectionID names the lease the replicas of the operator compete for.
const LeaderElectionID = "config-operator.quiesce.dev"

// DefaultGracefulShutdownTimeout is the manager's GracefulShutdownTimeout when the file sets
// none: controller-runtime's own default, set explicitly so that what the manager waits for
// is read from the Options, never guessed.
const DefaultGracefulShutdownTimeout = 30 * time.Second

// Config is the operator's config file. The zero value of each field is its default.
type Config struct {
	// MetricsAddr is the address the metrics server binds to; "0" disables it. Default ":8080".
	MetricsAddr string `json:"metricsAddr,omitempty"`
	// ProbeAddr is the address of the /healthz and /readyz endpoints; "0" disables them.
	// Default ":8081".
	ProbeAddr string `json:"probeAddr,omitempty"`
	// LeaderElect makes the replicas elect one leader that runs the controllers.
	LeaderElect bool `json:"leaderElect,omitempty"`
	// GracefulShutdownTimeout is how long the manager waits for its runnables once its stop
	// began. Default DefaultGracefulShutdownTimeout.
	GracefulShutdownTimeout *metav1.Duration `json:"gracefulShutdownTimeout,omitempty"`
	// PublishURL is the config store's URL, where the ConfigMaps are published. Required.
	PublishURL string `json:"publishURL"`
	// Webhook configures the server the operator's admission webhooks register on.
	Webhook Webhook `json:"webhook,omitempty"`

	// quiesce: its settings, under "quiesce" in the file (a field left out keeps quiesce's default).
	Quiesce runnable.Config `json:"quiesce"`
}

// Webhook configures the webhook server.
type Webhook struct {
	// Port is the port the webhook server serves on. Default 9443.
	Port int `json:"port,omitempty"`
	// CertDir holds tls.crt and tls.key. Default: controller-runtime's,
	// <temp-dir>/k8s-webhook-server/serving-certs.
	CertDir string `json:"certDir,omitempty"`
}

// Load reads and decodes the config file at path (see Parse).
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("failed to read config file: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("failed to load config file %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes a config file strictly and case-sensitively: an unknown or duplicate field
// is an error, and so is one whose name differs from a field's only in case ("publishurl"),
// which encoding/json, and so sigs.k8s.io/yaml.UnmarshalStrict, would take for the field.
func Parse(data []byte) (*Config, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("failed to decode config: %w", err)
	}
	var c Config
	strict, err := kjson.UnmarshalStrict(js, &c)
	if err != nil {
		return nil, fmt.Errorf("failed to decode config: %w", err)
	}
	if len(strict) > 0 {
		return nil, fmt.Errorf("failed to decode config: %w (field names are case-sensitive)", errors.Join(strict...))
	}
	return &c, nil
}

// Options returns the manager's Options, with the operator's webhook server, and quiesce's
// Options, both from c: the two that runnable.Setup takes. It returns an error naming the
// field of the file that is wrong.
func (c *Config) Options(scheme *runtime.Scheme) (ctrl.Options, runnable.Options, error) {
	if c.PublishURL == "" {
		return ctrl.Options{}, runnable.Options{}, errors.New("publishURL is not set: set it to the config store's URL")
	}
	// Printable ASCII only: YAML reads U+2028 and its kin as line breaks.
	if u, err := url.Parse(c.PublishURL); err != nil || !printable(c.PublishURL) ||
		u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return ctrl.Options{}, runnable.Options{}, fmt.Errorf("publishURL is %q: set an http(s) URL of printable ASCII",
			c.PublishURL)
	}
	if !printable(c.Webhook.CertDir) {
		return ctrl.Options{}, runnable.Options{}, fmt.Errorf("webhook.certDir is %q: set a path of printable ASCII",
			c.Webhook.CertDir)
	}
	shutdownTimeout := DefaultGracefulShutdownTimeout
	if c.GracefulShutdownTimeout != nil {
		shutdownTimeout = c.GracefulShutdownTimeout.Duration
	}
	mgrOpts := ctrl.Options{
		Scheme: scheme,
		// Plain HTTP metrics: quiesce serves /debug/quiesce there only behind a FilterProvider,
		// which this example leaves out (quiesce.debugAddress serves it on loopback instead).
		Metrics:                metricsserver.Options{BindAddress: orDefault(c.MetricsAddr, ":8080")},
		HealthProbeBindAddress: orDefault(c.ProbeAddr, ":8081"),
		LeaderElection:         c.LeaderElect,
		LeaderElectionID:       LeaderElectionID,
		// main exits as soon as the manager stopped, so the leader may release the lease at
		// once; with quiesce it does so only once the drain is over.
		LeaderElectionReleaseOnCancel: true,
		GracefulShutdownTimeout:       &shutdownTimeout,
		// The webhook server is built here, not by the manager: runnable.Setup wraps
		// whatever this field holds, so that admission requests are tracked too.
		WebhookServer: webhook.NewServer(webhook.Options{Port: c.Webhook.Port, CertDir: c.Webhook.CertDir}),
	}
	// quiesce: its Options from the file; errors name the field, e.g. "quiesce.gracePeriod".
	var qopts runnable.Options
	if err := c.Quiesce.Apply("quiesce", &qopts); err != nil {
		return ctrl.Options{}, runnable.Options{}, err
	}
	return mgrOpts, qopts, nil
}

// printable reports whether s is printable ASCII, without spaces.
func printable(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r < '!' || r > '~' })
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
