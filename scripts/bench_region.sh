#!/usr/bin/env bash
# make bench-region: issue-3 figures. Starts a 3-node replicated region
# (fsync on, quorum acks) under run/bench-region and runs geolog bench
# against it on this machine: one-at-a-time produce, full speed with 8
# producers, and 8 producers at half that rate. 1 KiB records.
# GEOLOGD_FLAGS adds flags to every node (--append-queue-delay-target -1s
# turns load shedding off); BENCH_FLAGS to every geolog bench run
# (--queue-delay-target 0 turns the producers' queueing-delay bound off);
# HALF_RATE fixes the half-rate run's records/s.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GEOLOG_BENCH_BIN:-$PWD/bin} # GEOLOG_BENCH_BIN=dir: another build (an A/B)
RUNDIR=$PWD/run/bench-region
DURATION=${DURATION:-10s}
RANGES=${RANGES:-8}
BASE=${GEOLOG_BENCH_PORT:-7480}

rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
. "$(dirname "$0")/benchlib.sh"
start_region3 --fsync always --log-level warn
# Create the streams and write a little first (warm_stream).
for s in bs b8 bh bt; do
	r=$RANGES; [ "$s" = bs ] && r=1
	warm_stream "$s" "$r" 2000
done
settle; run "one at a time"        --stream bs --ranges 1 --producers 1 --duration "$DURATION" --sync
settle; run "8 producers"          --stream b8 --producers 8 --duration "$DURATION"
MAX=$(last_rate)
# HALF_RATE fixes the "half" run's rate (records/s) instead of half of the
# full-speed run's, so that an A/B offers both sides the same load.
settle; run "8 producers at half"  --stream bh --producers 8 --duration "$DURATION" --rate "${HALF_RATE:-$(( MAX / 2 ))}"
settle; run "8 producers at 35k/s" --stream bt --producers 8 --duration "$DURATION" --rate 35000
