# quiesce — see README.md. Every target works on a fresh machine with Go 1.26 and the Go
# module proxy: the envtest binaries come from hack/setup-envtest.sh, golangci-lint from the
# tools module hack/tools/go.mod (go tool); both are cached after the first run.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
GO ?= go
# Where hack/setup-envtest.sh finds or builds kube-apiserver and etcd, printed by it.
ENVTEST = hack/setup-envtest.sh
# golangci-lint at the version pinned in hack/tools/go.mod, built by the go command through the
# module proxy and kept in its build cache. Its configuration is .golangci.yml.
GOLANGCI_LINT = $(GO) tool -modfile=hack/tools/go.mod golangci-lint
# vet and golangci-lint type-check against packages compiled with -race, as make test compiles
# them, so that a cold `make lint test` compiles each dependency once, not twice (-race in
# GOFLAGS reaches golangci-lint's go list; the binary itself, from `go tool -n`, is built
# without it).
LINT_GOFLAGS = $$($(GO) env GOFLAGS) -race
# actionlint checks .github/workflows, built the same way from its own tools module (its
# dependencies clash with golangci-lint's). shellcheck and pyflakes are off so that the result
# does not depend on what the machine has installed.
ACTIONLINT = $(GO) tool -modfile=hack/tools/actionlint/go.mod actionlint -shellcheck= -pyflakes=
# helm, for the examples' chart tests (examples/internal/helmtest), from its own tools module:
# printing its path builds it into the go command's cache (minutes, once).
HELM = $(GO) tool -modfile=hack/tools/helm/go.mod -n helm

.PHONY: all
all: lint test

.PHONY: envtest
envtest: ## Print the directory holding kube-apiserver and etcd (building them if needed).
	@$(ENVTEST)

.PHONY: test
test: ## Unit tests, the envtest suite, then the adoption check (docs/adoption.md diff, README quickstart, example's tests), with -race.
	$(HELM) >/dev/null # the examples' chart tests run it: built here, cold, outside go test's timeout
	assets="$$($(ENVTEST))"; \
	KUBEBUILDER_ASSETS="$$assets" $(GO) test -race -timeout 30m ./...; \
	KUBEBUILDER_ASSETS="$$assets" GO=$(GO) hack/check-adoption.sh
	hack/check-go-get.sh

.PHONY: test-helm-operator
test-helm-operator: ## examples/helm-operator's specs on envtest: a Helm 3 operator stopped mid-upgrade, beside plain controller-runtime (its README's table; CI runs it).
	assets="$$($(ENVTEST))"; cd examples/helm-operator && \
	KUBEBUILDER_ASSETS="$$assets" $(GO) test -race -count=1 -timeout 30m -v ./...

.PHONY: test-realnode
test-realnode: ## Specs on a real single node (kubelet, containerd, kube-proxy; root, offline), quiesce and plain controller-runtime side by side (docs/realnode.md).
	assets="$$($(ENVTEST))"; node="$$(hack/setup-realnode.sh)"; \
	KUBEBUILDER_ASSETS="$$assets" REALNODE_ASSETS="$$node" \
		$(GO) -C realnode test -race -v -tags realnode -count=1 -timeout 20m ./suite_test/ -args -ginkgo.v

.PHONY: check-adoption
check-adoption: ## docs/adoption.md diff applied to kubebuilder's scaffold equals examples/memcached-operator; its tests.
	hack/check-adoption.sh

.PHONY: test-latest
test-latest: ## The module's tests at the newest supported releases (hack/latest), go.mod unchanged; examples/ aside.
	modfile="$$(hack/latest/modfile.sh)"; assets="$$($(ENVTEST))"; \
	GOFLAGS="$$($(GO) env GOFLAGS) -modfile=$$modfile" KUBEBUILDER_ASSETS="$$assets" \
		$(GO) test -race -timeout 30m $$($(GO) list ./... | grep -v /examples/)

.PHONY: apidiff
apidiff: ## Exported-API changes since BASE (default: the newest tag, else v0.1.0).
	hack/tools/apidiff/apidiff.sh $(BASE)

.PHONY: demo
demo: ## Run the demo operator against a real control plane, SIGTERM it, show its log.
	assets="$$($(ENVTEST))"; \
	KUBEBUILDER_ASSETS="$$assets" $(GO) run ./examples/demo $(DEMO_ARGS)

.PHONY: demo-rollout
demo-rollout: ## Roll two replicas of an operator with a webhook, with quiesce and without; compare.
	assets="$$($(ENVTEST))"; \
	KUBEBUILDER_ASSETS="$$assets" $(GO) run ./examples/rollout $(DEMO_ARGS)

.PHONY: bench
bench: ## The per-call budgets: pairs interleaved with their baselines, medians, met or not (docs/performance.md).
	GO=$(GO) hack/bench.sh

.PHONY: bench-all
bench-all: ## Every benchmark, with its in-file baseline.
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./...

.PHONY: lint
lint: ## go.mod tidy, gofmt, go vet, golangci-lint (.golangci.yml), actionlint (workflows), then every relative link of the docs.
	$(GO) mod tidy -diff
	cd hack/tools && $(GO) mod tidy -diff
	cd realnode && $(GO) mod tidy -diff
	@out="$$(gofmt -l .)"; if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet -race ./...
	lint="$$($(GO) tool -modfile=hack/tools/go.mod -n golangci-lint)"; GOFLAGS="$(LINT_GOFLAGS)" "$$lint" run ./...; \
		cd realnode && $(GO) vet -race -tags realnode ./... && GOFLAGS="$(LINT_GOFLAGS)" "$$lint" run --config ../.golangci.yml ./...
	cd hack/tools/apidiff && $(GO) mod tidy -diff
	cd hack/tools/actionlint && $(GO) mod tidy -diff
	cd hack/tools/helm && $(GO) mod tidy -diff
	cd examples/helm-operator && $(GO) mod tidy -diff
	$(ACTIONLINT)
	$(GO) run ./hack/linkcheck README.md CONTRIBUTING.md CHANGELOG.md VERSIONING.md examples/README.md examples/helm-operator/README.md $$(find docs -name '*.md')

.PHONY: lint-fix
lint-fix: ## go mod tidy, and the fixes golangci-lint can make itself (gofmt, goimports, ...).
	$(GO) mod tidy
	cd hack/tools && $(GO) mod tidy
	cd realnode && $(GO) mod tidy
	$(GOLANGCI_LINT) run --fix ./...
	cd hack/tools/apidiff && $(GO) mod tidy
	cd hack/tools/actionlint && $(GO) mod tidy
	cd hack/tools/helm && $(GO) mod tidy
	cd examples/helm-operator && $(GO) mod tidy

.PHONY: help
help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'
