#!/usr/bin/env bash
# Where one append's time goes between goroutines (issue 15, notes/rtt.md).
# Starts bench_region.sh's region (3 nodes, R3, TLS, --fsync always, 1 KiB
# records) with each node's --debug-addr, runs one producer one append at
# a time (geolog bench --sync --breakdown) for $DURATION, takes a Go
# execution trace of every node for $TRACE_SECONDS meanwhile, and prints
# scripts/tracehops's summary of each: per kind of goroutine the wait from
# woken to running and the length of its runs, and the node's fdatasyncs.
# GEOLOGD_BIN (default bin/) runs another build's binaries (an A/B);
# GEOLOG_BENCH_PORT moves the ports (BASE+1..3 serve, BASE+11..13 debug).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GEOLOGD_BIN:-$PWD/bin}
RUNDIR=$PWD/run/bench-hops
DURATION=${DURATION:-8s}
TRACE_SECONDS=${TRACE_SECONDS:-3}
BASE=${GEOLOG_BENCH_PORT:-7490}

rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
. "$(dirname "$0")/benchlib.sh"
DEBUG=on start_region3 --fsync always --log-level warn
warm_stream bs 1 2000
settle
echo "load $(cut -d' ' -f1 /proc/loadavg) at $(date -u +%H:%M:%S), binaries $BIN" >&2
TRACERS=()
for i in 1 2 3; do
	(sleep 1; curl -s "http://127.0.0.1:$((BASE+10+i))/debug/pprof/trace?seconds=$TRACE_SECONDS" -o "$RUNDIR/trace$i.out") &
	TRACERS+=($!)
done
"$BIN/geolog" bench --stream bs --ranges 1 --producers 1 --duration "$DURATION" --sync --breakdown --record-bytes 1024 | sed -n '/^stream/,$p'
wait "${TRACERS[@]}"
(cd scripts/tracehops && go run . "$RUNDIR"/trace1.out "$RUNDIR"/trace2.out "$RUNDIR"/trace3.out)
