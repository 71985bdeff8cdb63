package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
)

func main() {
	cmd := newCommand(start)
	// The first SIGTERM begins the stop (quiesce's shutdown delay, then the drain); a second exits at once.
	if err := cmd.ExecuteContext(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1) // cobra printed the error
	}
}
