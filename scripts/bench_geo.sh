#!/usr/bin/env bash
# make bench-geo: issue-4 figures on the local 3-region cluster (make up):
#   1. the home region's full-speed throughput for a stream homed in us;
#   2. replication lag seen by readers in eu and ap (receipt time minus the
#      home's append time, every record) while us produces at half that;
#   3. a cut: ap's WAN links black-holed for CUT (default 30s) while us keeps
#      producing, then healed; the catch-up rate is the backlog over the
#      time ap's mirrors took to reach the home's tails.
# 1 KiB records, fsync on (the cluster's setting). Prints one summary.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
DURATION=${DURATION:-20s}
CUT=${CUT:-30}
RANGES=${RANGES:-8}
if [ ! -f run/cluster/env ]; then
	echo "bench-geo: the local cluster is not up (run: make up)" >&2
	exit 2
fi
. run/cluster/env
STREAM=lag$(date +%s)
geolog() { "$BIN/geolog" "$@"; }

echo "== stream $STREAM: $RANGES ranges homed in us, mirrored in eu and ap"
geolog --addr "$GEOLOG_ADDR_US" streams create "$STREAM" --ranges "$RANGES" --regions us,eu,ap --home us >/dev/null
for i in $(seq 1 100); do
	geolog --addr "$GEOLOG_ADDR_AP" streams describe "$STREAM" >/dev/null 2>&1 && break
	sleep 0.2
done
geolog --addr "$GEOLOG_ADDR_US" bench --stream "$STREAM" --producers 1 --count 2000 >/dev/null

echo "== 1. full speed in us (8 producers, $DURATION)"
geolog --addr "$GEOLOG_ADDR_US" bench --stream "$STREAM" --producers 8 --duration "$DURATION" --json >run/cluster/bench-full.json
MAX=$(sed -n 's/.*"records_per_second":\([0-9.]*\).*/\1/p' run/cluster/bench-full.json | cut -d. -f1)
HALF=$((MAX / 2))
echo "full speed: $MAX records/s"

echo "== 2. replication lag at half that ($HALF records/s), readers in eu and ap"
# Let the mirrors drain the full-speed backlog first.
for i in $(seq 1 600); do
	behind=$(geolog --addr "$GEOLOG_ADDR_ALL" ranges "$STREAM" --json 2>/dev/null | grep -o '"offset_lag":[0-9]*' | grep -vc '"offset_lag":0$' || true)
	[ "$behind" = 0 ] && break
	sleep 0.5
done
LAGDUR=${DURATION%s}
geolog --addr "$GEOLOG_ADDR_EU" lag "$STREAM" --duration "$((LAGDUR + 2))s" --json >run/cluster/lag-eu.json &
EU=$!
geolog --addr "$GEOLOG_ADDR_AP" lag "$STREAM" --duration "$((LAGDUR + 2))s" --json >run/cluster/lag-ap.json &
AP=$!
sleep 1
geolog --addr "$GEOLOG_ADDR_US" bench --stream "$STREAM" --producers 8 --duration "$DURATION" --rate "$HALF" --json >run/cluster/bench-half.json
wait $EU $AP
echo "produce at $HALF/s in us: $(sed -n 's/.*"p50_ms":\([0-9.]*\).*"p99_ms":\([0-9.]*\).*/ack p50 \1 ms p99 \2 ms/p' run/cluster/bench-half.json)"
for r in eu ap; do
	echo "lag in $r: $(cat run/cluster/lag-$r.json)"
done

echo "== 3. ap cut off for ${CUT}s while us produces at $HALF/s"
geolog --addr "$GEOLOG_ADDR_US" bench --stream "$STREAM" --producers 8 --duration "$((CUT + 10))s" --rate "$HALF" >/dev/null &
PROD=$!
sleep 5
curl -sf -X POST "http://$GEOLOG_WAN_CONTROL/regions/ap/cut?mode=blackhole" >/dev/null
sleep "$CUT"
geolog --addr "$GEOLOG_ADDR_ALL" ranges "$STREAM" >run/cluster/ranges-cut.txt 2>/dev/null || true
curl -sf -X POST "http://$GEOLOG_WAN_CONTROL/regions/ap/heal" >/dev/null
HEAL=$(date +%s.%N)
wait $PROD
# Catch-up: until every ap mirror has the home's tail as of the heal... the
# producer ran on for a few seconds after it, so wait for ap to reach the
# tail the home has now (production has stopped).
for i in $(seq 1 1200); do
	behind=$(geolog --addr "$GEOLOG_ADDR_ALL" ranges "$STREAM" --json 2>/dev/null | grep -o '"offset_lag":[0-9]*' | grep -vc '"offset_lag":0$' || true)
	[ "$behind" = 0 ] && break
	sleep 0.25
done
DONE=$(date +%s.%N)
echo "while cut (ranges as seen at the end of the cut):"
cat run/cluster/ranges-cut.txt
BACKLOG=$(awk -v r="$HALF" -v c="$CUT" 'BEGIN { printf "%d", r * c }')
awk -v b="$BACKLOG" -v h="$HEAL" -v d="$DONE" 'BEGIN { t = d - h; printf "catch-up: about %d records behind after the cut; caught up %.1f s after the heal (with 5 s more production in that time): %.0f records/s\n", b, t, (b + 0) / t }'
geolog --addr "$GEOLOG_ADDR_ALL" ranges "$STREAM"
