#!/usr/bin/env bash
# scripts/bench_node_ab.sh DIR_A DIR_B [RATE] [PAIRS]: one node's latency
# and CPU per record at a fixed rate, for two builds alternated.
#
# Each run starts a fresh insecure node (fsync always) from DIR's geologd
# on 127.0.0.1:$GEOLOG_BENCH_PORT (default 7481), lets the disk settle,
# runs this checkout's bin/geolog bench with 8 producers over 8 ranges of
# 1 KiB records at RATE (default 75000) for $DURATION (default 10s), and
# prints records/s, p50 and p99 beside the node's CPU per record (its
# utime+stime from /proc over the run). The client is the same for both
# builds, so a difference is the server's. PAIRS (default 3) alternations,
# A first. Run data under run/bench-node-ab, wiped at each start.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { echo "usage: $0 DIR_A DIR_B [RATE] [PAIRS]" >&2; exit 2; }
A=$1 B=$2 RATE=${3:-75000} PAIRS=${4:-3}
PORT=${GEOLOG_BENCH_PORT:-7481}
DURATION=${DURATION:-10s}
RUNDIR=$PWD/run/bench-node-ab
CLIENT=$PWD/bin/geolog
[[ -x $CLIENT ]] || { echo "no bin/geolog: run make build" >&2; exit 1; }
export GEOLOG_ADDR=127.0.0.1:$PORT
PID=
trap '[[ -n $PID ]] && kill $PID 2>/dev/null; true' EXIT

run() {
	local label=$1 dir=$2
	rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
	"$dir/geologd" --data-dir "$RUNDIR/data" --listen "$GEOLOG_ADDR" --fsync always --log-level warn --insecure >"$RUNDIR/geologd.log" 2>&1 &
	PID=$!
	for _ in $(seq 1 100); do "$CLIENT" streams list >/dev/null 2>&1 && break; sleep 0.1; done
	sync; sleep 2
	local c0 c1 out
	c0=$(awk '{print $14+$15}' "/proc/$PID/stat")
	out=$("$CLIENT" bench --stream ab --ranges 8 --record-bytes 1024 --producers 8 --duration "$DURATION" --rate "$RATE" --json 2>/dev/null)
	c1=$(awk '{print $14+$15}' "/proc/$PID/stat")
	kill $PID; wait $PID 2>/dev/null || true; PID=
	python3 -c '
import json, os, sys
r = json.loads(sys.argv[1]); l = r["latency_ms"]
ticks = (int(sys.argv[3]) - int(sys.argv[2])) / os.sysconf("SC_CLK_TCK")
n = r["records"]
print("%-4s %-40s %8.0f rec/s  p50 %7.2f ms  p99 %8.2f ms  node CPU %5.1f us/record  load %s" % (sys.argv[4], sys.argv[5], r["records_per_sec"], l["p50"], l["p99"], ticks * 1e6 / n, open("/proc/loadavg").read().split()[0]))
' "$out" "$c0" "$c1" "$label" "$dir"
}

for _ in $(seq 1 "$PAIRS"); do
	run A "$A"
	run B "$B"
done
