// Package controller is config-operator's reconciler, exported as a library: another
// operator may import it and add it to its own manager.
//
// ConfigMapReconciler publishes the data of each ConfigMap labelled
// config-operator.quiesce.dev/publish=true to a Publisher (a config store, say, whose client
// blocks), then records the published revision in the annotation PublishedAnnotation.
//
// Its Executor field is quiesce's: set it to the executor of runnable.Setup (q.Executor())
// and each reconcile, and the Publish call in it, are tracked calls that the drain waits for
// at shutdown. An importer that does not use quiesce leaves it nil: reconcilers.Wrap then
// runs the reconciler untracked, as it would run without quiesce, and logs so once.
package controller
