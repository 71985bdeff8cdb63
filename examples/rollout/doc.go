// Command rollout plays a rolling update of an operator on a real API server and measures
// what it loses, with quiesce and without; `make demo-rollout` runs it.
//
// It starts one envtest control plane (kube-apiserver and etcd from KUBEBUILDER_ASSETS)
// whose validating webhook on ConfigMaps (failurePolicy: Fail, CREATE and UPDATE;
// operator/webhook.yaml) points at shutdowntest's Service, a test-only TCP router standing in
// for a Service: new connections go to the replicas whose /readyz passes (probed every
// 500ms, as a kubelet would), a replica leaves the pool at its second failing probe or 1s
// after its SIGTERM, and established connections are left alone, as conntrack leaves them.
// The replicas run under shutdowntest, as a user's suite runs its operator (built once,
// started, waited on, stopped, reaped). For each run it starts two replicas with
// leader election (LeaderElectionReleaseOnCancel), a client that creates a labelled
// ConfigMap every --interval through the API server (each create passes the webhook), and
// sends the leader SIGTERM once it reconciled --before of them, mid-work.
//
// It measures: the creates that failed, the ConfigMaps never reconciled to completion, the
// reconciles of the new leader that began before the old leader's last one ended, the old
// leader's exit code and the timeline of its stop (quiesce's lines with the key sinceStop),
// the handover gap (SIGTERM to the new leader's first reconcile), and the latency of the
// creates from SIGTERM on. The first run wires quiesce in (a shutdown delay, the webhook
// server wrapped, reconciles that finish); the second is plain controller-runtime.
//
// Then, on the same control plane, the single-replica case (--single, on by default): one
// replica, no shutdown delay, started with --self-write, so that its webhook validates the
// reconciles' own writes (the UPDATE that adds the done annotation) and logs each one it
// admits. The runner creates --single-objects ConfigMaps at once, waits until as many
// reconciles work (--single-work each), and sends the replica SIGTERM. It measures the
// reconciles in flight at SIGTERM, those that finished and those cut off, the own writes
// that the replica's webhook admitted after SIGTERM and during the drain, the ConfigMaps left
// unreconciled when it exited, its exit code and its timeline; with quiesce, then plain.
//
// It prints the runs side by side, and exits 0 when both quiesce runs kept their promises
// (the rollout lost nothing; with one replica every reconcile in flight finished, its write
// admitted by the replica's own webhook during the drain, timeline in order, exit 0); the
// plain runs are reported, not checked. It exits 1 otherwise, 2 when it could not run.
//
//	make demo-rollout
//	make demo-rollout DEMO_ARGS='--shutdown-delay=3s --logs'
package main
