#!/usr/bin/env bash
# make bench-geo: issue-4 figures on the local 3-region cluster (make up):
#   1. the home region's full-speed throughput for a stream homed in us;
#   2. replication lag seen by readers in eu and ap (receipt time minus the
#      home's append time, every record; and, as from_home, receipt time
#      minus a reader's in us: the replication hop alone) while us produces
#      at half that;
#   2b. with RATES="1000 5000 ...", the same at each of those rates;
#   3. a cut: ap's WAN links black-holed for CUT (default 30s) while us keeps
#      producing, then healed; the catch-up rate is the backlog over the
#      time ap's mirrors took to reach the home's tails.
# 1 KiB records, fsync on (the cluster's setting). The stream keeps 128 MiB per
# range (retention), so repeated runs do not fill the disk; its mirrors hold
# that retention back however far behind (--mirror-hold-bytes -1), so that a
# long CUT measures the catch-up rather than the hold bound
# (docs/operator-guide.md, "A mirror region behind the home's log start").
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
# total_lag [REGION]: the records the mirrors (of REGION, default all) still
# lack, summed over the ranges, from `geolog ranges --json`.
total_lag() {
	local pat='"offset_lag":[0-9]*'
	[ -n "${1:-}" ] && pat="\"$1\":{\"applied_end_offset\":[0-9]*,\"offset_lag\":[0-9]*"
	geolog --addr "$GEOLOG_ADDR_ALL" ranges "$STREAM" --json 2>/dev/null | grep -o "$pat" | sed 's/.*://' |
		awk '{ s += $1 } END { print s + 0 }'
}

echo "== stream $STREAM: $RANGES ranges homed in us, mirrored in eu and ap"
geolog --addr "$GEOLOG_ADDR_US" streams create "$STREAM" --ranges "$RANGES" --regions us,eu,ap --home us --retention-bytes $((128 << 20)) --mirror-hold-bytes -1 >/dev/null
for i in $(seq 1 100); do
	geolog --addr "$GEOLOG_ADDR_AP" streams describe "$STREAM" >/dev/null 2>&1 && break
	sleep 0.2
done
geolog --addr "$GEOLOG_ADDR_US" bench --stream "$STREAM" --producers 1 --count 2000 >/dev/null

echo "== 1. full speed in us (8 producers, $DURATION)"
geolog --addr "$GEOLOG_ADDR_US" bench --stream "$STREAM" --producers 8 --duration "$DURATION" --json >run/cluster/bench-full.json
MAX=$(grep -o '"records_per_sec":[0-9]*' run/cluster/bench-full.json | cut -d: -f2)
HALF=$((MAX / 2))
echo "full speed: $MAX records/s"

echo "== 2. replication lag at half that ($HALF records/s), readers in eu and ap"
# Let the mirrors drain the full-speed backlog first.
for i in $(seq 1 600); do
	[ "$(total_lag)" = 0 ] && break
	sleep 0.5
done
LAGDUR=${DURATION%s}
geolog --addr "$GEOLOG_ADDR_EU" lag "$STREAM" --duration "$((LAGDUR + 2))s" --home-addr "$GEOLOG_ADDR_US" --json >run/cluster/lag-eu.json &
EU=$!
geolog --addr "$GEOLOG_ADDR_AP" lag "$STREAM" --duration "$((LAGDUR + 2))s" --home-addr "$GEOLOG_ADDR_US" --json >run/cluster/lag-ap.json &
AP=$!
sleep 1
geolog --addr "$GEOLOG_ADDR_US" bench --stream "$STREAM" --producers 8 --duration "$DURATION" --rate "$HALF" --json >run/cluster/bench-half.json
wait $EU $AP
echo "produce at $HALF/s in us: $(grep -o '"records_per_sec":[0-9.]*\|"latency_ms":{[^}]*}' run/cluster/bench-half.json | tr '\n' ' ')"
for r in eu ap; do
	echo "lag in $r: $(cat run/cluster/lag-$r.json)"
done

# lag_at RATE TAG: produce at RATE in us for DURATION while readers in eu and
# ap measure; prints the ack latency and both regions' lag.
lag_at() {
	geolog --addr "$GEOLOG_ADDR_EU" lag "$STREAM" --duration "$((LAGDUR + 2))s" --home-addr "$GEOLOG_ADDR_US" --json >run/cluster/lag-eu-$2.json &
	local eu=$!
	geolog --addr "$GEOLOG_ADDR_AP" lag "$STREAM" --duration "$((LAGDUR + 2))s" --home-addr "$GEOLOG_ADDR_US" --json >run/cluster/lag-ap-$2.json &
	local ap=$!
	sleep 1
	geolog --addr "$GEOLOG_ADDR_US" bench --stream "$STREAM" --producers 8 --duration "$DURATION" --rate "$1" --json >run/cluster/bench-$2.json
	wait $eu $ap
	echo "produce at $1/s in us: $(grep -o '"records_per_sec":[0-9.]*\|"latency_ms":{[^}]*}' run/cluster/bench-$2.json | tr '\n' ' ')"
	for r in eu ap; do
		echo "lag in $r: $(cat run/cluster/lag-$r-$2.json)"
	done
}

# RATES (e.g. "1000 5000 10000"): the lag at fixed rates too.
for rate in ${RATES:-}; do
	echo "== 2b. replication lag at $rate records/s"
	lag_at "$rate" "r$rate"
done

echo "== 3. ap cut off for ${CUT}s while us produces at $HALF/s"
geolog --addr "$GEOLOG_ADDR_US" bench --stream "$STREAM" --producers 8 --duration "$((CUT + 5))s" --rate "$HALF" >/dev/null &
PROD=$!
sleep 5
curl -sf -X POST "http://$GEOLOG_WAN_CONTROL/regions/ap/cut?mode=blackhole" >/dev/null
wait $PROD
# Production stopped with the cut's end: what ap lacks now is the backlog.
geolog --addr "$GEOLOG_ADDR_ALL" ranges "$STREAM" >run/cluster/ranges-cut.txt 2>/dev/null || true
BACKLOG=$(total_lag ap)
curl -sf -X POST "http://$GEOLOG_WAN_CONTROL/regions/ap/heal" >/dev/null
HEAL=$(date +%s.%N)
for i in $(seq 1 2400); do
	[ "$(total_lag ap)" = 0 ] && break
	sleep 0.1
done
DONE=$(date +%s.%N)
echo "at the end of the cut:"
cat run/cluster/ranges-cut.txt
awk -v b="$BACKLOG" -v h="$HEAL" -v d="$DONE" 'BEGIN { t = d - h; printf "catch-up: ap lacked %d records when the links healed; caught up in %.2f s: %.0f records/s\n", b, t, b / t }'
geolog --addr "$GEOLOG_ADDR_ALL" ranges "$STREAM"
