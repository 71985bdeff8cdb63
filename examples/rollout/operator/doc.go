// Command operator is the small operator that `make demo-rollout` (examples/rollout) runs as
// two replicas to show a rolling update: a validating webhook on ConfigMaps (failurePolicy
// Fail, registered with Register) served by every replica, and, on the leader, a controller
// that reconciles the labelled ConfigMaps to completion.
//
// Each reconcile that finds a ConfigMap without DoneAnnotation logs "Reconcile working", works
// for --work, honouring its context, then writes DoneAnnotation (the replica's --id): an
// UPDATE that the operator's own webhook validates. Every reconcile logs one line,
// "Reconcile ended", with the replica, its start and end times and whether it worked and
// finished, so that a reader of both replicas' logs can check that two leaders never
// reconcile at once and that no object is left unreconciled. With --self-write the webhook
// also checks the reconciles' writes (DoneAnnotation must name a replica) and logs each one
// it admits, "Admitted own write": the single-replica case of the runner counts them.
//
// --quiesce=true (the default) wires quiesce in: runnable.Setup with ShutdownDelay and
// GracePeriod (it wraps the webhook server and observes the lease), q.Add, reconcilers.Wrap
// around the reconciler, with the stop policy of --stop-policy (finish, cancel or handoff:
// reconcilers.FinishAtStop, the default, CancelAtStop or HandOffAtStop, which needs get,
// list, create, update and delete on Leases). --quiesce=false is plain controller-runtime with the same settings
// otherwise: leader election with LeaderElectionReleaseOnCancel, a readyz check that
// passes while the probe server runs.
//
// The log is JSON, one object a line, klog's (leader election) included.
package main
