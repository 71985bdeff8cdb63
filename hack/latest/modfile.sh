#!/usr/bin/env bash
# modfile.sh writes hack/latest/latest.mod and latest.sum: the committed go.mod with the newest
# supported releases (controller-runtime, k8s.io) instead of the oldest, and prints the path of
# latest.mod. `make test-latest` passes it to the go command as -modfile (through GOFLAGS, so
# that go commands run by the tests use it too); the committed go.mod and go.sum never change.
#
# The file is generated on every run instead of committed, so that it follows every change of
# go.mod without upkeep: go get raises the pinned versions below and what they require (minimal
# version selection, so the result is the same on every machine), go mod tidy completes go.sum.
# Both files are ignored by git. Needs the Go module proxy, or a module cache that holds them.
set -euo pipefail

# The newest supported releases: VERSIONING.md lists the range.
CONTROLLER_RUNTIME_LATEST="${CONTROLLER_RUNTIME_LATEST:-v0.25.2}"
K8S_LATEST="${K8S_LATEST:-v0.37.2}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${root}"
mod="${root}/hack/latest/latest.mod"
unset GOFLAGS
export GOWORK=off

cp go.mod "${mod}"
cp go.sum "${mod%.mod}.sum"
{
	go get -modfile="${mod}" \
		"sigs.k8s.io/controller-runtime@${CONTROLLER_RUNTIME_LATEST}" \
		"k8s.io/api@${K8S_LATEST}" \
		"k8s.io/apimachinery@${K8S_LATEST}" \
		"k8s.io/client-go@${K8S_LATEST}"
	go mod tidy -modfile="${mod}"
} >"${mod}.log" 2>&1 || {
	cat "${mod}.log" >&2
	echo "hack/latest: failed to write ${mod}" >&2
	exit 1
}
rm -f "${mod}.log"
echo "hack/latest: testing with $(go list -modfile="${mod}" -m -f '{{.Path}}@{{.Version}}' \
	sigs.k8s.io/controller-runtime k8s.io/api k8s.io/apimachinery k8s.io/client-go k8s.io/utils | tr '\n' ' ')" >&2
echo "${mod}"
