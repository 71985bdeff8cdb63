// Package claims keeps the per-object claims of reconcilers.HandOffAtStop: a claim is a
// coordination.k8s.io/v1 Lease in the operator's lease namespace, named after a controller
// and one object, held by a replica while a reconcile of that object it started before
// handing the leader lease over still runs (docs/design.md, "Handing over").
//
// A Registry knows the HandOffAtStop reconciles in flight (Begin), takes their claims at the
// stop (Take), renews them while the work runs, ends the work's context when a renewal fails
// past its deadline (Bind), and releases them when the work ends (End). On the successor,
// Wait reads a claim live and judges its expiry as client-go's elector judges a lease: from
// the time this replica first saw the holder's last write, on its own clock.
//
// It imports client-go; drain never imports it. Wait, Take and End block on the API server,
// bounded by their contexts or the renew deadline; everything is safe for concurrent use.
package claims
