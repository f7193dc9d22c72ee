#!/usr/bin/env bash
# make bench-groups: issue-16 consumer figures. Starts a 3-node replicated
# region (fsync on, quorum acks) under run/bench-groups and measures, from
# this machine: cursor commits per second (geolog bench cursors: one
# commit request carries every range's position of one cursor; with the
# nodes' CPU time per position, as the machine may be shared), and the
# time for a group of 8 members on 64 ranges to consume every range again
# after a graceful leave, a kill (session timeout 3 s), and a join
# (geolog bench rebalance). TLS=off runs the nodes with --insecure.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
RUNDIR=$PWD/run/bench-groups
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-5}
BASE=${GEOLOG_BENCH_PORT:-7480}
PEERS="1=127.0.0.1:$((BASE+1)),2=127.0.0.1:$((BASE+2)),3=127.0.0.1:$((BASE+3))"
export GEOLOG_ADDR="127.0.0.1:$((BASE+1)),127.0.0.1:$((BASE+2)),127.0.0.1:$((BASE+3))"

rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
. "$(dirname "$0")/benchlib.sh"   # TLS=on (default) or off, as make bench-region
pki_setup local 3
PIDS=()
for i in 1 2 3; do
	# shellcheck disable=SC2046
	"$BIN/geologd" --data-dir "$RUNDIR/n$i" --listen "127.0.0.1:$((BASE+i))" --node-id $i --peers "$PEERS" \
		--fsync always --log-level warn $(node_security $i) >"$RUNDIR/n$i.log" 2>&1 &
	PIDS+=($!)
done
trap 'kill -TERM ${PIDS[*]} 2>/dev/null; wait ${PIDS[*]} 2>/dev/null || true' EXIT
for i in $(seq 1 100); do "$BIN/geolog" streams list >/dev/null 2>&1 && break; sleep 0.1; done

# cpu_seconds: user+system CPU seconds of the three nodes so far.
cpu_seconds() {
	local total=0 f
	for p in "${PIDS[@]}"; do
		read -r -a f < "/proc/$p/stat"
		total=$(( total + f[13] + f[14] ))
	done
	echo "$total $(getconf CLK_TCK)" | awk '{ printf "%.2f", $1 / $2 }'
}

CONCURRENCY=${CONCURRENCY:-64}
echo "== cursor commits (64 positions per commit, 1024 cursors, $CONCURRENCY in flight, $DURATION)"
for i in $(seq 1 20); do
	"$BIN/geolog" bench cursors --ranges 64 --duration 2s >/dev/null 2>&1 && break   # warm up: streams, cursor stream, leaders
	sleep 0.5
done
before=$(cpu_seconds)
"$BIN/geolog" bench cursors --ranges 64 --cursors 1024 --concurrency "$CONCURRENCY" --duration "$DURATION" --json >"$RUNDIR/cursors.json"
after=$(cpu_seconds)
python3 - "$RUNDIR/cursors.json" "$before" "$after" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); cpu = float(sys.argv[3]) - float(sys.argv[2])
print(f"positions   {r['positions']} committed ({r['errors']} failed requests) in {r['elapsed_seconds']:.1f}s")
print(f"throughput  {r['positions_per_sec']:.0f} positions/s")
l = r['request_latency_ms']
print(f"latency ms  p50 {l['p50']:.1f}  p99 {l['p99']:.1f}  max {l['max']:.1f} (one commit request of 64 positions)")
per = cpu / max(1, r['positions'])
print(f"node CPU    {cpu:.1f} s for the 3 nodes: {per*1e6:.1f} us per position (2 cores to themselves: about {2/per:.0f} positions/s)")
PY
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "== rebalance (64 ranges, 8 members, session 3s, $ROUNDS rounds)"
"$BIN/geolog" bench rebalance --ranges 64 --members 8 --rounds "$ROUNDS" --session 3s
