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
rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
. "$(dirname "$0")/benchlib.sh"
ON_EXIT='rm -rf "$RUNDIR"'
start_region3 --log-level warn
for i in $(seq 1 20); do "$BIN/geolog" streams create idle --ranges "$RANGES" >/dev/null 2>&1 && break; sleep 0.5; done
sleep 15 # elections and the first heartbeats settle
t0=$(cpu_ticks); sleep "$SECONDS_MEASURED"; t1=$(cpu_ticks)
hz=$(getconf CLK_TCK)
awk -v d=$((t1 - t0)) -v hz="$hz" -v s="$SECONDS_MEASURED" -v r="$RANGES" \
	'BEGIN { printf "%d idle ranges x 3 nodes: %.1f%% of one core (all three nodes together, %ds)\n", r, 100 * d / hz / s, s }'
