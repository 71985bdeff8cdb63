#!/usr/bin/env bash
# check-go-get.sh proves that adding quiesce to an operator on the oldest supported release moves
# none of its Kubernetes requirements. `make test` runs it.
#
# It writes, in a temp dir, a module like a user's operator: it requires controller-runtime
# ${CONTROLLER_RUNTIME_OLDEST} and k8s.io ${K8S_OLDEST}, imports controller-runtime, and is tidy.
# Then it adds quiesce as a user would (go get, then go mod tidy once main.go imports it), with a
# replace pointing at this checkout, and fails if the version of any k8s.io/ or sigs.k8s.io/
# requirement changed. It prints how go.mod changed. (It does not build: go mod tidy has loaded
# every package, and make test builds quiesce at these same versions.)
set -euo pipefail

CONTROLLER_RUNTIME_OLDEST="${CONTROLLER_RUNTIME_OLDEST:-v0.22.0}"
K8S_OLDEST="${K8S_OLDEST:-v0.34.0}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module="$(cd "${root}" && GOFLAGS= go list -m)"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
cd "${work}"
# The user's module, not ours: no -modfile from make test-latest, no workspace.
unset GOFLAGS
export GOWORK=off GOFLAGS=-mod=mod

log() { printf 'check-go-get: %s\n' "$*" >&2; }
fail() {
	log "FAILED: $*"
	exit 1
}
run() { # a go command whose output is shown only when it fails
	"$@" >"${work}/step.log" 2>&1 || {
		cat "${work}/step.log" >&2
		fail "$*"
	}
}
# The k8s.io/ and sigs.k8s.io/ requirements of go.mod, one "path version" a line.
k8s_requirements() {
	go mod edit -print | sed -n 's#^[[:space:]]*\(\(sigs\.\)\{0,1\}k8s\.io/[^[:space:]]*\) \([^[:space:]]*\).*#\1 \3#p' | sort
}

cat >go.mod <<EOF
module example.com/operator

go 1.25.0

require (
	k8s.io/api ${K8S_OLDEST}
	k8s.io/apimachinery ${K8S_OLDEST}
	k8s.io/client-go ${K8S_OLDEST}
	sigs.k8s.io/controller-runtime ${CONTROLLER_RUNTIME_OLDEST}
)
EOF
cat >main.go <<'EOF'
package main

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
)

func main() {
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{})
	if err != nil {
		panic(err)
	}
	_ = kubernetes.NewForConfigOrDie(mgr.GetConfig())
	_ = &corev1.ConfigMap{}
}
EOF
run go mod tidy
k8s_requirements >before.txt
cp go.mod go.mod.before
grep -q "^sigs.k8s.io/controller-runtime ${CONTROLLER_RUNTIME_OLDEST}\$" before.txt ||
	fail "the operator module does not require controller-runtime ${CONTROLLER_RUNTIME_OLDEST}"

# Add quiesce as a user would, from this checkout.
run go mod edit -replace="${module}=${root}"
run go get "${module}@v0.0.0"
cat >quiesce.go <<EOF
package main

import (
	_ "${module}/drain"
	_ "${module}/lifecycle"
	_ "${module}/reconcilers"
	_ "${module}/runnable"
)
EOF
run go mod tidy
k8s_requirements >after.txt

log "what adding quiesce changed in the operator's go.mod:"
diff -u go.mod.before go.mod | sed -n '3,$p' | grep '^[-+]' >&2 || true
moved="$(join before.txt after.txt | awk '$2 != $3 { print $1 ": " $2 " -> " $3 }')"
if [[ -n "${moved}" ]]; then
	log "adding quiesce moved these requirements of an operator on controller-runtime ${CONTROLLER_RUNTIME_OLDEST}:"
	echo "${moved}" >&2
	fail "go.mod must require the oldest supported release of each (VERSIONING.md)"
fi
log "ok: no k8s.io/ or sigs.k8s.io/ requirement moved ($(wc -l <before.txt) checked)"
