package suite_test

import (
	"context"
	"sync"
	"time"

	"go.uber.org/goleak"
	utilnet "k8s.io/apimachinery/pkg/util/net"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quiesce-dev/quiesce/runnable"
)

// newNamespace creates a namespace of its own for a spec, so specs never see each other's objects.
func newNamespace(ctx context.Context) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "quiesce-"}}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// managerOptions are the Options of newManager and newQuiesced: no metrics or probe
// listeners unless mutate sets them; the last mutate's fields win.
func managerOptions(mutate ...func(*manager.Options)) manager.Options {
	opts := manager.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Specs register controllers of the same name on several managers.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	}
	for _, m := range mutate {
		m(&opts)
	}
	return opts
}

// newManager makes a manager on the suite's control plane without quiesce: plain controller-runtime.
func newManager(mutate ...func(*manager.Options)) manager.Manager {
	mgr, err := ctrl.NewManager(cfg, managerOptions(mutate...))
	Expect(err).NotTo(HaveOccurred())
	return mgr
}

// newPlainManager is newManager: plain controller-runtime.
func newPlainManager(mutate ...func(*manager.Options)) manager.Manager { return newManager(mutate...) }

// newQuiesced sets quiesce up as an operator's main.go does: runnable.Setup(cfg, &mgrOpts, o)
// on the Options of newManager, ctrl.NewManager, q.Add. err is Setup's or Add's.
func newQuiesced(o runnable.Options, mutate ...func(*manager.Options)) (manager.Manager, *runnable.Runnable, error) {
	opts := managerOptions(mutate...)
	q, err := runnable.Setup(cfg, &opts, o)
	if err != nil {
		return nil, nil, err
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	Expect(err).NotTo(HaveOccurred())
	return mgr, q, q.Add(mgr)
}

// inNamespace restricts a manager's cache to ns, so that its controllers see only the
// spec's own objects.
func inNamespace(ns string) func(*manager.Options) {
	return func(o *manager.Options) {
		o.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}
	}
}

// startManager starts mgr on its own context; stop cancels it (like SIGTERM), done receives
// what mgr.Start returned. With q, the manager's context comes from q.StopContext, as in an
// operator's main.go. Should the spec fail first, its cleanup stops mgr and waits for it,
// so that no spec leaves a manager running into the next.
func startManager(mgr manager.Manager, q ...*runnable.Runnable) (stop context.CancelFunc, done <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	mgrCtx := ctx
	if len(q) > 0 {
		mgrCtx = q[0].StopContext(ctx)
	}
	ch := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(exited)
		ch <- mgr.Start(mgrCtx)
	}()
	DeferCleanup(func() {
		cancel()
		Eventually(exited, time.Minute).Should(BeClosed())
	})
	return cancel, ch
}

// releaser returns a channel for a spec's handlers to block on, closed by release or,
// should the spec fail first, by its cleanup.
func releaser() (ch chan struct{}, release func()) {
	ch = make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	DeferCleanup(release)
	return ch, release
}

// expectNoLeaks waits until no goroutine is left beyond those in cur. It closes the clients'
// idle keep-alive connections on each try (they would time out after a while anyway): a
// request still finishing, such as a leader's lease release, leaves one idle a moment later.
func expectNoLeaks(cur goleak.Option) {
	GinkgoHelper()
	Eventually(func() error {
		transportsMu.Lock()
		for _, rt := range transports {
			utilnet.CloseIdleConnectionsFor(rt)
		}
		transportsMu.Unlock()
		return goleak.Find(cur)
	}, 10*time.Second).Should(Succeed())
}

// stopBegins returns the first lines of quiesce's log in a stop that waits for calls.
func stopBegins() []string { return []string{"Stop began", "Draining executor"} }
