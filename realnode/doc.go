// Package realnode runs a real single-node Kubernetes cluster inside a Go test, offline, so
// that a suite proves its operator's stop where users live it: a Pod that the kubelet probes,
// sends SIGTERM and SIGKILLs at terminationGracePeriodSeconds, behind a Service that
// EndpointSlices and kube-proxy route, in a Deployment that rolls. It is shutdowntest's
// envtest runs one level more real (docs/realnode.md).
//
// The node: etcd and kube-apiserver (hack/setup-envtest.sh's binaries, KUBEBUILDER_ASSETS),
// containerd, runc and the CNI plugins (Debian's packages), kubelet, kube-controller-manager
// and kube-proxy (built from source by hack/setup-realnode.sh, REALNODE_ASSETS). Images are
// built from Go packages as static binaries into one-layer images and imported: nothing is
// pulled. No scheduler and no DNS run: a Pod sets spec.nodeName to NodeName, and clients
// inside the cluster use the kubernetes Service's address, as rest.InClusterConfig does.
//
// A suite runs as root, its test binary inside private mount and network namespaces that Main
// prepares; the node never touches the host's /var/lib, /var/log, /run, network, iptables or
// global sysctls. Only kubelet's cgroups are global, so one node runs per host at a time.
//
//	func TestMain(m *testing.M) { os.Exit(realnode.Main(m)) }
//
//	var node *realnode.Node
//
//	var _ = BeforeSuite(func(ctx SpecContext) {
//		var err error
//		node, err = realnode.Start(ctx, realnode.Options{
//			Images: []realnode.Image{{Name: "localhost/operator:test", Package: "./cmd", Dir: root}},
//			Output: GinkgoWriter,
//		})
//		DeferCleanup(func() error { return node.Stop() }) // also when Start failed
//		Expect(err).NotTo(HaveOccurred())
//		// node.Config() is the administrator's rest.Config; apply the operator's manifests with
//		// image "localhost/operator:test", imagePullPolicy: Never, nodeName: realnode.NodeName.
//	}, NodeTimeout(5*time.Minute))
//
// Bounds: Start is bounded by Options.StartTimeout; Stop by 10s of SIGTERM and 10s of SIGKILL
// per process. After the tests, Main kills whatever of the node is left and fails the run if
// the host's mounts, links, iptables rules or sysctls differ from before.
//
// Setup misuse: Start returns an error naming what is missing (the Options field or the
// environment variable, or Main not called); Main returns 1 and names what the machine lacks
// (root, a command, the CNI plugins). A suite that cannot run fails: it never skips.
package realnode
