// Package shutdowntest runs a user's operator as a real process in a test suite and stops it
// with SIGTERM at a moment the test chooses, so that a suite proves the operator's shutdown:
// the exit code, the time from SIGTERM to exit, the calls quiesce abandoned, the whole log.
//
// It serves Ginkgo and plain testing alike: nothing in its API depends on Ginkgo (pass
// GinkgoWriter, or nothing, as Options.Output), and the Gomega matchers (HaveExitedGracefully,
// HaveAbandoned, HaveLogged) take a Result or *Result, and fail on a nil one.
//
// A test builds the operator once per process (Build, cached; with -race when the test runs
// with it), then, for each spec:
//
//	op, err := shutdowntest.Start(ctx, shutdowntest.Options{Package: "./cmd", Dir: root, Env: testEnv})
//	DeferCleanup(op.Kill)
//	// create objects, then wait until the operator works on them:
//	Eventually(op.PendingCount).WithContext(ctx).WithTimeout(time.Minute).Should(BeNumerically(">=", 3))
//	res, err := op.Stop(ctx)
//	Expect(res).To(shutdowntest.HaveExitedGracefully())
//
// Start runs the binary with kubebuilder's flags for the metrics and probe servers on free
// loopback ports (see Options.Flags) against one cluster: the suite's envtest control plane
// (Options.Env: a user of its own), or any cluster given as a rest.Config or a kubeconfig; it
// returns once its /readyz answers 200. PendingCount and PendingCalls read quiesce's
// /debug/quiesce on a loopback listener of quiesce's own (Endpoints.Debug) or, with
// Options.MetricsSecure, on the metrics server over HTTPS with a bearer token; WaitLines
// waits for lines of the operator's log (n reconciles working), WaitLeader for the
// leader-election lease (Options.LeaderElection). Stop sends SIGTERM and waits for the
// exit; its Result reads the log in the formats controller-runtime
// operators write (zap's console and JSON, slog's text and JSON, logrus' text and JSON through
// logrusr), and Stop fails, naming
// them, when it could read none of the operator's lines. For several replicas with webhooks, NewService stands for
// the Kubernetes Service in front of them (Options.Service), and Every sends requests
// throughout a rolling update.
//
// Bounds: no process or goroutine of the harness outlives Stop or Kill, nor the context given
// to Start (when it ends, the operator is killed), nor does anything it created in the
// cluster (Options.MetricsToken): it is deleted once the operator exited. The operator runs in a process group of its
// own: SIGTERM goes to the operator alone, as the kubelet sends it; SIGKILL (Kill, a forced
// stop) goes to the whole group, and what the operator leaves in its group when it exits is
// killed then. Stop waits at most Options.StopTimeout, then sends a second SIGTERM
// (controller-runtime then exits at once), then SIGKILL; WaitLines and WaitLeader at most
// Options.WaitTimeout. A log line longer than 1 MiB is cut, and the lines after it are read.
//
// Setup misuse, one rule in every quiesce package: a function that can report an error (an
// error result, a test's TestingT, a Gomega matcher's error) reports every misuse of its
// arguments and options that way, naming what to change; a function that cannot (a
// constructor used inline, as reconcilers.Wrap in SetupWithManager) panics on misuse, at
// the call, with a message naming the function and what to change: a programming error,
// found at setup, as regexp.MustCompile finds one. Nothing found at setup is left for run
// time. A typed nil (a nil *events.FakeRecorder as a Recorder, a nil *FakeClock as a Clock,
// a Logger whose sink is a nil pointer) is nil: it means what leaving it unset means.
//
// Here: Build and Start return every misuse of Options as an error naming the field; the
// matchers fail, never panic, on what they cannot match (a nil *Result).
//
// Concurrency: Build and Start may be called from several goroutines; an Operator's methods
// are safe to call concurrently, and Kill may race with Stop.
package shutdowntest
