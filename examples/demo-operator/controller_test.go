package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quiesce-dev/quiesce/drain/draintest"
	"github.com/quiesce-dev/quiesce/runnable"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	goleak.VerifyTestMain(m)
}

// TestSnapshotFinishesDuringShutdown is how a user's own envtest test checks an operator
// that adopted quiesce: a reconcile in flight when the manager stops finishes within the
// grace period, and once the manager stopped no tracked call is left (draintest).
func TestSnapshotFinishesDuringShutdown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane: skipped with -short")
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	g := NewWithT(t)
	env := &envtest.Environment{}
	cfg, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(env.Stop()).To(Succeed()) })

	mgrOpts := ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cacheOptions(), // only the labelled ConfigMaps, as in main
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	}
	q, err := runnable.Setup(cfg, &mgrOpts, runnable.Options{
		GracePeriod: 25 * time.Second, // below the manager's default GracefulShutdownTimeout (30s)
		CancelAfter: 20 * time.Second, // in-flight reconciles may finish
	})
	g.Expect(err).NotTo(HaveOccurred())
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(q.Add(mgr)).To(Succeed())
	g.Expect((&ConfigMapReconciler{Client: mgr.GetClient(), Work: 500 * time.Millisecond}).
		SetupWithManager(mgr, q.Executor(), 1)).To(Succeed())

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(ctx) }()

	c, err := client.New(cfg, client.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: "job-1", Namespace: "default", Labels: map[string]string{labelKey: labelValue},
	}}
	g.Expect(c.Create(ctx, cm)).To(Succeed())

	// Stop the manager, like SIGTERM, while the snapshot runs.
	g.Eventually(q.Executor().Pending).WithTimeout(time.Minute).Should(ContainElement(HaveField("Name", "demo/default/job-1/snapshot")))
	stoppedAt := time.Now()
	stop()
	g.Eventually(stopped).WithTimeout(time.Minute).Should(Receive(Succeed()))
	g.Expect(q.Err()).NotTo(HaveOccurred())

	// The snapshot finished after the stop and was recorded, and nothing is left running.
	draintest.VerifyNone(t, q.Executor())
	g.Expect(c.Get(context.Background(), client.ObjectKeyFromObject(cm), cm)).To(Succeed())
	g.Expect(cm.Annotations).To(HaveKey(SnapshotAnnotation))
	recorded, err := time.Parse(time.RFC3339Nano, cm.Annotations[SnapshotAnnotation])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(recorded).To(BeTemporally(">", stoppedAt))
}
