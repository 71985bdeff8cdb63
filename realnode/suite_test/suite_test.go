//go:build realnode

package realnode_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	"k8s.io/client-go/kubernetes"

	"github.com/quiesce-dev/quiesce/realnode"
)

// The operator under test: examples/rollout's, as a static binary in a one-layer image.
const operatorImage = "localhost/rollout-operator:test"

var (
	node *realnode.Node
	cs   kubernetes.Interface
)

// TestMain runs the specs inside the node's private namespaces (realnode.Main), then checks
// for leaked goroutines there. The specs fail, never skip, on a machine that cannot run them.
func TestMain(m *testing.M) {
	os.Exit(realnode.Main(leakChecked{m}))
}

type leakChecked struct{ m *testing.M }

func (l leakChecked) Run() int {
	code := l.m.Run()
	if code == 0 {
		// Ginkgo's interrupt handler waits for a signal for the life of the process; client-go's
		// shared transports keep idle connections (the node is stopped, they are closing).
		if err := goleak.Find(
			goleak.IgnoreTopFunction("github.com/onsi/ginkgo/v2/internal/interrupt_handler.(*InterruptHandler).registerForInterrupts.func2"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

func TestRealNode(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "quiesce on a real node")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	SetDefaultEventuallyTimeout(time.Minute)
	SetDefaultEventuallyPollingInterval(200 * time.Millisecond)
	root, err := filepath.Abs("../..")
	Expect(err).NotTo(HaveOccurred())
	By("starting a real node: etcd, kube-apiserver, containerd, kubelet, kube-controller-manager, kube-proxy")
	n, err := realnode.Start(ctx, realnode.Options{
		Images: []realnode.Image{{Name: operatorImage, Package: "./examples/rollout/operator", Dir: root}},
		Output: GinkgoWriter,
	})
	node = n
	DeferCleanup(func() error {
		if node == nil {
			return nil
		}
		return node.Stop()
	})
	Expect(err).NotTo(HaveOccurred())
	cs, err = kubernetes.NewForConfig(node.Config())
	Expect(err).NotTo(HaveOccurred())
}, NodeTimeout(5*time.Minute))
