# geolog — see README.md. Two commands set everything up: `make demo`, `make test`.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(HOME)/go/bin:$(PATH)

GO      ?= go
BIN     := $(CURDIR)/bin
TOOLBIN := $(CURDIR)/.bin
RUN     := $(CURDIR)/run

# Pinned code generators (make proto).
BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1

# Fuzz targets run briefly inside `make test`: package:target:executions.
# Counts, not durations: go1.26's fuzz coordinator can fail a run with a
# spurious "context deadline exceeded" when a -fuzztime duration expires under
# load (golang/go#75804, fixed in go1.27); a count has no deadline to race.
# Each count is a few seconds here. `make fuzz FUZZ_TIME=1m` fuzzes each
# target for a duration instead.
FUZZ_TARGETS := \
	./batch:FuzzDecode:200000 \
	./batch:FuzzRoundTrip:200000 \
	./segment:FuzzOffsetIndex:300000 \
	./segment:FuzzTimeIndex:300000 \
	./segment:FuzzRecover:30000 \
	./raftnet:FuzzDecodeBatch:60000
FUZZ_TIME ?=

# make sim: the deterministic simulator. SEED=n replays one seed (add
# SIMLOG=true for the replicas' logs); otherwise RUNS seeds from FIRST.
SEED   ?=
RUNS   ?= 1000
FIRST  ?= 1
STEPS  ?= 3000
SIMLOG ?= false

.PHONY: all build test unit fuzz vet demo proto tools bench bench-region sim clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

vet:
	$(GO) vet ./...

unit:
	$(GO) test -race -count=1 -timeout 15m ./...

# A short fuzz slice: every decoder of bytes, FUZZ_TIME each.
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; count=$${rest##*:}; \
		budget=$${count}x; [ -n "$(FUZZ_TIME)" ] && budget=$(FUZZ_TIME); \
		echo "fuzz $$pkg $$name ($$budget)"; \
		$(GO) test -run='^$$' -fuzz="^$$name$$" -fuzztime=$$budget -fuzzminimizetime=100x $$pkg; \
	done

test: vet build unit fuzz

sim:
	@if [ -n "$(SEED)" ]; then \
		$(GO) test -count=1 -v -run 'TestSimulator$$' ./sim -args -seed=$(SEED) -steps=$(STEPS) -simlog=$(SIMLOG); \
	else \
		$(GO) test -count=1 -v -timeout 60m -run 'TestSimulator$$' ./sim -args -runs=$(RUNS) -first=$(FIRST) -steps=$(STEPS); \
	fi

bench: build
	./scripts/bench.sh

bench-region: build
	./scripts/bench_region.sh

demo: build
	./scripts/demo.sh

tools:
	@mkdir -p $(TOOLBIN)
	GOBIN=$(TOOLBIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(TOOLBIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	test -x $(TOOLBIN)/buf || GOBIN=$(TOOLBIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

proto: tools
	$(TOOLBIN)/buf generate
	$(GO) build ./proto/...

clean:
	rm -rf $(BIN) $(RUN)
