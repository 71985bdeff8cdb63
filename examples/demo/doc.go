// Command demo shows quiesce at work on a real API server; `make demo` runs it.
//
// It starts an envtest control plane (kube-apiserver and etcd from KUBEBUILDER_ASSETS, which
// `make demo` sets from hack/setup-envtest.sh), builds examples/demo-operator and runs it as
// a separate process, its metrics server and quiesce's debug listener on free 127.0.0.1
// ports (plain HTTP, fine for a demo), and creates --objects ConfigMaps for it (--hanging of them with a handler that
// hangs, the others with one that finishes in --work). Once every handler started, it
// fetches the operator's /debug/quiesce and prints the JSON (each pending call, where it
// waits and its handler's line), then sends the operator SIGTERM. The operator's log streams
// to stdout as it comes: the reports of the calls it still waits for, with their age, the
// line where each is blocked and its handler's line; the handlers that finish within the
// grace period; the calls abandoned at its end; the exit code.
//
// Lines starting with "==>" are the demo's own, followed by the JSON of /debug/quiesce for
// the one that fetches it; the others are the operator's log.
//
// The demo exits 0 when everything went as expected: the operator exited with code 1 if a
// handler hangs (0 if none does), and every finishing handler recorded its snapshot after
// SIGTERM. It exits 1 otherwise, and 2 when it could not run (no KUBEBUILDER_ASSETS, build
// failure), 130 when interrupted: it then kills the operator and stops the control plane.
//
//	make demo
//	make demo DEMO_ARGS='--grace-period=10s --objects=5 --hanging=2'
//	KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh) go run ./examples/demo --hanging=0
package main
