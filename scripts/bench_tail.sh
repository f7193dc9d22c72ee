#!/usr/bin/env bash
# Issue 15 tail study (notes/tail.md): bench_tail.sh ROOT PORTBASE TAG [RATE].
# A 3-node region as bench_region.sh (TLS, --fsync always, R3) from ROOT/bin,
# each node with --debug-addr PORTBASE+11.. and GODEBUG=gctrace=1 (logs under
# /tmp/tail/out-TAG); 8 producers at full speed, then at half that rate (or
# RATE) with --breakdown, the nodes' CPU per record from /proc, PROF=1 three
# 8 s CPU profiles, TRACE=1 a 3 s execution trace of node 1.
set -euo pipefail
ROOT=$1; BASE=$2; TAG=$3; RATE=${4:-}
cd "$ROOT"
BIN=$ROOT/bin
# The nodes' data goes when the script ends (full-speed runs write GBs);
# the logs, profiles and results stay in OUT.
RUNDIR=/tmp/tail/run-$TAG; OUT=/tmp/tail/out-$TAG
rm -rf "$RUNDIR" "$OUT"; mkdir -p "$RUNDIR" "$OUT"
DURATION=${DURATION:-10s}; RANGES=8
PEERS="1=127.0.0.1:$((BASE+1)),2=127.0.0.1:$((BASE+2)),3=127.0.0.1:$((BASE+3))"
export GEOLOG_ADDR="127.0.0.1:$((BASE+1)),127.0.0.1:$((BASE+2)),127.0.0.1:$((BASE+3))"
. scripts/benchlib.sh
pki_setup local 3
PIDS=()
for i in 1 2 3; do
  GODEBUG=gctrace=1 ${NODE_ENV:-} "$BIN/geologd" --data-dir "$RUNDIR/n$i" --listen "127.0.0.1:$((BASE+i))" --node-id $i --peers "$PEERS" \
    --fsync always --log-level warn --debug-addr 127.0.0.1:$((BASE+10+i)) $(node_security $i) ${GEOLOGD_FLAGS:-} >"$OUT/n$i.log" 2>&1 &
  PIDS+=($!)
done
trap 'kill -TERM ${PIDS[*]} 2>/dev/null; wait ${PIDS[*]} 2>/dev/null || true; rm -rf "$RUNDIR"' EXIT
for i in $(seq 1 100); do "$BIN/geolog" streams list >/dev/null 2>&1 && break; sleep 0.1; done
for s in b8 bh; do
  for i in $(seq 1 20); do "$BIN/geolog" bench --stream "$s" --ranges 8 --producers 1 --count 2000 >/dev/null 2>&1 && break; sleep 0.5; done
done
cpu() { local t=0; for p in ${PIDS[*]}; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
if [ -z "$RATE" ]; then
  settle; echo "load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  run "8 producers" --stream b8 --producers 8 --duration "$DURATION"
  RATE=$(( $(last_rate) / 2 ))
fi
settle; echo "load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/load" >&2
c0=$(cpu)
CP=()
if [ -n "${PROF:-}" ]; then for i in 1 2 3; do curl -s -o "$OUT/cpu$i.pprof" "http://127.0.0.1:$((BASE+10+i))/debug/pprof/profile?seconds=8" & CP+=($!); done; fi
if [ -n "${TRACE:-}" ]; then curl -s -o "$OUT/trace1.out" "http://127.0.0.1:$((BASE+11))/debug/pprof/trace?seconds=3" & CP+=($!); fi
/usr/bin/time -f "client %U user %S sys" -o "$OUT/clienttime" "$BIN/geolog" bench --json --record-bytes 1024 --ranges 8 --breakdown ${BENCH_FLAGS:-} --stream bh --producers 8 --duration "$DURATION" --rate $RATE > "$OUT/half.json"
c1=$(cpu); for p in ${CP[*]:-}; do wait $p; done
python3 - "$OUT/half.json" "$TAG" $((c1-c0)) <<'PY'
import json,sys
r=json.load(sys.stdin if False else open(sys.argv[1])); l=r["latency_ms"]
ticks=int(sys.argv[3]); n=r["records_per_sec"]*10
print("%s half: %.0f rec/s p50 %.1f p99 %.1f max %.1f ms; node cpu %.2fs = %.1f us/rec" % (sys.argv[2], r["records_per_sec"], l["p50"], l["p99"], l["max"], ticks/100, ticks*1e4/n))
for s in r.get("breakdown",[]) or r.get("stages",[]):
  print("  %-14s mean %7.2f p50 %7.2f p90 %7.2f p99 %7.2f max %7.2f" % (s["stage"], s["mean"], s["p50"], s["p90"], s["p99"], s["max"]))
PY
cat "$OUT/clienttime"
