// Package config is config-operator's config file: what the operator reads at start from
// the file named by --config (in a cluster, a ConfigMap that the Helm chart renders from
// its values), and the manager's and quiesce's Options built from it.
//
// The file is YAML, decoded strictly: a misspelt or duplicate field, or a duration without
// a unit, is an error, not a default. Durations are Go durations ("30s", "1m30s"). quiesce's
// settings sit under "quiesce" (runnable.Config); every error about them names the field by
// its path in the file, e.g. "quiesce.gracePeriod (GracePeriod) (30s) must be below ...".
package config
