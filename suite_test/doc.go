// Package suite_test is the Ginkgo v2 + envtest integration suite of quiesce: real managers
// against one real kube-apiserver. `make test` provides the control plane binaries.
package suite_test
