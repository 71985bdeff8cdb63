// Command config-operator is an operator that is not a kubebuilder scaffold, with quiesce
// adopted: it is configured by a file, builds its webhook server in its config package,
// exports its reconciler as a library, has its own Ginkgo envtest suite, and is deployed by
// a Helm chart.
//
//   - config/ reads the file named by --config (runnable.Config embedded under "quiesce")
//     and builds the manager's Options, webhook server included, and quiesce's;
//   - main.go is the setup: runnable.Setup, ctrl.NewManager, q.Add, the controller with
//     q.Executor(), mgr.Start(q.StopContext(...)), q.Err();
//   - controller/ publishes labelled ConfigMaps to a config store over HTTP, one
//     reconcilers.Call per publish; importers may leave its Executor nil;
//   - controller/suite_test.go starts the manager from a test config file on one envtest
//     control plane, and its AfterSuite fails on calls left running;
//   - chart/ deploys it, the pod's terminationGracePeriodSeconds also written into the config
//     file (quiesce.terminationGracePeriod: the operator checks its stop fits); chart_test.go
//     renders the chart and fails unless the file carries that value, it covers
//     quiesce.shutdownDelay + gracefulShutdownTimeout, the readiness probe is on /readyz and
//     the rendered config file is valid.
//
// docs/adoption.md, "An operator that is not a scaffold", quotes these files; docs_test.go
// checks that each quoted line is in the file it names.
//
//	go run ./examples/config-operator --config my-config.yaml --kubeconfig ~/.kube/config
package main
