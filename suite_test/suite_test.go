package suite_test

import (
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// One control plane for the whole suite: starting one costs seconds, a spec milliseconds.
var (
	testEnv   *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client
	// broadcaster records the specs' Events. It is the suite's own, not a manager's:
	// mgr.GetEventRecorder exists only from controller-runtime v0.23 on, and the suite runs
	// on the whole supported range.
	broadcaster events.EventBroadcaster

	transportsMu sync.Mutex
	transports   []http.RoundTripper
)

// TestMain runs the suite or, in a process a spec started (startReplica), one replica of an
// operator (runReplica).
func TestMain(m *testing.M) {
	if os.Getenv(replicaEnv) != "" {
		os.Exit(runReplica())
	}
	os.Exit(m.Run())
}

func TestSuite(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "quiesce Suite")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(GinkgoLogr)
	// Eventually waits for the cluster and for managers starting up, which on a busy CI
	// machine takes far longer than Gomega's default second; a spec that passes waits no
	// longer for it.
	SetDefaultEventuallyTimeout(30 * time.Second)

	By("starting the envtest control plane")
	// KUBEBUILDER_ASSETS (set by `make test` from hack/setup-envtest.sh) names the binaries.
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	testEnv = &envtest.Environment{}
	var err error
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	Expect(cfg).NotTo(BeNil())
	// Remember every client transport, so that specs can close their idle connections
	// before looking for leaked goroutines.
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		transportsMu.Lock()
		defer transportsMu.Unlock()
		transports = append(transports, rt)
		return rt
	}

	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme.Scheme})
	Expect(err).NotTo(HaveOccurred())

	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	broadcaster = events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	broadcaster.StartRecordingToSink(suiteStop)
})

// suiteStop ends the Event broadcaster's background work at the end of the suite.
var suiteStop = make(chan struct{})

var _ = AfterSuite(func() {
	close(suiteStop)
	if broadcaster != nil {
		broadcaster.Shutdown()
	}
	By("stopping the envtest control plane")
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})
