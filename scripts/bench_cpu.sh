#!/usr/bin/env bash
# scripts/bench_cpu.sh: server CPU per record on a 3-node region (issue 15).
# Starts bench_region.sh's region (3 nodes, R3, TLS, --fsync always) from
# BIN (default bin/), warms a stream up, then runs geolog bench with
# PRODUCERS producers at RATE records/s of 1 KiB for DURATION and prints
# the three node processes' CPU time (user+system, /proc/PID/stat) per
# record acknowledged, the bench's p50/p99 and the load average. PROFILE=DIR
# also takes a CPU profile of nodes 1 and 2 (PROFILE_SECONDS, default 20)
# during the run into DIR/n1.pprof .. DIR/n3.pprof. The counters line
# gives, per 1,000 records, the append requests, Raft messages and batches
# sent and log fsyncs of the three nodes, and the CPU per append request.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/bin}
RUNDIR=${RUNDIR:-$PWD/run/bench-cpu}
DURATION=${DURATION:-30s}
RATE=${RATE:-10000}
PRODUCERS=${PRODUCERS:-8}
RANGES=${RANGES:-8}
BASE=${GEOLOG_BENCH_PORT:-19580}

rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
. "$(dirname "$0")/benchlib.sh"
DEBUG=on start_region3 --fsync always --log-level warn
warm_stream bc "$RANGES" 5000
settle
CURLS=()
if [ -n "${PROFILE:-}" ]; then
	mkdir -p "$PROFILE"
	for i in 1 2 3; do
		(sleep 3; curl -s -o "$PROFILE/n$i.pprof" "http://127.0.0.1:$((BASE+10+i))/debug/pprof/profile?seconds=${PROFILE_SECONDS:-20}") &
		CURLS+=($!)
	done
fi
# counters sums the nodes' counters this run reports per record.
counters() {
	for i in 1 2 3; do curl -s "http://127.0.0.1:$((BASE+10+i))/metrics"; done |
		awk '/^geolog_(append_requests|raft_sent_messages|raft_sent_batches|segment_fsync_duration_seconds_count)/ {
			n=$1; sub(/\{.*/, "", n); s[n]+=$NF } END { for (n in s) printf "%s=%d ", n, s[n] }'
}
load=$(cut -d' ' -f1-3 /proc/loadavg)
m0=$(counters)
c0=$(cpu_ticks)
"$BIN/geolog" bench --json --record-bytes 1024 --ranges "$RANGES" --stream bc --producers "$PRODUCERS" \
	--rate "$RATE" --duration "$DURATION" ${BENCH_FLAGS:-} >"$RUNDIR/result.json"
c1=$(cpu_ticks)
m1=$(counters)
[ ${#CURLS[@]} -eq 0 ] || wait "${CURLS[@]}"
hz=$(getconf CLK_TCK)
python3 - "$RUNDIR/result.json" "$c0" "$c1" "$hz" "$load" "$BIN" "$m0" "$m1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); c0, c1, hz = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
n = r.get("records") or r["records_per_sec"] * r.get("seconds", 0)
cpu = (c1 - c0) / hz
l = r["latency_ms"]
print("bin %s  records %d  rec/s %.0f  node CPU %.1f s  %.1f us/record  p50 %.2f ms  p99 %.2f ms  errors %d  load %s" % (
    sys.argv[6], n, r["records_per_sec"], cpu, cpu * 1e6 / n, l["p50"], l["p99"], r["errors"], sys.argv[5]))
m0 = dict(kv.split("=") for kv in sys.argv[7].split())
m1 = dict(kv.split("=") for kv in sys.argv[8].split())
d = {k: int(m1[k]) - int(m0.get(k, 0)) for k in m1}
print("  per 1,000 records (3 nodes): " + "  ".join("%s %.1f" % (k, d[k] * 1000 / n) for k in sorted(d)))
a = d.get("geolog_append_requests_total", 0)
if a:
    print("  node CPU per append request %.0f us, Raft messages per append %.2f, records per append %.1f" % (
        cpu * 1e6 / a, d.get("geolog_raft_sent_messages_total", 0) / a, n / a))
PY
