#!/usr/bin/env bash
# check-adoption.sh: checks that docs/adoption.md's diff is the whole of
# examples/memcached-operator, that every line of README.md's quickstart is in it, then runs
# that operator's own tests.
#
# 0. Checks that each code line of README.md's quickstart (the ```go block after
#    "## Quickstart") is in the example's file named by the `// path` comment above it.
# 1. Scaffolds the Memcached operator with kubebuilder (fetched through the Go module proxy)
#    in a temporary directory, as docs/adoption.md says: `kubebuilder init`, `create api`,
#    `create webhook`, then controller-gen for `make manifests generate`.
# 2. Applies every ```diff block of docs/adoption.md to it, and fails unless the result equals
#    examples/memcached-operator, file for file (go.mod and go.sum aside: `go get` changes
#    them, not the diff; and the scaffold's files the example leaves out, listed below).
# 3. Runs the example's tests (kubebuilder's suite, with quiesce) under -race, with the
#    envtest binaries of hack/setup-envtest.sh (or KUBEBUILDER_ASSETS when set).
#
# Usage: hack/check-adoption.sh              all three steps (make test runs this)
#        hack/check-adoption.sh --no-test    steps 1 and 2
#        hack/check-adoption.sh --print-diff the diff from the scaffold to the example, to paste
#                                            into docs/adoption.md after changing the example
#        hack/check-adoption.sh --build-tools only build kubebuilder and controller-gen (cached)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
example="$root/examples/memcached-operator"
readme="$root/README.md"
adoption="$root/docs/adoption.md"
GO="${GO:-go}"
KUBEBUILDER="sigs.k8s.io/kubebuilder/v4@v4.16.0"
CONTROLLER_GEN="sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0"
# The scaffold's Makefile's KUSTOMIZE_VERSION.
KUSTOMIZE="sigs.k8s.io/kustomize/kustomize/v5@v5.8.1"
# What kubebuilder writes for a repository of its own (CI, IDE, agent notes), left out of the
# example; bin/ holds what the example's Makefile downloads.
skip='^(\.github/|\.devcontainer/|AGENTS\.md$|bin/|go\.mod$|go\.sum$)'
# The files docs/adoption.md's diff changes or adds, in its order (for --print-diff).
adopted=(
	cmd/main.go
	internal/controller/memcached_controller.go
	internal/controller/suite_test.go
	internal/controller/memcached_controller_test.go
	internal/controller/shutdown_test.go
	config/manager/manager.yaml
	config/default/kustomization.yaml
	config/default/manager_rollout_patch.yaml
	config/rbac/metrics_reader_role.yaml
)

mode="${1:-all}"
case "$mode" in
all | --no-test | --print-diff) ;;
--build-tools)
	# Only build kubebuilder and controller-gen into the go command's cache (go run keeps
	# them there), e.g. ahead of time in CI.
	"$GO" run "$KUBEBUILDER" version >/dev/null
	"$GO" run "$CONTROLLER_GEN" --version >/dev/null
	"$GO" run "$KUSTOMIZE" version >/dev/null
	exit 0
	;;
*)
	echo "usage: $0 [--no-test|--print-diff|--build-tools]" >&2
	exit 2
	;;
esac

if [[ "$mode" != --print-diff ]]; then
	echo "==> checking README.md's quickstart against examples/memcached-operator"
	file="" bad=0
	while IFS= read -r line; do
		t="$(sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' <<<"$line")"
		[[ -z "$t" ]] && continue
		if [[ "$t" == //* ]]; then # a comment; "// path" names the file of the lines below
			p="${t#// }" && p="${p%% *}"
			[[ -f "$example/$p" ]] && file="$example/$p"
			continue
		fi
		if [[ -z "$file" ]] || ! grep -qF -- "$t" "$file"; then
			echo "FAIL: README.md's quickstart line is not in ${file#"$root/"}: $t" >&2
			bad=1
		fi
	done < <(awk '/^## Quickstart/ {q = 1} q && /^```go$/ {on = 1; next} on && /^```$/ {exit} on' "$readme")
	if [[ -z "$file" ]]; then
		echo "FAIL: README.md has no quickstart (a \`\`\`go block after \"## Quickstart\", naming its files)" >&2
		bad=1
	fi
	((bad)) && exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# kubebuilder names the project after its directory.
scaffold="$tmp/memcached-operator"
mkdir "$scaffold"

echo "==> scaffolding the Memcached operator with kubebuilder ($KUBEBUILDER)"
start=$SECONDS
(
	cd "$scaffold"
	"$GO" run "$KUBEBUILDER" init --domain example.com --repo example.com/memcached --skip-go-version-check
	"$GO" run "$KUBEBUILDER" create api --group cache --version v1alpha1 --kind Memcached \
		--resource --controller --make=false
	"$GO" run "$KUBEBUILDER" create webhook --group cache --version v1alpha1 --kind Memcached \
		--programmatic-validation --make=false
	# make manifests generate, with controller-gen from the module proxy instead of bin/.
	"$GO" run "$CONTROLLER_GEN" rbac:roleName=manager-role crd webhook paths="./..." \
		output:crd:artifacts:config=config/crd/bases
	"$GO" run "$CONTROLLER_GEN" object:headerFile="hack/boilerplate.go.txt" paths="./..."
) >"$tmp/scaffold.log" 2>&1 || {
	cat "$tmp/scaffold.log" >&2
	echo "FAIL: kubebuilder could not scaffold the operator" >&2
	exit 1
}
# kubebuilder writes the current year into every license header; the example keeps the year
# it was scaffolded in.
year="$(sed -n 's/^Copyright \([0-9]\{4\}\)\.$/\1/p' "$example/cmd/main.go")"
grep -rlE '^Copyright [0-9]{4}\.$' "$scaffold" | xargs sed -i -E "s/^Copyright [0-9]{4}\.$/Copyright $year./"
echo "    took $((SECONDS - start))s"

if [[ "$mode" == --print-diff ]]; then
	for f in "${adopted[@]}"; do
		if [[ -f "$scaffold/$f" ]]; then
			diff -u --label "a/$f" --label "b/$f" "$scaffold/$f" "$example/$f" || true
		else # a file the diff adds
			diff -u --label /dev/null --label "b/$f" /dev/null "$example/$f" || true
		fi
	done
	exit 0
fi

echo "==> applying docs/adoption.md's diff"
awk '/^```diff$/ {on = 1; next} /^```$/ {on = 0} on' "$adoption" >"$tmp/adoption.diff"
if [[ ! -s "$tmp/adoption.diff" ]]; then
	echo "FAIL: docs/adoption.md has no \`\`\`diff block" >&2
	exit 1
fi
# A repository of its own, so that git apply takes the paths as relative to the scaffold.
git -C "$scaffold" init -q
if ! git -C "$scaffold" apply --whitespace=error-all "$tmp/adoption.diff"; then
	echo "FAIL: docs/adoption.md's diff does not apply to kubebuilder's scaffold" >&2
	exit 1
fi
rm -rf "$scaffold/.git"

echo "==> comparing the result with examples/memcached-operator"
list() { (cd "$1" && find . -type f | sed 's|^\./||' | grep -Ev "$skip" | LC_ALL=C sort); }
(cd "$example" && git ls-files -co --exclude-standard . | grep -Ev "$skip" | LC_ALL=C sort) >"$tmp/example.files"
list "$scaffold" >"$tmp/scaffold.files"
drift=0
if ! diff -u --label "scaffold + docs/adoption.md's diff" --label examples/memcached-operator \
	"$tmp/scaffold.files" "$tmp/example.files"; then
	echo "FAIL: the files differ (above: - only in the scaffold, + only in the example)" >&2
	drift=1
fi
while read -r f; do
	[[ -f "$scaffold/$f" ]] || continue
	if ! diff -u --label "scaffold + docs/adoption.md's diff: $f" --label "examples/memcached-operator/$f" \
		"$scaffold/$f" "$example/$f"; then
		drift=1
	fi
done <"$tmp/example.files"
if ((drift)); then
	echo "FAIL: docs/adoption.md's diff and examples/memcached-operator drifted apart." >&2
	echo "      After changing the example, print the diff to paste into docs/adoption.md with:" >&2
	echo "      hack/check-adoption.sh --print-diff" >&2
	exit 1
fi
echo "    OK: kubebuilder's scaffold with docs/adoption.md's diff is examples/memcached-operator"

echo "==> rendering config/default with kustomize ($KUSTOMIZE): the rolling-update patch applies"
if ! (cd "$scaffold" && "$GO" run "$KUSTOMIZE" build config/default) >"$tmp/rendered.yaml" 2>"$tmp/kustomize.log"; then
	cat "$tmp/kustomize.log" >&2
	echo "FAIL: kustomize cannot render the scaffold with docs/adoption.md's diff" >&2
	exit 1
fi
# The Deployment's document, then each setting of config/default/manager_rollout_patch.yaml.
awk '/^---$/ {n++} {doc[n] = doc[n] $0 "\n"} /^kind: Deployment$/ {d = n} END {printf "%s", doc[d]}' \
	"$tmp/rendered.yaml" >"$tmp/deployment.yaml"
for want in '^  replicas: 2$' '^      maxSurge: 1$' '^      maxUnavailable: 0$' '^    type: RollingUpdate$' \
	'^        - --quiesce-shutdown-delay=5s$' '^          periodSeconds: 2$' '^          failureThreshold: 1$' \
	'^      terminationGracePeriodSeconds: 40$'; do
	if ! grep -q -- "$want" "$tmp/deployment.yaml"; then
		cat "$tmp/deployment.yaml" >&2
		echo "FAIL: the rendered Deployment (above) has no line matching $want" >&2
		exit 1
	fi
done
echo "    OK: the Deployment renders with two replicas, maxUnavailable 0, the delay, its probe, the budget"

[[ "$mode" == --no-test ]] && exit 0

echo "==> running the example's tests under -race"
if [[ -z "${KUBEBUILDER_ASSETS:-}" ]]; then
	KUBEBUILDER_ASSETS="$("$root/hack/setup-envtest.sh")"
fi
export KUBEBUILDER_ASSETS
start=$SECONDS
(cd "$example" && "$GO" test -race -count=1 ./...)
echo "    took $((SECONDS - start))s"
