// Package chart holds the chart the operator installs, embedded in its binary.
package chart

import (
	"embed"
	"fmt"
	"io/fs"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
)

//go:embed all:work
var files embed.FS

// Load returns the embedded chart "work", whose one resource is a Job named
// "<release>-work-<version>" (the value version), or, for a version "<n>-ready<seconds>", a
// Deployment "<release>-work" whose pod is Ready after those seconds (the real-node specs').
func Load() (*chart.Chart, error) {
	var bufs []*loader.BufferedFile
	err := fs.WalkDir(files, "work", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := files.ReadFile(path)
		if err != nil {
			return err
		}
		bufs = append(bufs, &loader.BufferedFile{Name: path[len("work/"):], Data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("failed to read the chart: %w", err)
	}
	c, err := loader.LoadFiles(bufs)
	if err != nil {
		return nil, fmt.Errorf("failed to load the chart: %w", err)
	}
	return c, nil
}
