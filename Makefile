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

.PHONY: all test deps lint bench check-fresh

all: test

deps:
	@scripts/install-deps.sh

test: deps
	@$(GO) test -race -timeout $(TIMEOUT) -json $(TESTFLAGS) $(PKGS) | $(GO) run ./scripts/testreport -allow '$(CI_ALLOWED_SKIPS)'

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -timeout $(TIMEOUT) $(PKGS)

# check-fresh runs `make test` in a clean clone of HEAD, as a new machine would
# see the repository (uncommitted changes are not included).
check-fresh:
	@dir=$$(mktemp -d); trap 'rm -rf "$$dir"' EXIT; \
	git clone -q . "$$dir/dlock" && $(MAKE) -C "$$dir/dlock" test
