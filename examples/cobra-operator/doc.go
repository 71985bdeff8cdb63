// Command cobra-operator is an operator shaped like a mature one rather than a scaffold, with
// quiesce adopted: a cobra root command whose flags come in named sections
// (k8s.io/component-base/cli/flag), quiesce's among them (runnable.Options.BindPFlags); slog
// logs, in text form by default; an idempotent, server-side-apply reconciler; a validating
// webhook configured in code; and a Helm chart that passes every setting as a flag, with a
// strict values.schema.json.
//
//   - command.go: the command, its flags (sections generic, logging, quiesce), the loggers
//     (logr.FromSlogHandler, ctrl.SetLogger), and the setup: runnable.Setup, ctrl.NewManager,
//     q.Add, the controller with q.Executor(), mgr.Start(q.StopContext(ctx)), q.Err();
//   - controller/: Mirror applies a copy of each labelled ConfigMap; Validator refuses those
//     whose copy's name would be invalid;
//   - chart/: the Deployment, its values typed or quoted into container args, the timing
//     budget in values.yaml; chart_test.go renders it with the real helm (helm lint --strict,
//     helm template with the schema, hostile values), parses the rendered args with the
//     command's own flags and checks the budget (docs/helm.md).
//
// Run it against a cluster of yours, or read its flags:
//
//	go run ./examples/cobra-operator --kubeconfig ~/.kube/config --quiesce-shutdown-delay=0s
//	go run ./examples/cobra-operator --help
package main
