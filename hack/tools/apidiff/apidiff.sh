#!/usr/bin/env bash
# apidiff.sh [BASE] reports the changes of quiesce's exported API between the revision BASE and
# the working tree, with golang.org/x/exp/cmd/apidiff pinned in this directory's go.mod (built by
# the go command through the module proxy, kept in its build cache). `make apidiff [BASE=rev]`
# runs it.
#
# BASE defaults to the newest tag reachable from HEAD or, while there is none, to the commit of
# v0.1.0 (untagged; see CHANGELOG.md). Incompatible changes are listed first; each must have an
# entry in CHANGELOG.md saying what users change in their code. Packages under internal/ are not
# part of the API and are not compared. The exit status is 0 whatever the changes (this is a
# report for review), non-zero only when the comparison itself fails.
set -euo pipefail

# v0.1.0: the last commit of the first milestone (issues 2-6), never tagged.
V010=dd3b7694ab305806b614fc890522b6afd92f2000

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "${root}"
module="$(go list -m)"
base="${1:-}"
if [[ -z "${base}" ]]; then
	base="$(git describe --tags --abbrev=0 2>/dev/null || echo "${V010}")"
fi
rev="$(git rev-parse --verify --quiet "${base}^{commit}")" || {
	echo "apidiff: unknown revision ${base}" >&2
	exit 1
}

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
apidiff="${work}/apidiff"
go build -modfile=hack/tools/apidiff/go.mod -o "${apidiff}" golang.org/x/exp/cmd/apidiff

# The export data of every non-internal package of the module, as apidiff sees it.
# BASE's copy may fill in its go.sum (-mod=mod); the working tree's go.mod is never written.
export_api() { # dir out goflags
	(cd "$1" && GOFLAGS="$3" GOWORK=off "${apidiff}" -m -w "$2" "${module}")
}

git archive --format=tar "${rev}" | tar -x -C "${work}" --one-top-level=old
export_api "${work}/old" "${work}/old.export" -mod=mod
export_api "${root}" "${work}/new.export" -mod=readonly

echo "Exported API of ${module}: ${base} ($(git rev-parse --short "${rev}")) -> working tree"
"${apidiff}" -m "${work}/old.export" "${work}/new.export" >"${work}/raw"
# apidiff compares types of other modules by identity: when BASE built against other versions of
# them (controller-runtime, k8s.io), it reports "changed from X to X" for quiesce's names that use
# them and for their own methods. A signature that reads the same is no change for a user: drop it.
# examples/ are programs to read, not API: dropped too.
awk '
	/^[A-Z].*:$/ { flush(); header = $0; next }
	/^- (\.\/examples|package [^ ]*\/examples)/ { next }
	/^- .*: changed from / {
		rest = substr($0, index($0, ": changed from ") + 15)
		half = (length(rest) - 4) / 2
		if (substr(rest, 1, half) == substr(rest, half + 5)) { same++; next }
	}
	{ lines[++n] = $0 }
	function flush(  i) {
		if (n > 0) { print header; for (i = 1; i <= n; i++) print lines[i] }
		n = 0
	}
	END {
		flush()
		if (same > 0) printf "(%d signatures that read the same in both, from other modules'"'"' versions, left out)\n", same
	}' "${work}/raw" | tee "${work}/report"
if grep -q '^Incompatible changes:' "${work}/report"; then
	echo "apidiff: incompatible changes above: each needs a CHANGELOG.md entry under Changed or Removed"
elif ! grep -q "^Compatible changes:" "${work}/report"; then
	echo "apidiff: no change"
fi
