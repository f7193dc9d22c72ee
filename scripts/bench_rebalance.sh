#!/usr/bin/env bash
# make bench-rebalance: throughput and latency of one region before,
# during and after a rebalance (issue 12). A region of 3 nodes (R3, fsync
# on, TLS, quorum acks, GOMAXPROCS=1 each) holds a stream of RANGES ranges
# (default 24) preloaded with PRELOAD records of 1 KiB (default 30000), so
# that every replica moved carries data. Then, with 8 producers at a fixed
# RATE (default 3000 records/s; latency counts from each record's
# scheduled time, so a stall shows), three runs of `geolog bench`:
#
#   before  DURATION (default 10s) on the 3 nodes;
#   during  DURING (default 30s), started as nodes 4-6 join with --join
#           only: the rebalancer moves replicas onto them (learner,
#           catch-up, promote, remove; --rebalance-moves-max 2 at a time,
#           32 MiB/s of transfer) and balances leaders;
#   after   DURATION, once every node holds within 20% of the mean of the
#           replicas and no move runs (or after BALANCE_SECONDS, default 180).
#
# Prints each run's records/s, p50/p99/max, per second as it runs, and
# the replicas moved while the "during" run ran (sampled every 2 s from
# `geolog nodes list`). Ports:
# BASE+1..6, BASE is GEOLOG_BENCH_PORT (default 8760).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
RUNDIR=$PWD/run/bench-rebalance
RANGES=${RANGES:-24}
PRELOAD=${PRELOAD:-30000}
RATE=${RATE:-3000}
DURATION=${DURATION:-10s}
DURING=${DURING:-30s}
BASE=${GEOLOG_BENCH_PORT:-8760}
. "$(dirname "$0")/benchlib.sh"

PIDS=()
stop_nodes() {
	[ ${#PIDS[@]} -eq 0 ] && return 0
	kill -TERM "${PIDS[@]}" 2>/dev/null || true
	wait "${PIDS[@]}" 2>/dev/null || true
	PIDS=()
}
trap stop_nodes EXIT

rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
peers=""; addrs=""
for i in 1 2 3; do
	peers+="${peers:+,}$i=127.0.0.1:$((BASE + i))"
	addrs+="${addrs:+,}127.0.0.1:$((BASE + i))"
done
export GEOLOG_ADDR=$addrs
pki_setup local 6
flags="--fsync always --log-level warn --rebalance-interval 2s --leader-balance-interval 2s"
start_node() { # start_node I MEMBERSHIP-FLAGS...
	local i=$1; shift
	# shellcheck disable=SC2046,SC2086
	GOMAXPROCS=1 "$BIN/geologd" --data-dir "$RUNDIR/n$i" --listen "127.0.0.1:$((BASE + i))" --node-id "$i" "$@" \
		$flags $(node_security "$i") ${GEOLOGD_FLAGS:-} >"$RUNDIR/n$i.log" 2>&1 &
	PIDS+=($!)
}
for i in 1 2 3; do start_node "$i" --peers "$peers"; done
for i in $(seq 1 150); do "$BIN/geolog" streams list >/dev/null 2>&1 && break; sleep 0.2; done
for i in $(seq 1 40); do
	"$BIN/geolog" bench --stream rb --ranges "$RANGES" --producers 4 --count "$PRELOAD" --values 4096 >/dev/null 2>&1 && break
	sleep 0.5
done
echo "  preloaded $PRELOAD records of 1 KiB over $RANGES ranges"
settle

nodes_json() { "$BIN/geolog" nodes list --json 2>/dev/null || echo '[]'; }
balanced() {
	nodes_json | python3 -c '
import json,sys
ns=[n for n in json.load(sys.stdin) if n.get("state")=="live"]
if len(ns) < 6 or any(n.get("moves_in") or n.get("moves_out") for n in ns): sys.exit(1)
reps=[n["replicas"] for n in ns]; mean=sum(reps)/len(reps)
sys.exit(0 if all(abs(r-mean) <= 0.2*mean for r in reps) else 1)'
}

run "before (3 nodes)" --stream rb --producers 8 --rate "$RATE" --duration "$DURATION" --values 4096

# During: nodes 4-6 join as the run starts; sample the moves meanwhile.
t0=$(date +%s)
for i in 4 5 6; do start_node "$i" --join "127.0.0.1:$((BASE + 1))"; done
(
	while :; do
		nodes_json | python3 -c '
import json,sys,time
ns=json.load(sys.stdin)
print(json.dumps({"t": time.time(), "moving": sum(n.get("moves_in", 0) for n in ns),
  "replicas": {n["node_id"]: n["replicas"] for n in ns}}))' >>"$RUNDIR/moves.jsonl" || true
		sleep 2
	done
) &
SAMPLER=$!
run "during (3 -> 6 nodes)" --stream rb --producers 8 --rate "$RATE" --duration "$DURING" --values 4096
kill "$SAMPLER" 2>/dev/null || true
python3 -c '
import json,sys
peak=0; last={}
for line in open(sys.argv[1]):
    d=json.loads(line); peak=max(peak, d["moving"]); last=d["replicas"]
moved=sum(v for k, v in last.items() if int(k) > 3)
print("  during the run: %d replicas moved onto nodes 4-6, at most %d moves at once; replicas per node at its end: %s" % (moved, peak, ", ".join("n%s %s" % kv for kv in sorted(last.items()))))' "$RUNDIR/moves.jsonl"

for i in $(seq 1 "${BALANCE_SECONDS:-180}"); do balanced && break; sleep 1; done
echo "  balanced (or gave up) $(( $(date +%s) - t0 )) s after the joins: $(nodes_json | python3 -c '
import json,sys
print(", ".join("n%d %d replicas %d leaders" % (n["node_id"], n["replicas"], n["leaders"]) for n in json.load(sys.stdin)))')"
settle
run "after (6 nodes)" --stream rb --producers 8 --rate "$RATE" --duration "$DURATION" --values 4096
echo "  load average: $(cut -d' ' -f1-3 /proc/loadavg)"
