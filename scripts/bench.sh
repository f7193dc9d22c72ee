#!/usr/bin/env bash
# make bench: the issue-2 figures. Starts a fresh geologd (fsync on) under
# run/bench, then runs geolog bench side by side with it on this machine:
#   1 producer and 8 producers at full speed; 8 producers paced at 75,000
#   records/s (half the 150,000 target) and at half the measured 8-producer
#   rate; one-at-a-time produce. 1 KiB records throughout.
# Prints one JSON line per run to run/bench/results.jsonl and a summary.
# GEOLOGD_FLAGS adds flags to the node (an A/B: --log-zero-ahead-bytes -1);
# GEOLOG_BENCH_BIN=dir runs another build's geologd and geolog.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GEOLOG_BENCH_BIN:-$PWD/bin} # GEOLOG_BENCH_BIN=dir: another build (an A/B)
RUNDIR=$PWD/run/bench
PORT=${GEOLOG_BENCH_PORT:-7472}
ADDR=127.0.0.1:$PORT
DURATION=${DURATION:-10s}
RANGES=${RANGES:-8}
export GEOLOG_ADDR=$ADDR

rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
. "$(dirname "$0")/benchlib.sh"
pki_setup local 1
# shellcheck disable=SC2046
"$BIN/geologd" --data-dir "$RUNDIR/data" --listen "$ADDR" --fsync always --log-level warn $(node_security 1) ${GEOLOGD_FLAGS:-} >"$RUNDIR/geologd.log" 2>&1 &
NODE_PID=$!
trap 'kill -TERM $NODE_PID 2>/dev/null; wait $NODE_PID 2>/dev/null || true' EXIT
for i in $(seq 1 100); do "$BIN/geolog" streams list >/dev/null 2>&1 && break; sleep 0.1; done

# Latency-sensitive runs first, and a settled disk before each run.
settle; run "one at a time"         --stream bs --ranges 1 --producers 1 --duration "$DURATION" --sync
settle; run "8 producers at 75k/s"  --stream bt --producers 8 --duration "$DURATION" --rate 75000
settle; run "1 producer"            --stream b1 --producers 1 --duration "$DURATION"
settle; run "8 producers"           --stream b8 --producers 8 --duration "$DURATION"
MAX=$(last_rate)
settle; run "8 producers at half"   --stream bh --producers 8 --duration "$DURATION" --rate $(( MAX / 2 ))
