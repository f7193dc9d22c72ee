#!/usr/bin/env bash
# make bench-scale: the scale curve of issue 12 — records/s of one region
# against its number of nodes. For each N in NODES (default "3 6 9"): a
# fresh region of N nodes (R3, fsync on, TLS, quorum acks; each node's
# Go scheduler on one core, GOMAXPROCS=1, as on its own small machine),
# a stream of RANGES ranges (default 24) placed across them, and
# `geolog bench` at full speed with PRODUCERS producers (default 8) for
# DURATION (default 15s), 1 KiB records. Prints records/s, p50/p99 and how
# many range leaders each node holds (placement and leader balancing; the
# run starts once leaders are balanced, or after BALANCE_SECONDS).
#
# Every node shares this machine's cores and its one disk, so the curve
# shows what geolog does with more nodes on the same hardware (the cost
# of more processes, not the gain of more machines); docs/capacity.md
# says how to read it. Ports: BASE+1..N, BASE is GEOLOG_BENCH_PORT
# (default 8700).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
RUNDIR=$PWD/run/bench-scale
NODES=${NODES:-3 6 9}
RANGES=${RANGES:-24}
PRODUCERS=${PRODUCERS:-8}
DURATION=${DURATION:-15s}
BASE=${GEOLOG_BENCH_PORT:-8700}
. "$(dirname "$0")/benchlib.sh"

PIDS=()
stop_nodes() {
	[ ${#PIDS[@]} -eq 0 ] && return 0
	kill -TERM "${PIDS[@]}" 2>/dev/null || true
	wait "${PIDS[@]}" 2>/dev/null || true
	PIDS=()
}
trap stop_nodes EXIT

for n in $NODES; do
	rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
	peers=""; addrs=""
	for i in $(seq 1 "$n"); do
		peers+="${peers:+,}$i=127.0.0.1:$((BASE + i))"
		addrs+="${addrs:+,}127.0.0.1:$((BASE + i))"
	done
	export GEOLOG_ADDR=$addrs
	pki_setup local "$n"
	for i in $(seq 1 "$n"); do
		# shellcheck disable=SC2046
		GOMAXPROCS=1 "$BIN/geologd" --data-dir "$RUNDIR/n$i" --listen "127.0.0.1:$((BASE + i))" --node-id "$i" \
			--peers "$peers" --fsync always --log-level warn $(node_security "$i") ${GEOLOGD_FLAGS:-} >"$RUNDIR/n$i.log" 2>&1 &
		PIDS+=($!)
	done
	for i in $(seq 1 150); do "$BIN/geolog" streams list >/dev/null 2>&1 && break; sleep 0.2; done
	for i in $(seq 1 40); do
		"$BIN/geolog" bench --stream scale --ranges "$RANGES" --producers 1 --count 2000 >/dev/null 2>&1 && break
		sleep 0.5
	done
	# Leader balancing runs on its own interval: wait (BALANCE_SECONDS,
	# default 90) until no node leads more than its share plus one.
	t0=$(date +%s)
	for i in $(seq 1 "${BALANCE_SECONDS:-90}"); do
		"$BIN/geolog" ranges scale --json 2>/dev/null | python3 -c '
import collections,json,sys
rs=json.load(sys.stdin); n=int(sys.argv[1])
c=collections.Counter(r.get("leader","") for r in rs)
share=-(-len(rs)//n)
sys.exit(0 if "" not in c and len(c) == n and max(c.values()) <= share + 1 else 1)' "$n" && break
		sleep 1
	done
	echo "  leaders balanced (or gave up) after $(( $(date +%s) - t0 )) s"
	settle
	run "$n nodes, $PRODUCERS producers" --stream scale --producers "$PRODUCERS" --duration "$DURATION" --values 4096
	"$BIN/geolog" ranges scale --json 2>/dev/null | python3 -c '
import collections,json,sys
rs=json.load(sys.stdin)
c=collections.Counter(r.get("leader","?") for r in rs)
print("  range leaders per node: " + ", ".join("%s %d" % (k.rsplit(":",1)[-1], v) for k, v in sorted(c.items())))' || true
	echo "  load average: $(cut -d' ' -f1-3 /proc/loadavg)"
	stop_nodes
done
