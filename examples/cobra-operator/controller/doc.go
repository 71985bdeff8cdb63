// Package controller is cobra-operator's controller and webhook: Mirror copies the data of
// each labelled ConfigMap to a ConfigMap of its own by server-side apply (idempotent: a
// reconcile redone, cut by a stop or repeated by the next leader, applies the same object
// again), and Validator refuses labelled ConfigMaps whose mirror's name would be invalid.
package controller
