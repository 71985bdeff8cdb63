package realnode

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The node's fixed addresses, private to its network namespace.
const (
	// NodeName is the name of the node; with no scheduler running, a Pod sets
	// spec.nodeName to it.
	NodeName = "realnode"
	// PauseImage is the sandbox image, built by Start.
	PauseImage = "localhost/pause:realnode"

	kubelet = "kubelet" // the process, its binary, its directory, its kubeconfig

	apiserverPort = 16443
	kubeletPort   = 10250
	podCIDR       = "10.88.0.0/16"
	serviceCIDR   = "10.0.0.0/24"
	kubernetesVIP = "10.0.0.1" // the kubernetes Service: the first address of serviceCIDR
	cniBinDir     = "/usr/lib/cni"
)

//go:embed assets
var assets embed.FS

// Options configure Start. Every field has a working zero value.
type Options struct {
	// NodeAssets is the directory holding kubelet, kube-controller-manager and kube-proxy.
	// Default: the environment variable REALNODE_ASSETS (hack/setup-realnode.sh prints it).
	NodeAssets string
	// ControlPlaneAssets is the directory holding etcd and kube-apiserver. Default: the
	// environment variable KUBEBUILDER_ASSETS (hack/setup-envtest.sh prints it).
	ControlPlaneAssets string
	// Images are built and loaded into the node before Start returns; Load loads more later.
	Images []Image
	// Output receives one line per step of Start and Stop, with its time; nil: discard.
	Output io.Writer
	// StartTimeout bounds Start; default 3 minutes (building the images included).
	StartTimeout time.Duration
}

// Node is a running single-node cluster: etcd, kube-apiserver, containerd, kubelet,
// kube-controller-manager and kube-proxy, every one a child process of the test, with all its
// state in one directory. Its methods are safe for concurrent use.
type Node struct {
	dir   string
	out   io.Writer
	ca    *keyPair
	admin *keyPair
	cfg   *rest.Config
	start time.Time

	nodeAssets, controlPlaneAssets string

	mu      sync.Mutex
	procs   []*process // in start order
	stopped bool
}

type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// Start starts a node and returns once it is Ready, the controller-manager created the
// default ServiceAccount and the kube-root-ca.crt ConfigMap, and kube-proxy programmed the
// kubernetes Service. It must run inside the namespaces that Main prepares; it fails, saying
// so, anywhere else. Call Stop when done, also when Start failed (it stops what started).
// ctx bounds Start only; the node runs until Stop.
func Start(ctx context.Context, opts Options) (*Node, error) {
	dir := os.Getenv(envDir)
	if dir == "" {
		return nil, errors.New("failed to start a node: not inside the node's namespaces; call realnode.Main from TestMain")
	}
	if opts.NodeAssets == "" {
		opts.NodeAssets = os.Getenv("REALNODE_ASSETS")
	}
	if opts.ControlPlaneAssets == "" {
		opts.ControlPlaneAssets = os.Getenv("KUBEBUILDER_ASSETS")
	}
	const nodeField, cpField = "NodeAssets (REALNODE_ASSETS)", "ControlPlaneAssets (KUBEBUILDER_ASSETS)"
	var missing []string
	for _, b := range []struct{ dir, name, field string }{
		{opts.NodeAssets, kubelet, nodeField},
		{opts.NodeAssets, "kube-controller-manager", nodeField},
		{opts.NodeAssets, "kube-proxy", nodeField},
		{opts.ControlPlaneAssets, "etcd", cpField},
		{opts.ControlPlaneAssets, "kube-apiserver", cpField},
	} {
		if st, err := os.Stat(filepath.Join(b.dir, b.name)); b.dir == "" || err != nil || st.IsDir() {
			missing = append(missing, fmt.Sprintf("%s in Options.%s=%q", b.name, b.field, b.dir))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("failed to start a node: missing %s "+
			"(hack/setup-realnode.sh and hack/setup-envtest.sh print the directories)", strings.Join(missing, ", "))
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 3 * time.Minute
	}
	if opts.Output == nil {
		opts.Output = io.Discard
	}
	n := &Node{
		dir: filepath.Join(dir, "node"), out: opts.Output, start: time.Now(),
		nodeAssets: opts.NodeAssets, controlPlaneAssets: opts.ControlPlaneAssets,
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	if err := n.run(ctx, opts); err != nil {
		return n, fmt.Errorf("failed to start a node: %w", err)
	}
	return n, nil
}

// run is Start's sequence, one step at a time.
func (n *Node) run(ctx context.Context, opts Options) error {
	for _, d := range []string{"run", "log/pods", "etc", "pki", "etcd", "containerd", kubelet, "cni/net.d", "images"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := n.writePKI(); err != nil {
		return err
	}
	n.say("PKI and kubeconfigs written")

	// Images build while containerd starts: the Go builds are the slow part.
	images := append([]Image{{Name: PauseImage}}, opts.Images...)
	built := make(chan error, 1)
	var archives []string
	go func() {
		var err error
		archives, err = n.buildImages(ctx, images)
		built <- err
	}()
	if err := n.startContainerd(ctx); err != nil {
		return errors.Join(err, <-built)
	}
	n.say("containerd up")
	if err := <-built; err != nil {
		return err
	}
	if err := n.importImages(ctx, archives); err != nil {
		return err
	}
	n.say("images built and imported")

	if err := n.startControlPlane(ctx); err != nil {
		return err
	}
	n.say("kube-apiserver ready")
	cs, err := kubernetes.NewForConfig(n.cfg)
	if err != nil {
		return err
	}
	if err := n.startKubelet(ctx, cs); err != nil {
		return err
	}
	n.say("node Ready")
	if err := n.startControllerManager(ctx, cs); err != nil {
		return err
	}
	n.say("kube-controller-manager up: default ServiceAccount and kube-root-ca.crt exist")
	if err := n.startKubeProxy(ctx); err != nil {
		return err
	}
	n.say("kube-proxy programmed the kubernetes Service")
	return nil
}

func (n *Node) say(msg string) {
	_, _ = fmt.Fprintf(n.out, "realnode: [+%.1fs] %s\n", time.Since(n.start).Seconds(), msg)
}

// Config returns a copy of the cluster administrator's configuration (system:masters).
func (n *Node) Config() *rest.Config { return rest.CopyConfig(n.cfg) }

// Dir is the directory holding all of the node's state; its log/ has one file per process.
func (n *Node) Dir() string { return n.dir }

// CA returns the PEM of the cluster's certificate authority: the API server's serving
// certificate, the clients' and ServingCert's certificates are signed by it (a webhook
// configuration's caBundle).
func (n *Node) CA() []byte { return slices.Clone(n.ca.certPEM) }

// ServingCert returns a serving certificate and its key, in PEM, for names (DNS names or IP
// addresses; at least one), signed by CA: e.g. a webhook Service's "<svc>.<namespace>.svc".
func (n *Node) ServingCert(names ...string) (certPEM, keyPEM []byte, err error) {
	if len(names) == 0 {
		return nil, nil, errors.New("failed to make a serving certificate: no name given")
	}
	kp, err := n.ca.serving(names...)
	if err != nil {
		return nil, nil, err
	}
	return kp.certPEM, kp.keyPEM, nil
}

// writePKI writes the certificate authority, the API server's serving certificate, the
// clients' certificates and kubeconfigs (admin: system:masters; kubelet: system:node:<name>),
// and the service account signing key.
func (n *Node) writePKI() error {
	var err error
	if n.ca, err = newCA("realnode-ca"); err != nil {
		return err
	}
	apiserver, err := n.ca.serving("127.0.0.1", kubernetesVIP, nodeIP, "localhost",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
	if err != nil {
		return err
	}
	if n.admin, err = n.ca.client("realnode-admin", "system:masters"); err != nil {
		return err
	}
	kubeletClient, err := n.ca.client("system:node:"+NodeName, "system:nodes")
	if err != nil {
		return err
	}
	kubeletServing, err := n.ca.serving(nodeIP, NodeName)
	if err != nil {
		return err
	}
	sa, err := newCA("service-accounts") // only its key is used
	if err != nil {
		return err
	}
	saPub, err := sa.publicPEM()
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"ca.crt": n.ca.certPEM, "apiserver.crt": apiserver.certPEM, "apiserver.key": apiserver.keyPEM,
		"admin.crt": n.admin.certPEM, "admin.key": n.admin.keyPEM,
		"kubelet-serving.crt": kubeletServing.certPEM, "kubelet-serving.key": kubeletServing.keyPEM,
		"sa.key": sa.keyPEM, "sa.pub": saPub,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(n.dir, "pki", name), b, 0o600); err != nil {
			return err
		}
	}
	n.cfg = &rest.Config{
		Host: fmt.Sprintf("https://127.0.0.1:%d", apiserverPort),
		TLSClientConfig: rest.TLSClientConfig{
			CAData: n.ca.certPEM, CertData: n.admin.certPEM, KeyData: n.admin.keyPEM,
		},
		QPS: 100, Burst: 200,
	}
	for name, kp := range map[string]*keyPair{"admin": n.admin, kubelet: kubeletClient} {
		kc := clientcmdapi.NewConfig()
		kc.Clusters["node"] = &clientcmdapi.Cluster{Server: n.cfg.Host, CertificateAuthorityData: n.ca.certPEM}
		kc.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.certPEM, ClientKeyData: kp.keyPEM}
		kc.Contexts["node"] = &clientcmdapi.Context{Cluster: "node", AuthInfo: name}
		kc.CurrentContext = "node"
		if err := clientcmd.WriteToFile(*kc, n.path("etc", name+".kubeconfig")); err != nil {
			return fmt.Errorf("failed to write the %s kubeconfig: %w", name, err)
		}
	}
	return nil
}

func (n *Node) path(elem ...string) string { return filepath.Join(append([]string{n.dir}, elem...)...) }

// render fills the embedded template name and writes it to dest.
func (n *Node) render(name, dest string) error {
	runc, err := exec.LookPath("runc")
	if err != nil {
		return fmt.Errorf("failed to find runc: %w", err)
	}
	t, err := template.ParseFS(assets, "assets/"+name)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, map[string]any{
		"Dir": n.dir, "NodeName": NodeName, "NodeIP": nodeIP, "KubeletPort": kubeletPort,
		"PodCIDR": podCIDR, "CNIBinDir": cniBinDir, "Runc": runc, "PauseImage": PauseImage,
	}); err != nil {
		return err
	}
	return os.WriteFile(dest, b.Bytes(), 0o644)
}

// buildImages builds each image's program and writes its archive; the pause image's program
// is embedded.
func (n *Node) buildImages(ctx context.Context, images []Image) ([]string, error) {
	var archives []string
	for i, img := range images {
		work := n.path("images", fmt.Sprint(i))
		if err := os.MkdirAll(work, 0o755); err != nil {
			return nil, err
		}
		if img.Name == PauseImage && img.Package == "" {
			// The sandbox's program is embedded: a module of its own, built where it is written.
			src, err := assets.ReadFile("assets/pause.go.txt")
			if err != nil {
				return nil, err
			}
			img.Package, img.Dir = ".", filepath.Join(work, "pause")
			gomod := []byte("module realnode.local/pause\n\ngo 1.22\n")
			if err := errors.Join(os.MkdirAll(img.Dir, 0o755),
				os.WriteFile(filepath.Join(img.Dir, "main.go"), src, 0o644),
				os.WriteFile(filepath.Join(img.Dir, "go.mod"), gomod, 0o644)); err != nil {
				return nil, err
			}
		}
		bin, err := img.build(ctx, work)
		if err != nil {
			return nil, err
		}
		archives = append(archives, filepath.Join(work, "image.tar"))
		if err := writeImage(img.Name, bin, archives[len(archives)-1]); err != nil {
			return nil, err
		}
	}
	return archives, nil
}

// Load builds images and loads them into the node's containerd.
func (n *Node) Load(ctx context.Context, images ...Image) error {
	archives, err := n.buildImages(ctx, images)
	if err != nil {
		return err
	}
	return n.importImages(ctx, archives)
}

func (n *Node) importImages(ctx context.Context, archives []string) error {
	for _, a := range archives {
		if out, err := n.ctr(ctx, "images", "import", "--all-platforms", a); err != nil {
			return fmt.Errorf("failed to import %s: %w: %s", a, err, out)
		}
	}
	return nil
}

// ctr runs containerd's client against the node's containerd, in the CRI's namespace.
func (n *Node) ctr(ctx context.Context, args ...string) ([]byte, error) {
	all := append([]string{"--address", n.path("run", "containerd", "containerd.sock"), "-n", "k8s.io"}, args...)
	return exec.CommandContext(ctx, "ctr", all...).CombinedOutput()
}

func (n *Node) startContainerd(ctx context.Context) error {
	if err := errors.Join(
		n.render("containerd.toml", n.path("etc", "containerd.toml")),
		n.render("10-nodenet.conflist", n.path("cni", "net.d", "10-nodenet.conflist")),
	); err != nil {
		return err
	}
	p, err := n.spawn("containerd", "containerd", "--config", n.path("etc", "containerd.toml"))
	if err != nil {
		return err
	}
	return n.until(ctx, p, "containerd answers", func(ctx context.Context) (bool, error) {
		_, err := n.ctr(ctx, "version")
		return err == nil, nil
	})
}

func (n *Node) startControlPlane(ctx context.Context) error {
	cp := n.controlPlaneAssets
	etcd, err := n.spawn("etcd", filepath.Join(cp, "etcd"), "--data-dir="+n.path("etcd"),
		"--listen-client-urls=http://127.0.0.1:23790", "--advertise-client-urls=http://127.0.0.1:23790",
		"--listen-peer-urls=http://127.0.0.1:23800", "--unsafe-no-fsync=true")
	if err != nil {
		return err
	}
	pki := func(f string) string { return n.path("pki", f) }
	// 0.0.0.0 inside the node's own network namespace: pods reach the API server at the
	// node's address, the kubernetes Service's endpoint. The node's address is advertised
	// (127.0.0.1 is refused as a Service endpoint). Node,RBAC: kubelet has a real
	// system:node identity, operators a ServiceAccount and their Roles.
	apiserver, err := n.spawn("kube-apiserver", filepath.Join(cp, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:23790",
		"--bind-address=0.0.0.0", fmt.Sprintf("--secure-port=%d", apiserverPort),
		"--advertise-address="+nodeIP,
		"--tls-cert-file="+pki("apiserver.crt"), "--tls-private-key-file="+pki("apiserver.key"),
		"--client-ca-file="+pki("ca.crt"),
		"--kubelet-client-certificate="+pki("admin.crt"), "--kubelet-client-key="+pki("admin.key"),
		"--kubelet-certificate-authority="+pki("ca.crt"),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--service-cluster-ip-range="+serviceCIDR,
		fmt.Sprintf("--service-account-issuer=https://127.0.0.1:%d", apiserverPort),
		"--service-account-key-file="+pki("sa.pub"), "--service-account-signing-key-file="+pki("sa.key"))
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(n.cfg)
	if err != nil {
		return err
	}
	rc := cs.Discovery().RESTClient()
	return n.until(ctx, apiserver, "kube-apiserver is ready", func(ctx context.Context) (bool, error) {
		if exited(etcd) {
			return false, fmt.Errorf("etcd exited: %s", tail(etcd.log))
		}
		b, err := rc.Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(b) == "ok", nil
	})
}

func (n *Node) startKubelet(ctx context.Context, cs kubernetes.Interface) error {
	if err := n.render("kubelet.yaml", n.path("etc", "kubelet.yaml")); err != nil {
		return err
	}
	p, err := n.spawn(kubelet, filepath.Join(n.nodeAssets, kubelet),
		"--config="+n.path("etc", "kubelet.yaml"), "--kubeconfig="+n.path("etc", "kubelet.kubeconfig"),
		"--root-dir="+n.path(kubelet),
		"--tls-cert-file="+n.path("pki", "kubelet-serving.crt"),
		"--tls-private-key-file="+n.path("pki", "kubelet-serving.key"),
		"--hostname-override="+NodeName, "--node-ip="+nodeIP, "--v=2")
	if err != nil {
		return err
	}
	return n.until(ctx, p, "the node is Ready", func(ctx context.Context) (bool, error) {
		node, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

// startControllerManager runs the controllers a Deployment's rollout, EndpointSlices,
// ServiceAccounts and garbage collection need, as system:masters, without leader election.
// No scheduler runs: a Pod sets spec.nodeName.
func (n *Node) startControllerManager(ctx context.Context, cs kubernetes.Interface) error {
	kc := n.path("etc", "admin.kubeconfig")
	p, err := n.spawn("kube-controller-manager", filepath.Join(n.nodeAssets, "kube-controller-manager"),
		"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--bind-address=127.0.0.1", "--secure-port=10357", "--leader-elect=false",
		"--controllers=deployment-controller,replicaset-controller,endpointslice-controller,"+
			"endpoints-controller,garbage-collector-controller,serviceaccount-controller,"+
			"root-ca-certificate-publisher-controller,pod-garbage-collector-controller,namespace-controller",
		"--service-account-private-key-file="+n.path("pki", "sa.key"), "--root-ca-file="+n.path("pki", "ca.crt"),
		"--concurrent-deployment-syncs=2", "--concurrent-replicaset-syncs=2", "--v=2")
	if err != nil {
		return err
	}
	const what = "the default ServiceAccount and kube-root-ca.crt exist"
	return n.until(ctx, p, what, func(ctx context.Context) (bool, error) {
		if _, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		_, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, nil
	})
}

func (n *Node) startKubeProxy(ctx context.Context) error {
	if err := n.render("kube-proxy.yaml", n.path("etc", "kube-proxy.yaml")); err != nil {
		return err
	}
	p, err := n.spawn("kube-proxy", filepath.Join(n.nodeAssets, "kube-proxy"),
		"--config="+n.path("etc", "kube-proxy.yaml"), "--v=2")
	if err != nil {
		return err
	}
	return n.until(ctx, p, "kube-proxy programmed the kubernetes Service", func(ctx context.Context) (bool, error) {
		out, err := exec.CommandContext(ctx, "iptables", "-t", "nat", "-S", "KUBE-SERVICES").Output()
		return err == nil && bytes.Contains(out, []byte("default/kubernetes:https")), nil
	})
}

// spawn starts a process of the node, logging to log/<name>.log. It is killed with the
// test process if that dies first (Pdeathsig); Stop stops it.
func (n *Node) spawn(name string, argv ...string) (*process, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return nil, errors.New("failed to start " + name + ": the node is stopped")
	}
	logPath := n.path("log", name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("failed to start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	n.procs = append(n.procs, p)
	return p, nil
}

func exited(p *process) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// until polls cond every 250ms until it holds, fails, p exits, or ctx ends.
func (n *Node) until(ctx context.Context, p *process, what string, cond func(context.Context) (bool, error)) error {
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if exited(p) {
			return false, fmt.Errorf("%s exited: %s", p.name, tail(p.log))
		}
		return cond(ctx)
	})
	if err != nil && !exited(p) { // Stop removes the logs: keep the end of this one in the error
		return fmt.Errorf("failed to wait until %s: %w; the end of %s's log:\n%s", what, err, p.name, tail(p.log))
	}
	if err != nil {
		return fmt.Errorf("failed to wait until %s: %w", what, err)
	}
	return nil
}

// tail is the end of a log file, for error messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}

// Stop stops the node, in the reverse order of its start: the controller-manager, kube-proxy,
// kubelet, every container (through containerd), containerd, kube-apiserver, etcd; each gets
// SIGTERM, then SIGKILL after 10s. Then it unmounts what the node mounted under its
// directory and removes kubelet's cgroups and the directory. Stop is idempotent, and does
// nothing on a nil Node (what Start returns when it started nothing); Main checks, after the
// tests, that nothing of the node is left on the host.
func (n *Node) Stop() error {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		return nil
	}
	n.stopped = true
	procs := slices.Clone(n.procs)
	n.mu.Unlock()
	start := time.Now()
	var errs []error
	byName := map[string]*process{}
	for _, p := range procs {
		byName[p.name] = p
	}
	stop := func(name string) {
		if p := byName[name]; p != nil {
			errs = append(errs, stopProcess(p))
		}
	}
	stop("kube-controller-manager")
	stop("kube-proxy")
	stop(kubelet)
	if p := byName["containerd"]; p != nil && !exited(p) {
		errs = append(errs, n.removeContainers())
	}
	stop("containerd")
	stop("kube-apiserver")
	stop("etcd")
	errs = append(errs, unmountUnder(n.dir))
	if cgroups, err := kubepodsCgroups(); err == nil {
		for _, c := range cgroups {
			errs = append(errs, removeCgroup(c))
		}
	}
	errs = append(errs, os.RemoveAll(n.dir))
	_, _ = fmt.Fprintf(n.out, "realnode: stopped in %.1fs\n", time.Since(start).Seconds())
	return errors.Join(errs...)
}

// removeContainers kills and removes every container of the node (pods' and sandboxes'),
// so that their shims exit.
func (n *Node) removeContainers() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := n.ctr(ctx, "tasks", "ls", "-q")
	if err != nil {
		return fmt.Errorf("failed to list the node's containers: %w: %s", err, out)
	}
	tasks := strings.Fields(string(out))
	for _, id := range tasks {
		_, _ = n.ctr(ctx, "tasks", "kill", "-s", "SIGKILL", id)
	}
	var errs []error
	for _, id := range tasks {
		if out, err := n.ctr(ctx, "tasks", "rm", "-f", id); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove task %s: %w: %s", id, err, out))
		}
	}
	out, err = n.ctr(ctx, "containers", "ls", "-q")
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("failed to list the node's containers: %w: %s", err, out))...)
	}
	for _, id := range strings.Fields(string(out)) {
		if out, err := n.ctr(ctx, "containers", "rm", id); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove container %s: %w: %s", id, err, out))
		}
	}
	return errors.Join(errs...)
}

// stopProcess sends p SIGTERM and waits for it, SIGKILL after 10s.
func stopProcess(p *process) error {
	if exited(p) {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("failed to stop %s: still running 10s after SIGKILL", p.name)
	}
}

// unmountUnder detaches every mount below dir, deepest first: containers' root filesystems,
// their shm, network namespace pins, pod volumes.
func unmountUnder(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("failed to read the mounts: %w", err)
	}
	var mounts []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mounts = append(mounts, f[4])
		}
	}
	slices.Sort(mounts)
	slices.Reverse(mounts)
	var errs []error
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("failed to unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}
