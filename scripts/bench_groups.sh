#!/usr/bin/env bash
# make bench-groups: issue-16 consumer figures. Starts a 3-node replicated
# region (fsync on, quorum acks) under run/bench-groups and measures, from
# this machine: cursor commits per second (geolog bench cursors: one
# commit request carries every range's position of one cursor), and the
# time for a group of 8 members on 64 ranges to consume every range again
# after a graceful leave, a kill (session timeout 3 s), and a join
# (geolog bench rebalance).
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
PIDS=()
for i in 1 2 3; do
	"$BIN/geologd" --data-dir "$RUNDIR/n$i" --listen "127.0.0.1:$((BASE+i))" --node-id $i --peers "$PEERS" \
		--fsync always --log-level warn >"$RUNDIR/n$i.log" 2>&1 &
	PIDS+=($!)
done
trap 'kill -TERM ${PIDS[*]} 2>/dev/null; wait ${PIDS[*]} 2>/dev/null || true' EXIT
for i in $(seq 1 100); do "$BIN/geolog" streams list >/dev/null 2>&1 && break; sleep 0.1; done

echo "== cursor commits (64 ranges per commit, 64 cursors, 16 in flight, $DURATION)"
for i in $(seq 1 20); do
	"$BIN/geolog" bench cursors --ranges 64 --duration 2s >/dev/null 2>&1 && break   # warm up: streams, cursor stream, leaders
	sleep 0.5
done
"$BIN/geolog" bench cursors --ranges 64 --cursors 64 --concurrency 16 --duration "$DURATION"
echo
echo "== rebalance (64 ranges, 8 members, session 3s, $ROUNDS rounds)"
"$BIN/geolog" bench rebalance --ranges 64 --members 8 --rounds "$ROUNDS" --session 3s
