// Package metricstest reads samples from controller-runtime's metrics.Registry, for
// quiesce's tests: the registry a manager's metrics server serves.
package metricstest
