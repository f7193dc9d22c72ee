#!/usr/bin/env bash
# make demo: start a geolog node with its data under run/demo, create a stream,
# produce sample traffic, read it back, benchmark briefly, stop cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
RUNDIR=$PWD/run/demo
PORT=${GEOLOG_DEMO_PORT:-7471}
ADDR=127.0.0.1:$PORT
export GEOLOG_ADDR=$ADDR

rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "starting geologd on $ADDR (data in run/demo)"
"$BIN/geologd" --data-dir "$RUNDIR/data" --listen "$ADDR" --log-level info >"$RUNDIR/geologd.log" 2>&1 &
NODE_PID=$!
cleanup() { if kill -0 "$NODE_PID" 2>/dev/null; then kill -TERM "$NODE_PID"; wait "$NODE_PID" || true; fi; }
trap cleanup EXIT
for i in $(seq 1 100); do
	if "$BIN/geolog" streams list >/dev/null 2>&1; then break; fi
	if ! kill -0 "$NODE_PID" 2>/dev/null; then cat "$RUNDIR/geologd.log"; echo "geologd died"; exit 1; fi
	sleep 0.1
done

say "geolog streams create chat --ranges 4"
"$BIN/geolog" streams create chat --ranges 4 --retention-age 168h
"$BIN/geolog" streams list

say "producing 20 chat messages keyed by room (per-key order = range order)"
for i in $(seq 1 20); do
	room=room-$(( i % 5 ))
	printf '%s\t%s says hello #%d\n' "$room" "user-$(( i % 5 ))" "$i"
done | "$BIN/geolog" produce chat --tab -v

say "geolog streams describe chat"
"$BIN/geolog" streams describe chat

say "consuming everything from offset 0"
"$BIN/geolog" consume chat --from-offset 0 --max 20

say "bench: 2 producers, 1 KiB records, 3 s, fsync on"
"$BIN/geolog" bench --stream bench --ranges 4 --producers 2 --record-bytes 1024 --duration 3s

say "stopping geologd (SIGTERM: it syncs and acks what it has, then exits)"
kill -TERM "$NODE_PID"; wait "$NODE_PID" || true
say "restarting to show recovery: the log is still there"
"$BIN/geologd" --data-dir "$RUNDIR/data" --listen "$ADDR" >>"$RUNDIR/geologd.log" 2>&1 &
NODE_PID=$!
for i in $(seq 1 100); do "$BIN/geolog" streams list >/dev/null 2>&1 && break; sleep 0.1; done
"$BIN/geolog" consume chat --from-offset 0 --max 3
"$BIN/geolog" streams describe chat
say "demo done; node log in run/demo/geologd.log"
