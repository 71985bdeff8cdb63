#!/usr/bin/env bash
# setup-envtest.sh prints the path of a directory that holds working kube-apiserver and
# etcd binaries for Kubernetes ${ENVTEST_K8S_VERSION}, usable as KUBEBUILDER_ASSETS.
#
# In order, it uses:
#   1. KUBEBUILDER_ASSETS, if it is set and holds both binaries;
#   2. setup-envtest's own cache, ${XDG_DATA_HOME:-$HOME/.local/share}/kubebuilder-envtest;
#   3. setup-envtest itself (needs the internet), with a short time limit;
#   4. a build from source through the Go module proxy, into that same cache
#      (cold: ~10 min on 2 cores; later runs reuse the cache and pay nothing).
#
# Progress goes to stderr, the path to stdout. A failure names its step and exits non-zero.
# The cache is filled by one atomic rename, so a killed build never leaves a half-filled one.
set -euo pipefail

ENVTEST_K8S_VERSION="${ENVTEST_K8S_VERSION:-1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
SETUP_ENVTEST_VERSION="${SETUP_ENVTEST_VERSION:-v0.25.1}"
SETUP_ENVTEST_TIMEOUT="${SETUP_ENVTEST_TIMEOUT:-60}"

log() { printf 'setup-envtest: %s\n' "$*" >&2; }
fail() {
	log "FAILED: $*"
	if [[ -s "${steplog:-}" ]]; then
		log "last lines of the step's output (${steplog}):"
		tail -n 30 "${steplog}" >&2
		# The build's directory goes away on exit: keep the log in a new file of our own
		# (mktemp: never a fixed path, which a symlink planted there would redirect).
		if kept="$(mktemp -t setup-envtest-failed.XXXXXX)" && cp "${steplog}" "${kept}"; then
			log "the whole log is kept in ${kept}"
		fi
	fi
	exit 1
}
has_bins() { [[ -n "$1" && -x "$1/kube-apiserver" && -x "$1/etcd" ]]; }

# 1. An explicit KUBEBUILDER_ASSETS wins.
if has_bins "${KUBEBUILDER_ASSETS:-}"; then
	log "using KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS}"
	echo "${KUBEBUILDER_ASSETS}"
	exit 0
fi

# 2. setup-envtest's own cache.
os="$(go env GOOS)"
arch="$(go env GOARCH)"
root="${XDG_DATA_HOME:-$HOME/.local/share}/kubebuilder-envtest"
dest="${root}/k8s/${ENVTEST_K8S_VERSION}-${os}-${arch}"
if has_bins "${dest}"; then
	log "using cached binaries in ${dest}"
	echo "${dest}"
	exit 0
fi
mkdir -p "${root}/k8s" || fail "create cache directory ${root}/k8s"

# Only one build at a time; whoever waited finds the cache filled.
exec 9>"${root}/k8s/.quiesce-build.lock"
flock 9 || fail "lock ${root}/k8s/.quiesce-build.lock"
if has_bins "${dest}"; then
	log "using cached binaries in ${dest} (built by a concurrent run)"
	echo "${dest}"
	exit 0
fi

# A build killed outright (SIGKILL, power loss) leaves its temp dir behind, never a cache
# entry: with the lock held, no other build runs, so any temp dir left is stale.
rm -rf "${root}"/k8s/.build-*

# 3. setup-envtest, where the internet is reachable.
log "step 1/3: trying setup-envtest ${SETUP_ENVTEST_VERSION} (limit ${SETUP_ENVTEST_TIMEOUT}s)"
if path="$(timeout "${SETUP_ENVTEST_TIMEOUT}" go run "sigs.k8s.io/controller-runtime/tools/setup-envtest@${SETUP_ENVTEST_VERSION}" \
	use "${ENVTEST_K8S_VERSION}" --bin-dir "${root}" -p path 2>/dev/null)" && has_bins "${path}"; then
	log "setup-envtest downloaded the binaries to ${path}"
	echo "${path}"
	exit 0
fi
log "setup-envtest could not download the binaries; building them from source instead"

# 4. Build from source through the Go module proxy.
work="$(mktemp -d "${root}/k8s/.build-XXXXXX")"
trap 'rm -rf "${work}"' EXIT
# Each step's output goes to a log, shown only if the step fails.
steplog="${work}/step.log"
mkdir -p "${work}/out"
unset GOFLAGS
export GOFLAGS="-mod=mod" GOWORK=off CGO_ENABLED=0

log "step 2/3: building etcd ${ETCD_VERSION} (cold: ~1 min)"
start=${SECONDS}
mkdir -p "${work}/etcd"
(
	cd "${work}/etcd"
	cat >main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
	go mod init quiesce.local/etcd
	go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
	go mod tidy
	go build -trimpath -ldflags "-s -w" -o "${work}/out/etcd" .
) >"${steplog}" 2>&1 || fail "build etcd ${ETCD_VERSION}"
log "built etcd in $((SECONDS - start))s"

log "step 3/3: building kube-apiserver v${ENVTEST_K8S_VERSION} (cold: ~10 min on 2 cores)"
start=${SECONDS}
mkdir -p "${work}/apiserver"
(
	cd "${work}/apiserver"
	gomod="$(go mod download -json "k8s.io/kubernetes@v${ENVTEST_K8S_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
	[[ -f "${gomod}" ]] || { echo "no go.mod for k8s.io/kubernetes@v${ENVTEST_K8S_VERSION}"; exit 1; }
	minor="${ENVTEST_K8S_VERSION#*.}"
	minor="${minor%%.*}"
	staging="v0.${ENVTEST_K8S_VERSION#*.}"
	{
		echo "module quiesce.local/apiserver"
		echo
		grep -m1 '^go ' "${gomod}"
		echo
		echo "require k8s.io/kubernetes v${ENVTEST_K8S_VERSION}"
		echo
		echo "replace ("
		sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/k8s\.io/.*#\t\1 => \1 '"${staging}"'#p' "${gomod}"
		echo ")"
	} >go.mod
	go get "k8s.io/kubernetes/cmd/kube-apiserver@v${ENVTEST_K8S_VERSION}"
	go build -trimpath -o "${work}/out/kube-apiserver" -ldflags "-s -w \
		-X k8s.io/component-base/version.gitVersion=v${ENVTEST_K8S_VERSION} \
		-X k8s.io/component-base/version.gitMajor=1 \
		-X k8s.io/component-base/version.gitMinor=${minor} \
		-X k8s.io/component-base/version.gitTreeState=clean" \
		k8s.io/kubernetes/cmd/kube-apiserver
) >"${steplog}" 2>&1 || fail "build kube-apiserver v${ENVTEST_K8S_VERSION}"
log "built kube-apiserver in $((SECONDS - start))s"

"${work}/out/kube-apiserver" --version >/dev/null || fail "run the built kube-apiserver"
"${work}/out/etcd" --version >/dev/null || fail "run the built etcd"

# Atomic: the cache directory appears whole or not at all.
mv -T "${work}/out" "${dest}" || fail "move the binaries into ${dest}"
log "cached the binaries in ${dest}"
echo "${dest}"
