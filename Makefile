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

# Terraform (make terraform, tf-*): the one on PATH, else .bin/terraform,
# which make terraform builds from the module proxy when it is missing.
TERRAFORM_VERSION := v1.5.7
TERRAFORM ?= $(shell command -v terraform 2>/dev/null || echo $(TOOLBIN)/terraform)
TF_LOCAL  := terraform/local
# TF_VARS: more options for tf-up/tf-down, e.g.
#   make tf-up TF_VARS='-var nodes_per_region=1 -var base_port=7640'
TF_VARS ?=

# Fuzz targets run briefly inside `make test`: package:target:executions.
# Counts, not durations: go1.26's fuzz coordinator can fail a run with a
# spurious "context deadline exceeded" when a -fuzztime duration expires under
# load (golang/go#75804, fixed in go1.27); a count has no deadline to race.
# Each count is a few seconds here. `make fuzz FUZZ_TIME=1m` fuzzes each
# target for a duration instead.
FUZZ_TARGETS := \
	./batch:FuzzDecode:200000 \
	./batch:FuzzRoundTrip:200000 \
	./batch:FuzzDecodeMark:100000 \
	./segment:FuzzOffsetIndex:300000 \
	./segment:FuzzTimeIndex:300000 \
	./segment:FuzzRecover:30000 \
	./client/e2e:FuzzOpen:30000 \
	./client/e2e:FuzzDecodePayload:30000 \
	./raftnet:FuzzDecodeBatch:60000 \
	./replicator:FuzzDecodeRequest:60000 \
	./segment:FuzzManifest:30000 \
	./replica:FuzzSnapshotDesc:60000 \
	./replica:FuzzProducerBase:60000 \
	./replica:FuzzForkRecord:60000 \
	./replica:FuzzForkDesc:60000 \
	./replica:FuzzCommitMark:20000 \
	./replica:FuzzTermVote:20000 \
	./segment:FuzzStartRecord:50000 \
	./segment:FuzzKeyIndex:200000 \
	./batch:FuzzRecordKeys:100000 \
	./cursors:FuzzDecode:100000 \
	./replica:FuzzStep:600 \
	./replicator:FuzzServe:6000 \
	./internal/appendwire:FuzzAppendCodec:30000
FUZZ_TIME ?=

# make sim: the deterministic simulator. SEED=n replays one seed (add
# SIMLOG=true for the replicas' logs, SIMTRACE=true for a line per home,
# crash, compaction, connect, overlapping batch and fork, naming regions
# and epochs: sim/trace.go); otherwise RUNS seeds from FIRST,
# JOBS processes at once (default: one per core), stopping at the first
# failing seed (KEEPGOING=true: run them all, reporting each). Each seed
# is STEPS virtual ms of faults (default 60000, a simulated minute; make
# test's slice runs 3000) on REGIONS regions of 3 nodes (1: one region,
# no replication). GOGC=800: the simulator's heap is small, its garbage
# plenty (800 rather than 400: 3-10% less CPU a seed for ~100-160 MB a
# process, notes/simfast.md).
SEED      ?=
RUNS      ?= 1000
FIRST     ?= 1
STEPS     ?= 60000
SIMLOG    ?= false
SIMTRACE  ?= false
REGIONS   ?= 3
JOBS      ?= $(shell nproc 2>/dev/null || echo 1)
KEEPGOING ?= false

.PHONY: bench-floor release image all build test test-loaded test-alerts unit fuzz vet demo demo-single up down status proto tools bench bench-region bench-groups bench-idle bench-ranges bench-keysync bench-e2e bench-geo bench-capacity bench-scale bench-rebalance sim clean drill terraform tf-up tf-down tf-fmt tf-check tf-test chaos chaos-slice

all: build

# The binaries say which commit they are (geolog version, geologd --version).
COMMIT  := $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -modified)
LDFLAGS := -X github.com/geolog/geolog/internal/version.Commit=$(COMMIT)

build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

vet:
	$(GO) vet ./...

# Every test process that needs PostgreSQL (the lease store's) starts its
# own, in a temporary folder on a free port (homing/pgtest), never the
# demo's or the local cluster's (scripts/pg.sh, run/pg): two clones can run
# make test at once, beside a running demo. GEOLOG_PG_URL=postgres://...
# makes them use that server instead. TestSlice (the chaos slice) runs in
# its own step, chaos-slice, so that its clusters do not compete with the
# other packages' tests for the cores. The web console's browser test
# needs Chromium: installed first when missing (chromium), and required
# here (GEOLOG_REQUIRE_CHROMIUM: it fails rather than skips without it).
# -timeout is per package binary and only a guard against a hang: on a
# machine busy with other work deploy's TestRelease (a cold -trimpath
# build) ran past 15 minutes, so it is 30. regionsvc's tests run in
# parallel (t.Parallel; regionsvc/homing_test.go's TestMain says which do
# not), UNIT_PARALLEL at a time: they mostly wait, one after another they
# used 30% of a core for 15 minutes, 4 at a time 82% for under 5.
UNIT_PARALLEL ?= 4
unit: chromium
	GEOLOG_REQUIRE_CHROMIUM=1 $(GO) test -race -count=1 -timeout 30m -parallel $(UNIT_PARALLEL) -skip '^TestSlice$$' ./...

# Headless Chromium for console.TestConsoleInChromium, from Debian's
# chromium package with apt-get when missing (scripts/chromium.sh).
.PHONY: chromium
chromium:
	@./scripts/chromium.sh

# The chaos slice: chaos.Slice(), fixed-seed scenarios on the harness's
# own local clusters (no terraform; every port, the homing one's
# PostgreSQL's too, is a free one held through internal/portlock, above the
# kernel's ephemeral range; GEOLOG_CHAOS_PORTS=lo-hi narrows them), about a
# minute and a half; prints the table, fails on any anomaly or unverified
# check.
chaos-slice:
	$(GO) test -race -count=1 -timeout 10m -run '^TestSlice$$' -v ./chaos/

# A short fuzz slice: every decoder of bytes, FUZZ_TIME each.
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; count=$${rest##*:}; \
		budget=$${count}x; [ -n "$(FUZZ_TIME)" ] && budget=$(FUZZ_TIME); \
		echo "fuzz $$pkg $$name ($$budget)"; \
		$(GO) test -run='^$$' -fuzz="^$$name$$" -fuzztime=$$budget -fuzzminimizetime=100x $$pkg; \
	done

test: vet test-alerts build unit chaos-slice fuzz

# The alerting rules (deploy/prometheus/alerts.yml): promtool check rules
# and promtool test rules over alerts_test.yml, a second or two; promtool
# (Debian package prometheus) is installed with apt-get when missing
# (scripts/test_alerts.sh).
test-alerts:
	@./scripts/test_alerts.sh

# make test-loaded RUNS=5: make test RUNS times in a row beside stress-ng
# --cpu $(nproc) (installed with apt-get when missing), one line per run
# with its result and time, logs under run/test-loaded/ (scripts/test_loaded.sh).
# RUNS defaults to 5 here (make sim's default of 1000 is not meant).
test-loaded:
	@./scripts/test_loaded.sh $(if $(filter command line environment,$(origin RUNS)),$(RUNS),5)

# make chaos: every chaos scenario (chaos.Scenarios(), about 9 minutes;
# join-and-drain and kill-then-replace start nodes, so they run only with
# CHAOS_PROVISION=local and are skipped on the terraform cluster)
# on one cluster provisioned through terraform/local (scripts/chaos_tf.sh:
# apply 3 regions x 3 nodes with homing (lease TTL 3s), failpoints and the
# chaos links on ports 7700-7767, run geolog-chaos attached to its env file,
# destroy). CHAOS_PROVISION=local runs each scenario on a fresh cluster of
# the harness's own (chaos.LocalCluster, free ports as the slice's;
# CHAOS_PG_PORT=n pins its PostgreSQL's) instead; CHAOS_ENV=run/cluster/env
# attaches to a running cluster (scripts/cluster.sh, terraform). Histories under run/chaos.
# CHAOS_SCENARIOS=a,b picks scenarios, CHAOS_SEED the seed.
CHAOS_SCENARIOS ?= all
CHAOS_SEED      ?= 1
CHAOS_ENV       ?=
CHAOS_PROVISION ?= terraform
CHAOS_PG_PORT   ?= 0
CHAOS_FLAGS      = --scenarios $(CHAOS_SCENARIOS) --seed $(CHAOS_SEED) --dir $(RUN)/chaos
chaos: build
	@if [ -n "$(CHAOS_ENV)" ]; then \
		$(BIN)/geolog-chaos $(CHAOS_FLAGS) --env $(CHAOS_ENV); \
	elif [ "$(CHAOS_PROVISION)" = local ]; then \
		$(BIN)/geolog-chaos $(CHAOS_FLAGS) --pg-port $(CHAOS_PG_PORT); \
	elif [ "$(CHAOS_PROVISION)" = terraform ]; then \
		$(MAKE) --no-print-directory terraform && TERRAFORM=$(TERRAFORM) ./scripts/chaos_tf.sh $(CHAOS_FLAGS); \
	else \
		echo "CHAOS_PROVISION=$(CHAOS_PROVISION): want terraform or local" >&2; exit 2; \
	fi

sim:
	@if [ -n "$(SEED)" ]; then \
		$(GO) test -count=1 -v -run 'TestSimulator$$' ./sim -args -seed=$(SEED) -steps=$(STEPS) -regions=$(REGIONS) -simlog=$(SIMLOG) -simtrace=$(SIMTRACE); \
	else \
		GOGC=800 $(GO) test -count=1 -v -timeout 0 -run 'TestSimulator$$' ./sim -args -runs=$(RUNS) -first=$(FIRST) -steps=$(STEPS) -regions=$(REGIONS) -jobs=$(JOBS) -keepgoing=$(KEEPGOING); \
	fi

# make bench-floor: this machine's physical floor (write+fdatasync of 4 KiB
# and 1 MiB with one writer and with FLOOR_WRITERS at once, loopback round
# trip), which every benchmark target prints first so that its figures
# stand beside it. FLOOR_WRITERS is the replicas each benchmark puts on
# this disk (bench 1, bench-region and bench-groups 3, the local 3x3
# cluster 9); FLOOR_DIR the disk (default run/, where the nodes write).
FLOOR_WRITERS ?= 3
FLOOR_DIR ?= $(RUN)
bench-floor: build
	@mkdir -p $(FLOOR_DIR)
	$(BIN)/geolog bench floor --dir $(FLOOR_DIR) --writers $(FLOOR_WRITERS)

bench: FLOOR_WRITERS = 1
bench: build bench-floor
	./scripts/bench.sh

# Operator drills on a fresh local cluster with homing: whole-region
# failover (DRILL_RUNS runs) and planned rehomes under load, with figures.
DRILL_RUNS ?= 5
DRILL_MOVES ?= 12
drill: build
	./scripts/cluster.sh up --fresh
	@$(GO) test -count=1 -v -timeout 40m -run 'Drill$$' ./drill -args -cluster=$(CURDIR)/run/cluster/env \
		-runs=$(DRILL_RUNS) -moves=$(DRILL_MOVES) -lease-ttl=$${GEOLOG_LEASE_TTL:-4s}; rc=$$?; \
		./scripts/cluster.sh down; exit $$rc

bench-region: build bench-floor
	./scripts/bench_region.sh

# Issue-16 consumer figures on a 3-node region: cursor commits/s and group
# rebalance times (scripts/bench_groups.sh; GEOLOG_BENCH_PORT moves it).
bench-groups: build bench-floor
	./scripts/bench_groups.sh

# Per-key sync figures (issue 16): one conversation synced from offset 0
# on a range of 10 million records (RECORDS=n), with the key index and by
# a full scan, through the segment store and a node's Read RPC. Builds
# the ranges under run/keysync (about 1.3 GB each), removes them after.
bench-keysync: FLOOR_WRITERS = 1
bench-keysync: bench-floor
	./scripts/bench_keysync.sh

# The end-to-end figure (issue 16): produce in us at half its throughput,
# a consumer-group member in eu; p50/p99 from produce to delivery. Needs
# the local cluster (make up). CONSUMER=ap for ap.
bench-e2e: FLOOR_WRITERS = 9
bench-e2e: build bench-floor
	./scripts/bench_e2e.sh

# The CPU of 1,000 idle ranges on a 3-node region.
bench-idle: build bench-floor
	./scripts/bench_idle.sh

# Many idle ranges (RANGES=1000) with a lease store: creation and start-up
# time, RSS, goroutines, idle CPU per node, lease-store transactions/s.
bench-ranges: build
	./scripts/bench_ranges.sh

# Issue-4 figures on the local 3-region cluster (make up first).
bench-geo: FLOOR_WRITERS = 9
bench-geo: build bench-floor
	./scripts/bench_geo.sh

# docs/capacity.md's measurements on the local 3x3 cluster (started and
# stopped here if it is not running): CPU, disk, network and memory per
# region per 1,000 records/s, with 0, 1 and 2 mirror regions.
bench-capacity: FLOOR_WRITERS = 9
bench-capacity: build bench-floor
	./scripts/bench_capacity.sh

# The scale curve (issue 12): records/s of one region of 3, 6 and 9 nodes
# (NODES="3 6 9") on this machine, with range leaders per node.
bench-scale: build bench-floor
	./scripts/bench_scale.sh

# make bench-rebalance: throughput and p99 of a region before, during and
# after growing from 3 to 6 nodes (scripts/bench_rebalance.sh).
bench-rebalance: build bench-floor
	./scripts/bench_rebalance.sh

# make demo: the multi-region demo on the local cluster (started if it is
# not running, left running: make down stops it). make demo-single: the
# single-node demo (starts and stops its own node under run/demo).
demo: build
	./scripts/demo.sh multi

demo-single: build
	./scripts/demo.sh single

# The local multi-region cluster (scripts/cluster.sh): us, eu, ap x 3 nodes
# and a WAN emulator under run/cluster. GEOLOG_CLUSTER_PORT moves the port
# plan (default 7500); GEOLOG_WAN_LATENCY overrides every pair's latency.
up: build
	./scripts/cluster.sh up

down:
	./scripts/cluster.sh down

status:
	./scripts/cluster.sh status

# terraform/local: the local cluster through Terraform (terraform/README.md).
terraform:
	@if [ -x "$(TERRAFORM)" ]; then \
		echo "terraform: $(TERRAFORM)"; \
	else \
		echo "terraform missing: building $(TERRAFORM_VERSION) into $(TOOLBIN) (a few minutes)"; \
		mkdir -p $(TOOLBIN); \
		GOBIN=$(TOOLBIN) $(GO) install github.com/hashicorp/terraform@$(TERRAFORM_VERSION); \
	fi

tf-up: build terraform
	$(TERRAFORM) -chdir=$(TF_LOCAL) init -input=false
	$(TERRAFORM) -chdir=$(TF_LOCAL) apply -auto-approve -input=false $(TF_VARS)

tf-down: terraform
	$(TERRAFORM) -chdir=$(TF_LOCAL) init -input=false
	$(TERRAFORM) -chdir=$(TF_LOCAL) destroy -auto-approve -input=false $(TF_VARS)

tf-fmt: terraform
	$(TERRAFORM) fmt -recursive terraform/

# Formatting and the static reference check of every module (no provider
# needed); both also run in make test.
tf-check: terraform
	$(TERRAFORM) fmt -check -recursive -diff terraform/
	$(GO) test -count=1 -run 'TestModules|TestCheck|TestFormatted' ./terraform/

# The real apply/destroy cycle of terraform/local (2 regions x 1 node on 8
# free consecutive ports held through internal/portlock); make test runs it
# too when terraform is installed.
tf-test: build terraform
	$(GO) test -count=1 -v -run TestLocalApplyDestroy ./terraform/

# make release VERSION=v0.1.0: dist/ archives (linux amd64 and arm64), the
# container image, SHA256SUMS (scripts/release.sh).
release:
	@VERSION=$(VERSION) ./scripts/release.sh

# make image: the container image of this checkout, built without a
# container engine (internal/image): bin/geolog-image.tar, for docker load.
image:
	@mkdir -p $(BIN)/linux-amd64
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/linux-amd64/ ./cmd/geologd ./cmd/geolog
	$(GO) run ./cmd/geolog-image --bin-dir $(BIN)/linux-amd64 --tag geolog:dev --out $(BIN)/geolog-image.tar

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
