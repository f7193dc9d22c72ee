#!/usr/bin/env bash
# The cost of idle ranges (issue 3): a 3-node region with RANGES (default
# 1000) ranges and no traffic; prints the CPU all three nodes use together,
# as a share of one core, over IDLE_SECONDS (default 20) after they settle.
# TLS on every hop unless TLS=off (benchlib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
RUNDIR=$PWD/run/bench-idle
RANGES=${RANGES:-1000}
SECONDS_MEASURED=${IDLE_SECONDS:-20}
BASE=${GEOLOG_BENCH_PORT:-7480}
PEERS="1=127.0.0.1:$((BASE+1)),2=127.0.0.1:$((BASE+2)),3=127.0.0.1:$((BASE+3))"
export GEOLOG_ADDR="127.0.0.1:$((BASE+1)),127.0.0.1:$((BASE+2)),127.0.0.1:$((BASE+3))"
rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
. "$(dirname "$0")/benchlib.sh"
pki_setup local 3
PIDS=()
for i in 1 2 3; do
	# shellcheck disable=SC2046
	"$BIN/geologd" --data-dir "$RUNDIR/n$i" --listen "127.0.0.1:$((BASE+i))" --node-id $i --peers "$PEERS" \
		--log-level warn $(node_security $i) >"$RUNDIR/n$i.log" 2>&1 &
	PIDS+=($!)
done
trap 'kill -TERM ${PIDS[*]} 2>/dev/null; wait ${PIDS[*]} 2>/dev/null || true; rm -rf "$RUNDIR"' EXIT
for i in $(seq 1 100); do "$BIN/geolog" streams list >/dev/null 2>&1 && break; sleep 0.1; done
for i in $(seq 1 20); do "$BIN/geolog" streams create idle --ranges "$RANGES" >/dev/null 2>&1 && break; sleep 0.5; done
sleep 15 # elections and the first heartbeats settle
ticks() { for p in "${PIDS[@]}"; do awk '{print $14 + $15}' "/proc/$p/stat"; done | awk '{ s += $1 } END { print s }'; }
t0=$(ticks); sleep "$SECONDS_MEASURED"; t1=$(ticks)
hz=$(getconf CLK_TCK)
awk -v d=$((t1 - t0)) -v hz="$hz" -v s="$SECONDS_MEASURED" -v r="$RANGES" \
	'BEGIN { printf "%d idle ranges x 3 nodes: %.1f%% of one core (all three nodes together, %ds)\n", r, 100 * d / hz / s, s }'
