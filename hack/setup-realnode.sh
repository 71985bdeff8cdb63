#!/usr/bin/env bash
# setup-realnode.sh prepares this machine for the real-node tier (make test-realnode,
# docs/realnode.md) and prints the path of the directory holding kubelet,
# kube-controller-manager and kube-proxy v${ENVTEST_K8S_VERSION}, usable as REALNODE_ASSETS.
#
# In order, it:
#   1. checks what the node needs and cannot install: root, the capabilities to create
#      namespaces and mounts (CAP_SYS_ADMIN) and to configure their network (CAP_NET_ADMIN),
#      cgroups, overlayfs; each missing one is named, and it exits 1;
#   2. installs Debian's containerd, runc, CNI plugins, iptables and conntrack when one is
#      missing (apt-get; nothing else is ever downloaded but Go modules);
#   3. builds kubelet, kube-controller-manager and kube-proxy from source through the Go module
#      proxy, the way hack/setup-envtest.sh builds kube-apiserver (same wrapper module, same
#      flags: the Go build cache is shared with it), into the same cache, one level beside it:
#      ${XDG_DATA_HOME:-$HOME/.local/share}/kubebuilder-envtest/node/<version>-<os>-<arch>.
#      With kube-apiserver's build cache warm, at the lowest CPU priority on 2 cores: ~4 min
#      when the machine is not shared (kubelet ~2.5 min, kube-controller-manager ~1 min,
#      kube-proxy ~0.5 min), 22 min measured beside six other builds.
#
# REALNODE_ASSETS, when set and holding the three binaries, is used as is. The binaries land
# one by one by atomic renames; a lock keeps concurrent runs apart. Progress goes to stderr, the
# path to stdout. A failure names its step and exits non-zero. etcd and kube-apiserver come from
# hack/setup-envtest.sh (KUBEBUILDER_ASSETS), which this script does not call.
set -euo pipefail

ENVTEST_K8S_VERSION="${ENVTEST_K8S_VERSION:-1.37.2}"
bins=(kubelet kube-controller-manager kube-proxy)
debs=(containerd runc containernetworking-plugins iptables conntrack)

log() { printf 'setup-realnode: %s\n' "$*" >&2; }
fail() {
	log "FAILED: $*"
	if [[ -s "${steplog:-}" ]]; then
		log "last lines of the step's output:"
		tail -n 30 "${steplog}" >&2
	fi
	exit 1
}
has_bins() {
	local b
	[[ -n "$1" ]] || return 1
	for b in "${bins[@]}"; do [[ -x "$1/$b" ]] || return 1; done
}

# 1. What cannot be installed. Every missing thing is named, not only the first.
missing=()
[[ ${EUID} -eq 0 ]] || missing+=("root (the node runs containers, mounts and iptables; run as root)")
capeff="$(awk '/^CapEff:/ {print $2}' /proc/self/status)"
has_cap() { (((0x${capeff:-0} >> $1) & 1)); }
has_cap 21 || missing+=("capability CAP_SYS_ADMIN (namespaces and mounts)")
has_cap 12 || missing+=("capability CAP_NET_ADMIN (the node's network namespace, veth, iptables)")
[[ -d /sys/fs/cgroup ]] || missing+=("/sys/fs/cgroup (kubelet needs cgroups)")
grep -qw overlay /proc/filesystems 2>/dev/null || modprobe overlay 2>/dev/null ||
	missing+=("the overlay filesystem (containerd's snapshotter)")
command -v go >/dev/null || missing+=("the go command")
if ((${#missing[@]})); then
	for m in "${missing[@]}"; do log "missing: ${m}"; done
	fail "this machine cannot run a real node (make test-realnode needs what is listed above)"
fi
if ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods >/dev/null 2>&1; then
	log "warning: a kubepods cgroup exists: another kubelet runs here; the tier refuses to start beside it"
fi

# 2. Debian's packages, when one is missing.
need_apt=0
for c in containerd runc iptables conntrack; do command -v "${c}" >/dev/null || need_apt=1; done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/portmap ]] || need_apt=1
if ((need_apt)); then
	command -v apt-get >/dev/null || fail "containerd, runc, CNI plugins, iptables or conntrack missing, and no apt-get to install ${debs[*]}"
	log "installing ${debs[*]} (apt-get)"
	steplog="$(mktemp)"
	{
		apt-get update -qq &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${debs[@]}"
	} >"${steplog}" 2>&1 || fail "apt-get install ${debs[*]}"
	rm -f "${steplog}"
	steplog=""
fi

# 3. The node's binaries.
if has_bins "${REALNODE_ASSETS:-}"; then
	log "using REALNODE_ASSETS=${REALNODE_ASSETS}"
	echo "${REALNODE_ASSETS}"
	exit 0
fi
os="$(go env GOOS)"
arch="$(go env GOARCH)"
root="${XDG_DATA_HOME:-$HOME/.local/share}/kubebuilder-envtest"
dest="${root}/node/${ENVTEST_K8S_VERSION}-${os}-${arch}"
if has_bins "${dest}"; then
	log "using cached binaries in ${dest}"
	echo "${dest}"
	exit 0
fi
mkdir -p "${dest}" || fail "create cache directory ${dest}"
exec 9>"${root}/node/.quiesce-build.lock"
flock 9 || fail "lock ${root}/node/.quiesce-build.lock"
rm -rf "${root}"/node/.build-* # left by a killed build; the lock says none runs

work="$(mktemp -d "${root}/node/.build-XXXXXX")"
trap 'rm -rf "${work}"' EXIT
steplog="${work}/step.log"
unset GOFLAGS
export GOFLAGS="-mod=mod" GOWORK=off CGO_ENABLED=0
V="${ENVTEST_K8S_VERSION}"
cd "${work}"
gomod="$(go mod download -json "k8s.io/kubernetes@v${V}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
[[ -f "${gomod}" ]] || fail "download k8s.io/kubernetes@v${V}"
minor="${V#*.}"
minor="${minor%%.*}"
staging="v0.${V#*.}"
{
	echo "module quiesce.local/node"
	echo
	grep -m1 '^go ' "${gomod}"
	echo
	echo "require k8s.io/kubernetes v${V}"
	echo
	echo "replace ("
	sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/k8s\.io/.*#\t\1 => \1 '"${staging}"'#p' "${gomod}"
	echo ")"
} >go.mod
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v${V} -X k8s.io/component-base/version.gitMajor=1"
ldflags+=" -X k8s.io/component-base/version.gitMinor=${minor} -X k8s.io/component-base/version.gitTreeState=clean"
for i in "${!bins[@]}"; do
	b="${bins[$i]}"
	[[ -x "${dest}/${b}" ]] && continue
	log "step $((i + 1))/${#bins[@]}: building ${b} v${V}"
	start=${SECONDS}
	{
		go get "k8s.io/kubernetes/cmd/${b}@v${V}" &&
			nice -n 19 go build -trimpath -o "${work}/${b}" -ldflags "${ldflags}" "k8s.io/kubernetes/cmd/${b}" &&
			"${work}/${b}" --version
	} >"${steplog}" 2>&1 || fail "build ${b} v${V}"
	mv -f "${work}/${b}" "${dest}/${b}" || fail "move ${b} into ${dest}"
	log "built ${b} in $((SECONDS - start))s"
done
log "cached the binaries in ${dest}"
echo "${dest}"
