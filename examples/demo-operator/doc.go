// Command demo-operator is a small operator that uses quiesce the way a kubebuilder
// project would: runnable.Setup and q.Add in main, its reconciler wrapped with reconcilers.Wrap, and
// each blocking handler run with reconcilers.Call.
//
// It reconciles the ConfigMaps labelled demo=quiesce. For each one it runs one handler or a daemon:
//
//   - "snapshot" takes --work (2s by default) and honours its context. A reconcile in flight
//     when the operator gets SIGTERM finishes it within the grace period, because the drain
//     cancels contexts only after --cancel-after, and then records it in the annotation
//     quiesce.dev/snapshot.
//   - "legacy-export", for ConfigMaps whose name starts with "hang", calls a simulated SDK
//     that takes no context and never answers. It cannot be stopped: the drain reports it
//     with its age and the line where it blocks, and at the end of --grace-period the
//     operator names it as abandoned.
//   - "heartbeat", for ConfigMaps whose name starts with "watch", is a daemon
//     (reconcilers.Daemons): it logs a line every 2s for as long as the ConfigMap exists,
//     stops when it is deleted, and stops at once on SIGTERM, when the drain begins.
//
// With --metrics-bind-address, its metrics server serves /metrics over plain HTTP, without
// authentication: fine for a demo on 127.0.0.1, not for a deployed operator. quiesce serves
// its /debug/quiesce (the pending calls as JSON) on no such server: with
// --quiesce-debug-address (e.g. 127.0.0.1:8083) on a loopback listener of its own.
//
// On SIGTERM or SIGINT the manager stops and the quiesce runnable drains the executor. A
// second signal exits at once with code 1 (controller-runtime's signal handler). The exit
// code is 0 when every tracked call returned, 1 when calls were abandoned or the manager
// failed.
//
// `make demo` (see examples/demo) runs it against a real control plane. To run it against
// a cluster of your own:
//
//	go run ./examples/demo-operator --kubeconfig ~/.kube/config
//	kubectl create configmap hang-1 && kubectl label configmap hang-1 demo=quiesce
package main
