# dlock's one command is `make test`: it installs the Debian packages the
# backend tests start servers from (only what is missing), then runs every
# test with the race detector against real servers. With CI=true a skipped
# test in a backend package fails the run.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

GO        ?= go
PKGS      ?= ./...
# The whole suite takes a few minutes on 2 cores; a hung test is killed
# (with its servers, through their parent-death signal) long before CI's limit.
TIMEOUT   ?= 20m
TESTFLAGS ?=
BENCHTIME ?= 1s
# Skips that are part of a suite's design, which CI accepts in backend
# packages (every other skip there fails a CI=true run; a skip raised by
# internal/testserver for a missing server always does). Keep this list short
# and exact: each entry is a skip message that says the case does not apply.
CI_ALLOWED_SKIPS ?= session-bound backend: a lease lives as long as its session|only runs as a child of the multi-process tests
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all test deps lint tidy-check bench bench-peers check-fresh

all: test

deps:
	@scripts/install-deps.sh

# The tests run only once the code is formatted, vetted, staticcheck-clean
# and go.mod is tidy: CI runs `make test`, so these gates guard every landing.
# interop/ is a module of its own (foreign lock clients never become the
# library's dependencies): its tests run after the main module's.
test: deps lint tidy-check
	@$(GO) test -race -timeout $(TIMEOUT) -json $(TESTFLAGS) $(PKGS) | $(GO) run ./scripts/testreport -allow '$(CI_ALLOWED_SKIPS)'
	@cd interop && $(GO) test -race -timeout $(TIMEOUT) -json $(TESTFLAGS) ./... | $(GO) run ../scripts/testreport -allow '$(CI_ALLOWED_SKIPS)'

lint:
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@$(GO) vet $(PKGS)
	@$(GO) run $(STATICCHECK) $(PKGS)
	@cd bench/peers && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	@cd interop && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	@echo "lint: gofmt, go vet and staticcheck clean"

# tidy-check fails when go.mod or go.sum is not what `go mod tidy` would write.
tidy-check:
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum not tidy: run 'go mod tidy'"; $(GO) mod tidy -diff; exit 1; }
	@cd bench/peers && { $(GO) mod tidy -diff >/dev/null || { echo "bench/peers: go.mod/go.sum not tidy: run 'go mod tidy' there"; $(GO) mod tidy -diff; exit 1; }; }
	@cd interop && { $(GO) mod tidy -diff >/dev/null || { echo "interop: go.mod/go.sum not tidy: run 'go mod tidy' there"; $(GO) mod tidy -diff; exit 1; }; }

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -timeout $(TIMEOUT) $(PKGS)

# bench-peers compares dlock with redsync, bsm/redislock, etcd's
# concurrency.Mutex, go-zookeeper's zk.Lock and hand-written pg_advisory_lock /
# GET_LOCK on throwaway servers (bench/run starts them), interleaved in one
# process, and writes bench/peers/results.md and SVG plots (about 10 minutes;
# PEERSFLAGS="-scale 0.2 -held 0,1000" for a quick look,
# BENCH_ONLY=redis,etcd for some backends). docs/performance.md explains it.
PEERSFLAGS ?=
BENCH_ONLY ?= redis,redlock,etcd,zk,postgres,mysql,sqlite
bench-peers: deps
	$(GO) run ./bench/run -only $(BENCH_ONLY) -- -out bench/peers $(PEERSFLAGS)

# check-fresh runs `make test` in a clean clone of HEAD, as a new machine would
# see the repository (uncommitted changes are not included).
check-fresh:
	@dir=$$(mktemp -d); trap 'rm -rf "$$dir"' EXIT; \
	git clone -q . "$$dir/dlock" && $(MAKE) -C "$$dir/dlock" test
