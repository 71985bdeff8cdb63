// Command rollout plays a rolling update of an operator on a real API server and measures
// what it loses, with quiesce and without; `make demo-rollout` runs it.
//
// It starts one envtest control plane (kube-apiserver and etcd from KUBEBUILDER_ASSETS)
// whose validating webhook on ConfigMaps (failurePolicy: Fail, CREATE and UPDATE) points at
// a test-only TCP router standing in for a Service: new connections go to the replicas
// whose /readyz passes (probed every 500ms, as a kubelet would), a replica leaves the pool at
// its second failing probe, and established connections are left alone, as conntrack
// leaves them. It builds examples/rollout/operator once and, for each run, starts two
// replicas with leader election (LeaderElectionReleaseOnCancel), a client that creates a
// labelled ConfigMap every --interval through the API server (each create passes the
// webhook), and sends the leader SIGTERM once it reconciled --before of them, mid-work.
//
// It measures: the creates that failed, the ConfigMaps never reconciled to completion, the
// reconciles of the new leader that began before the old leader's last one ended, the old
// leader's exit code and the timeline of its stop (quiesce's lines with the key sinceStop),
// the handover gap (SIGTERM to the new leader's first reconcile), and the latency of the
// creates from SIGTERM on. The first run wires quiesce in (a shutdown delay, the webhook
// server wrapped, reconciles that finish); the second is plain controller-runtime. It prints
// both side by side, and exits 0 when the quiesce run lost nothing (the plain run's losses
// are reported, not checked), 1 otherwise, 2 when it could not run.
//
//	make demo-rollout
//	make demo-rollout DEMO_ARGS='--shutdown-delay=3s --logs'
package main
