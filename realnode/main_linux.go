package realnode

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// envDir, set in the re-executed test binary, is the directory of the node's namespaces: its
// presence says that the process runs inside them.
const envDir = "QUIESCE_REALNODE_DIR"

// The node's network, inside its network namespace: a veth pair, the node's address on one
// end, the default route through the other (kubelet and kube-apiserver want a non-loopback
// address and a default route; the kernel may lack the dummy driver, veth is everywhere).
const (
	nodeIP    = "10.200.0.2"
	gatewayIP = "10.200.0.1"
)

// The global (not namespaced) sysctls that kubelet rewrites; each gets a private copy.
var globalSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// Main runs the tests of m inside private mount and network namespaces, where Start can run
// a node without touching the host, and returns their exit code: call it from TestMain.
//
//	func TestMain(m *testing.M) { os.Exit(realnode.Main(m)) }
//
// Outside the namespaces (the process `go test` started), Main re-executes the test binary,
// with the same arguments, in new namespaces, relays SIGINT, SIGTERM and SIGQUIT to it, waits
// for it, and then undoes on the host what the node could not keep private: it kills what is
// left in the node's network namespace and in kubelet's cgroups, removes those cgroups and the
// node's directory, and compares the host's mounts, network links, iptables rules and the
// sysctls kubelet writes with what they were before. It returns 1 if the host differs, or
// if the tests could not run (not root, a missing capability or command: the message names
// it). Inside, it makes /var/lib, /var/log and /run private directories (kubelet, containerd
// and the CNI plugins write fixed paths there) and the global sysctls kubelet rewrites
// private copies, brings up the node's network, then runs m.
//
// Main blocks until the tests end. One node runs at a time on a host: a second Main waits for
// the first to end (a lock file in the temporary directory).
func Main(m interface{ Run() int }) int {
	if dir := os.Getenv(envDir); dir != "" {
		if err := checkNamespaces(os.Getppid()); err != nil {
			fmt.Fprintf(os.Stderr, "realnode: refusing to prepare the node: %v\n", err)
			return 1
		}
		if err := enterNode(dir); err != nil {
			fmt.Fprintf(os.Stderr, "realnode: failed to prepare the node's namespaces: %v\n", err)
			return 1
		}
		return m.Run()
	}
	code, err := runIsolated()
	if err != nil {
		fmt.Fprintf(os.Stderr, "realnode: %v\n", err)
		return 1
	}
	return code
}

// checkNamespaces refuses to prepare the node unless this process runs in mount and network
// namespaces of its own, not its parent's: envDir in the environment is only a claim (set by
// hand, or inherited), and enterNode mounts over /run, /var/lib and /var/log.
func checkNamespaces(parent int) error {
	for _, ns := range []string{"mnt", "net"} {
		mine, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			return fmt.Errorf("failed to read this process's %s namespace: %w", ns, err)
		}
		theirs, err := os.Readlink("/proc/" + strconv.Itoa(parent) + "/ns/" + ns)
		if err != nil {
			return fmt.Errorf("failed to read the parent's %s namespace: %w", ns, err)
		}
		if mine == theirs {
			return fmt.Errorf("%s is set but this process shares its parent's %s namespace (%s): "+
				"unset it; only Main sets it, in the test binary it re-executes", envDir, ns, mine)
		}
	}
	return nil
}

// preflight names what this machine lacks to run a node.
func preflight() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (run the tests as root: the node mounts, runs containers, writes iptables)")
	}
	for _, c := range []string{"ip", "iptables", "containerd", "runc", "ctr"} {
		if _, err := exec.LookPath(c); err != nil {
			missing = append(missing, fmt.Sprintf("the command %s (hack/setup-realnode.sh installs it)", c))
		}
	}
	if _, err := os.Stat(filepath.Join(cniBinDir, "bridge")); err != nil {
		missing = append(missing, "the CNI plugins in "+cniBinDir+" (hack/setup-realnode.sh installs them)")
	}
	if cgroups, _ := kubepodsCgroups(); len(cgroups) > 0 {
		missing = append(missing, fmt.Sprintf("a host without another kubelet (kubepods cgroups exist: %s)", cgroups[0]))
	}
	if len(missing) > 0 {
		return fmt.Errorf("cannot run a node here; missing: %s", strings.Join(missing, "; "))
	}
	return nil
}

// runIsolated re-executes the test binary in new namespaces and cleans up after it.
func runIsolated() (int, error) {
	// One node at a time on a host: a node's cleanup kills what runs in kubelet's cgroups,
	// another node's pods included, and its host check would count the other's changes.
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "quiesce-realnode.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return 1, fmt.Errorf("failed to open the node's lock: %w", err)
	}
	defer func() { _ = lock.Close() }() // releases the lock
	if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		fmt.Fprintf(os.Stderr, "realnode: waiting for another real node on this host to end (%s)\n", lock.Name())
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			return 1, fmt.Errorf("failed to lock %s: %w", lock.Name(), err)
		}
	}
	if err := preflight(); err != nil {
		return 1, err
	}
	before, err := hostState()
	if err != nil {
		return 1, err
	}
	// A short path: containerd's socket paths under it must stay below 108 bytes.
	dir, err := os.MkdirTemp("", "realnode-")
	if err != nil {
		return 1, fmt.Errorf("failed to create the node's directory: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return 1, fmt.Errorf("failed to find the test binary: %w", err)
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), envDir+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET,
		Pdeathsig:  syscall.SIGKILL,
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return 1, errors.Join(fmt.Errorf("failed to start the tests in new namespaces: %w", err), os.RemoveAll(dir))
	}
	netns, nsErr := nsID(cmd.Process.Pid)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var werr error
	for done := false; !done; {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case werr = <-waited:
			done = true
		}
	}
	code := cmd.ProcessState.ExitCode()
	if code < 0 && werr != nil {
		fmt.Fprintf(os.Stderr, "realnode: the tests ended: %v\n", werr)
		code = 1
	}
	cleanErr := errors.Join(nsErr, cleanupHost(netns, dir))
	after, err := hostState()
	if err != nil {
		return 1, errors.Join(cleanErr, err)
	}
	if diff := diffState(before, after); len(diff) > 0 {
		cleanErr = errors.Join(cleanErr,
			fmt.Errorf("the host differs from before the node ran:\n  %s", strings.Join(diff, "\n  ")))
	}
	if cleanErr != nil {
		return 1, cleanErr
	}
	return code, nil
}

// enterNode prepares the namespaces the process was started in (see Main).
func enterNode(dir string) error {
	// Nothing mounted here propagates to the host.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("failed to make the mounts private: %w", err)
	}
	ns := filepath.Join(dir, "ns")
	for _, p := range []struct{ private, over string }{
		{"var-lib", "/var/lib"}, {"var-log", "/var/log"}, {"run", "/run"},
	} {
		src := filepath.Join(ns, p.private)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(src, p.over, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("failed to mount a private %s: %w", p.over, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(ns, "sysctl"), 0o755); err != nil {
		return err
	}
	for _, s := range globalSysctls {
		path := "/proc/sys/" + s
		v, err := os.ReadFile(path)
		if err != nil {
			continue // not in this kernel: kubelet will not write it either
		}
		cp := filepath.Join(ns, "sysctl", strings.ReplaceAll(s, "/", "."))
		if err := os.WriteFile(cp, v, 0o644); err != nil {
			return err
		}
		if err := syscall.Mount(cp, path, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("failed to mount a private copy of %s: %w", path, err)
		}
	}
	for _, cmd := range []string{
		"link set lo up",
		"link add node0 type veth peer name node0-peer",
		"link set node0-peer up",
		"addr add " + nodeIP + "/24 dev node0",
		"link set node0 up",
		"route add default via " + gatewayIP + " dev node0",
	} {
		args := strings.Fields(cmd)
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("failed to run ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// nsID identifies the network namespace of the process pid.
func nsID(pid int) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		return 0, fmt.Errorf("failed to read the node's network namespace: %w", err)
	}
	return st.Ino, nil
}

// cleanupHost kills what the node left running (processes in its network namespace, which
// outlive the tests only when Stop was not called or failed: containerd's shims, and the
// containers in kubelet's cgroups), removes kubelet's cgroups, then the node's directory.
func cleanupHost(netns uint64, dir string) error {
	var errs []error
	var leftovers []string
	for range 3 { // processes may fork while they are killed
		killed := 0
		procs, _ := os.ReadDir("/proc")
		for _, p := range procs {
			pid, err := strconv.Atoi(p.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			if id, err := nsID(pid); err == nil && netns != 0 && id == netns {
				leftovers = append(leftovers, procName(pid))
				_ = syscall.Kill(pid, syscall.SIGKILL)
				killed++
			}
		}
		cgroups, _ := kubepodsCgroups()
		for _, c := range cgroups {
			_ = filepath.WalkDir(c, func(path string, d os.DirEntry, err error) error {
				if err != nil || d.Name() != "cgroup.procs" {
					return nil
				}
				b, _ := os.ReadFile(path)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						leftovers = append(leftovers, procName(pid))
						_ = syscall.Kill(pid, syscall.SIGKILL)
						killed++
					}
				}
				return nil
			})
		}
		if killed == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond) // let the kernel reap what was killed
	}
	if len(leftovers) > 0 {
		slices.Sort(leftovers)
		errs = append(errs, fmt.Errorf("processes of the node outlived the tests (Node.Stop not called, or failed), "+
			"killed: %s", strings.Join(slices.Compact(leftovers), ", ")))
	}
	cgroups, _ := kubepodsCgroups()
	for _, c := range cgroups {
		if err := removeCgroup(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("failed to remove the node's directory: %w", err))
	}
	return errors.Join(errs...)
}

func procName(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return fmt.Sprintf("%s[%d]", strings.TrimSpace(string(b)), pid)
}

// kubepodsCgroups are kubelet's cgroups (cgroupfs driver), in every hierarchy: the one
// thing of a node that no namespace here keeps private.
func kubepodsCgroups() ([]string, error) {
	v1, err := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	if err != nil {
		return nil, err
	}
	v2, err := filepath.Glob("/sys/fs/cgroup/kubepods")
	return append(v1, v2...), err
}

// removeCgroup removes the cgroup c and those below it, deepest first, retrying briefly
// while the kernel still counts the last killed processes in them.
func removeCgroup(c string) error {
	var dirs []string
	_ = filepath.WalkDir(c, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	slices.Reverse(dirs)
	var err error
	for range 50 {
		err = nil
		for _, d := range dirs {
			if e := syscall.Rmdir(d); e != nil && !errors.Is(e, syscall.ENOENT) {
				err = fmt.Errorf("failed to remove cgroup %s: %w", d, e)
			}
		}
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// hostState is what the node must leave as it found it: the mount points, the network links,
// the iptables rules, kubepods cgroups and the sysctls kubelet, kube-proxy and the CNI
// plugins write.
func hostState() (map[string]string, error) {
	st := map[string]string{}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("failed to read the host's mounts: %w", err)
	}
	defer func() { _ = f.Close() }()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 {
			mounts = append(mounts, fields[4])
		}
	}
	slices.Sort(mounts)
	st["mounts"] = strings.Join(mounts, "\n")
	links, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		return nil, fmt.Errorf("failed to list the host's network links: %w", err)
	}
	var names []string
	for _, l := range strings.Split(string(links), "\n") {
		if fields := strings.Fields(l); len(fields) > 1 {
			names = append(names, strings.TrimSuffix(fields[1], ":"))
		}
	}
	st["links"] = strings.Join(names, " ")
	if rules, err := exec.Command("iptables-save").Output(); err == nil {
		var keep []string
		for _, l := range strings.Split(string(rules), "\n") {
			if !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, ":") { // comments and counters
				keep = append(keep, l)
			}
		}
		st["iptables"] = strings.Join(keep, "\n")
	}
	cgroups, _ := kubepodsCgroups()
	st["kubepods cgroups"] = strings.Join(cgroups, " ")
	for _, s := range append(slices.Clone(globalSysctls), "net/ipv4/ip_forward",
		"net/ipv4/conf/all/route_localnet", "net/bridge/bridge-nf-call-iptables") {
		if v, err := os.ReadFile("/proc/sys/" + s); err == nil {
			st["sysctl "+s] = strings.TrimSpace(string(v))
		}
	}
	return st, nil
}

// diffState names what differs between two hostStates.
func diffState(before, after map[string]string) []string {
	var diff []string
	for k, v := range before {
		if after[k] != v {
			diff = append(diff, fmt.Sprintf("%s: before %q, after %q", k, clip(v), clip(after[k])))
		}
	}
	for k, v := range after {
		if _, ok := before[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s: new, %q", k, clip(v)))
		}
	}
	slices.Sort(diff)
	return diff
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
