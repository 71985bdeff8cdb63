//go:build linux

package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// readArchive returns the files of a tar archive by name.
func readArchive(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("failed to read the archive: %v", err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("failed to read %s: %v", h.Name, err)
		}
		files[h.Name] = body
	}
}

func TestWriteImageHoldsTheBinaryAsItsEntrypoint(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "operator")
	if err := os.WriteFile(bin, []byte("#!binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "image.tar")
	if err := writeImage("localhost/operator:test", bin, archive); err != nil {
		t.Fatalf("writeImage: %v", err)
	}
	b, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	files := readArchive(t, b)
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json = %s (%v), want one manifest", files["index.json"], err)
	}
	if got := index.Manifests[0].Annotations["io.containerd.image.name"]; got != "localhost/operator:test" {
		t.Errorf("image name = %q, want localhost/operator:test", got)
	}
	blob := func(d string) []byte {
		t.Helper()
		body, ok := files["blobs/sha256/"+strings.TrimPrefix(d, "sha256:")]
		if !ok {
			t.Fatalf("no blob %s", d)
		}
		if digest(body) != d {
			t.Fatalf("blob %s has digest %s", d, digest(body))
		}
		return body
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v, %d layers, want 1", err, len(manifest.Layers))
	}
	var config struct {
		Config struct{ Entrypoint []string }
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(blob(manifest.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(config.Config.Entrypoint, " "); got != "/operator" {
		t.Errorf("entrypoint = %q, want /operator", got)
	}
	layer := blob(manifest.Layers[0].Digest)
	if len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != digest(layer) {
		t.Errorf("diff_ids = %v, want [%s] (an uncompressed layer)", config.RootFS.DiffIDs, digest(layer))
	}
	if got := string(readArchive(t, layer)["operator"]); got != "#!binary" {
		t.Errorf("the layer's /operator = %q, want the binary", got)
	}
}

func TestCertificatesChainToTheCA(t *testing.T) {
	ca, err := newCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	srv, err := ca.serving("10.0.0.1", "webhook.ns.svc")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"10.0.0.1", "webhook.ns.svc"} {
		if _, err := srv.cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}
	if _, err := srv.cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "other.ns.svc"}); err == nil {
		t.Error("the serving certificate verifies for a name it was not made for")
	}
	cl, err := ca.client("system:node:n", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if cl.cert.Subject.CommonName != "system:node:n" || strings.Join(cl.cert.Subject.Organization, ",") != "system:nodes" {
		t.Errorf("client subject = %v, want CN system:node:n, O system:nodes", cl.cert.Subject)
	}
}

func TestStartOutsideTheNamespacesSaysToCallMain(t *testing.T) {
	t.Setenv(envDir, "")
	_, err := Start(context.Background(), Options{})
	if err == nil || !strings.Contains(err.Error(), "realnode.Main") {
		t.Fatalf("Start = %v, want an error naming realnode.Main", err)
	}
}

func TestStartNamesTheMissingAssets(t *testing.T) {
	t.Setenv(envDir, t.TempDir())
	t.Setenv("REALNODE_ASSETS", "")
	cp := t.TempDir()
	n, err := Start(context.Background(), Options{ControlPlaneAssets: cp})
	if err == nil {
		t.Fatal("Start without binaries succeeded")
	}
	if err := n.Stop(); err != nil { // as a suite's DeferCleanup calls it
		t.Errorf("Stop after a failed Start = %v, want nil", err)
	}
	for _, want := range []string{"kubelet in Options.NodeAssets (REALNODE_ASSETS)", "kube-proxy", "etcd in Options.ControlPlaneAssets", "kube-apiserver"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start = %v, want it to name %q", err, want)
		}
	}
}

func TestDiffStateNamesWhatChanged(t *testing.T) {
	before := map[string]string{"links": "lo eth0", "sysctl kernel/panic": "0", "iptables": "-A INPUT"}
	after := map[string]string{"links": "lo eth0 cni-node0", "sysctl kernel/panic": "0", "iptables": "-A INPUT", "kubepods cgroups": "x"}
	diff := diffState(before, after)
	if len(diff) != 2 || !strings.HasPrefix(diff[0], "kubepods cgroups: new") || !strings.HasPrefix(diff[1], "links: before") {
		t.Errorf("diffState = %q, want the links and the new kubepods cgroups", diff)
	}
	if d := diffState(before, before); len(d) != 0 {
		t.Errorf("diffState of equal states = %q, want none", d)
	}
}

// runCounter counts its Runs: Main must not run the tests it refused to set up.
type runCounter struct{ runs int }

func (m *runCounter) Run() int {
	m.runs++
	return 0
}

func TestMainRefusesTheNodeDirInTheParentsNamespaces(t *testing.T) {
	t.Setenv(envDir, t.TempDir()) // a claim this process makes in its parent's namespaces
	var m runCounter
	if code := Main(&m); code != 1 || m.runs != 0 {
		t.Fatalf("Main = %d after %d run(s), want 1 and no run: it must not mount over /run here", code, m.runs)
	}
	err := checkNamespaces(os.Getppid())
	if err == nil || !strings.Contains(err.Error(), "shares its parent's mnt namespace") {
		t.Fatalf("checkNamespaces(parent) = %v, want it to name the shared mount namespace", err)
	}
}
