package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"
)

// Image is an image made from one Go program, built as a static binary: its only layer
// holds the binary as /<base name of Package> (the image's entrypoint) and an empty /tmp.
// Nothing is pulled: a Pod uses it by Name with imagePullPolicy: Never.
type Image struct {
	// Name is the image's reference, e.g. "localhost/operator:test". Required.
	Name string
	// Package is the Go package of the program, e.g. "./cmd" or an import path. Required.
	Package string
	// Dir is where `go build` runs (the module holding Package); empty: the current directory.
	Dir string
	// BuildFlags are added to `go build`'s (-trimpath, -ldflags=-s -w, CGO_ENABLED=0).
	BuildFlags []string
}

// build compiles img's program into dir and returns the binary's path.
func (img Image) build(ctx context.Context, dir string) (string, error) {
	if img.Name == "" || img.Package == "" {
		return "", fmt.Errorf("failed to build image %q: Image.Name and Image.Package are required", img.Name)
	}
	bin := filepath.Join(dir, filepath.Base(img.Package))
	if filepath.Base(img.Package) == "." || filepath.Base(img.Package) == "/" {
		bin = filepath.Join(dir, "app")
	}
	args := append([]string{"build", "-trimpath", "-ldflags=-s -w", "-o", bin}, img.BuildFlags...)
	cmd := exec.CommandContext(ctx, "go", append(args, img.Package)...)
	cmd.Dir = img.Dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("failed to build image %q: go build %s: %w\n%s", img.Name, img.Package, err, out)
	}
	return bin, nil
}

// writeImage writes an OCI image layout, as a tar archive, of the one-layer image named ref
// that holds the binary bin as /<base name> and runs it: what `ctr images import` loads.
func writeImage(ref, bin, archive string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("failed to read %s: %w", bin, err)
	}
	name := filepath.Base(bin)
	epoch := time.Unix(0, 0)
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	files := []struct {
		h    tar.Header
		body []byte
	}{
		{tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: epoch}, nil},
		{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: epoch}, data},
	}
	for _, f := range files {
		if err := tw.WriteHeader(&f.h); err != nil {
			return fmt.Errorf("failed to write the layer of %s: %w", ref, err)
		}
		if _, err := tw.Write(f.body); err != nil {
			return fmt.Errorf("failed to write the layer of %s: %w", ref, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("failed to write the layer of %s: %w", ref, err)
	}
	type desc struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int               `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
		Platform    map[string]string `json:"platform,omitempty"`
	}
	layerDigest := digest(layer.Bytes())
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"Entrypoint": []string{"/" + name}, "Env": []string{"PATH=/"}, "WorkingDir": "/"},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": desc{MediaType: "application/vnd.oci.image.config.v1+json", Digest: digest(config), Size: len(config)},
		"layers": []desc{{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: layerDigest, Size: layer.Len()}},
	})
	if err != nil {
		return err
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
		"manifests": []desc{{
			MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: digest(manifest), Size: len(manifest),
			Annotations: map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref},
			Platform:    map[string]string{"architecture": runtime.GOARCH, "os": "linux"},
		}},
	})
	if err != nil {
		return err
	}
	var out bytes.Buffer
	ow := tar.NewWriter(&out)
	entries := []struct {
		name string
		body []byte
	}{{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}, {"index.json", index}}
	for _, b := range [][]byte{layer.Bytes(), config, manifest} {
		entries = append(entries, struct {
			name string
			body []byte
		}{"blobs/sha256/" + digest(b)[len("sha256:"):], b})
	}
	for _, e := range entries {
		h := tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.body)), ModTime: epoch}
		if err := ow.WriteHeader(&h); err != nil {
			return fmt.Errorf("failed to write image %s: %w", ref, err)
		}
		if _, err := ow.Write(e.body); err != nil {
			return fmt.Errorf("failed to write image %s: %w", ref, err)
		}
	}
	if err := ow.Close(); err != nil {
		return fmt.Errorf("failed to write image %s: %w", ref, err)
	}
	if err := os.WriteFile(archive, out.Bytes(), 0o600); err != nil {
		return fmt.Errorf("failed to write image %s: %w", ref, err)
	}
	return nil
}

func digest(b []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b)) }
