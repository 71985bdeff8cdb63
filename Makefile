# quiesce — see README.md. Every target works on a fresh machine with Go 1.26 and the Go
# module proxy: the envtest binaries come from hack/setup-envtest.sh (cached after the first run).

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
GO ?= go
# Where hack/setup-envtest.sh finds or builds kube-apiserver and etcd, printed by it.
ENVTEST = hack/setup-envtest.sh

.PHONY: all
all: lint test

.PHONY: envtest
envtest: ## Print the directory holding kube-apiserver and etcd (building them if needed).
	@$(ENVTEST)

.PHONY: test
test: ## Unit tests and the envtest suite, with the race detector.
	assets="$$($(ENVTEST))"; \
	KUBEBUILDER_ASSETS="$$assets" $(GO) test -race -timeout 30m ./...

.PHONY: demo
demo: ## Run the demo operator against a real control plane, SIGTERM it, show its log.
	assets="$$($(ENVTEST))"; \
	KUBEBUILDER_ASSETS="$$assets" $(GO) run ./examples/demo $(DEMO_ARGS)

.PHONY: bench
bench: ## Benchmarks with their in-file baselines (ratios in README "Performance").
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./...

.PHONY: lint
lint: ## gofmt and go vet.
	@out="$$(gofmt -l .)"; if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

.PHONY: help
help:
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'
