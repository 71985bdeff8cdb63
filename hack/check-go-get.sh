#!/usr/bin/env bash
# check-go-get.sh proves that adding quiesce to an operator on the oldest supported release moves
# none of its requirements (Kubernetes, test frameworks, the rest). `make test` runs it.
#
# It writes, in a temp dir, a module like a user's operator: it requires controller-runtime
# ${CONTROLLER_RUNTIME_OLDEST} and k8s.io ${K8S_OLDEST}, imports controller-runtime, and is tidy.
# Then it adds quiesce as a user would (go get, then go mod tidy once main.go imports it), with a
# replace pointing at this checkout, and fails if the version of any requirement the operator
# had (k8s.io/, sigs.k8s.io/, and those of its kubebuilder-like suite test: ginkgo, gomega, ...)
# changed. It prints how go.mod changed. (It does not build: go mod tidy has loaded
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
# The requirements of go.mod (a require block's lines), one "path version" a line.
requirements() {
	go mod edit -print | grep -v '=>' | sed -n 's#^[[:space:]]\{1,\}\([^[:space:]]*\) \(v[^[:space:]]*\).*#\1 \2#p' | sort
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
# A suite test as kubebuilder scaffolds it: Ginkgo and Gomega, at the versions the module graph
# holds (controller-runtime's own requirements).
cat >suite_test.go <<'EOF'
package main

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func TestSuite(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Suite")
}

var _ = BeforeSuite(func() { Expect((&envtest.Environment{}).Start()).Error().To(HaveOccurred()) })
EOF
run go mod tidy
requirements >before.txt
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
cat >shutdown_test.go <<EOF
package main

import _ "${module}/shutdowntest"
EOF
run go mod tidy
requirements >after.txt

log "what adding quiesce changed in the operator's go.mod:"
diff -u go.mod.before go.mod | sed -n '3,$p' | grep '^[-+]' >&2 || true
moved="$(join before.txt after.txt | awk '$2 != $3 { print $1 ": " $2 " -> " $3 }')"
if [[ -n "${moved}" ]]; then
	log "adding quiesce moved these requirements of an operator on controller-runtime ${CONTROLLER_RUNTIME_OLDEST}:"
	echo "${moved}" >&2
	fail "go.mod must require the oldest supported release of each (VERSIONING.md)"
fi
log "ok: no requirement moved ($(wc -l <before.txt) checked: k8s.io, controller-runtime, ginkgo, gomega and the rest)"
