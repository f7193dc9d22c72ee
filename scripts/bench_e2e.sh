#!/usr/bin/env bash
# make bench-e2e: issue 16's end-to-end figure on the local 3-region
# cluster (make up): a stream homed in us, mirrored in eu and ap;
#   1. the home region's full-speed throughput (8 producers, DURATION);
#   2. at half of it, producers in us and a consumer-group member in eu
#      (CONSUMER=ap for ap): the latency from each record's produce call to
#      its delivery to the member, p50/p99 (geolog bench e2e).
# 1 KiB records, fsync on (the cluster's setting).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
DURATION=${DURATION:-20s}
RANGES=${RANGES:-8}
CONSUMER=${CONSUMER:-eu}
if [ ! -f run/cluster/env ]; then
	echo "bench-e2e: the local cluster is not up (run: make up)" >&2
	exit 2
fi
. run/cluster/env
STREAM=e2e$(date +%s)
geolog() { "$BIN/geolog" "$@"; }
CONSUME_ADDR=$(eval echo "\$GEOLOG_ADDR_$(echo "$CONSUMER" | tr a-z A-Z)")

echo "== stream $STREAM: $RANGES ranges homed in us, mirrored in eu and ap"
geolog --addr "$GEOLOG_ADDR_US" streams create "$STREAM" --ranges "$RANGES" --regions us,eu,ap --home us --retention-bytes $((128 << 20)) >/dev/null
for i in $(seq 1 100); do
	geolog --addr "$CONSUME_ADDR" streams describe "$STREAM" >/dev/null 2>&1 && break
	sleep 0.2
done
geolog --addr "$GEOLOG_ADDR_US" bench --stream "$STREAM" --producers 1 --count 2000 >/dev/null

echo "== 1. full speed in us (8 producers, $DURATION)"
geolog --addr "$GEOLOG_ADDR_US" bench --stream "$STREAM" --producers 8 --duration "$DURATION" --json >run/cluster/e2e-full.json
MAX=$(grep -o '"records_per_sec":[0-9]*' run/cluster/e2e-full.json | cut -d: -f2)
HALF=$((MAX / 2))
echo "full speed: $MAX records/s"
# The consumer's region drains the full-speed backlog first.
for i in $(seq 1 600); do
	lag=$(geolog --addr "$GEOLOG_ADDR_ALL" ranges "$STREAM" --json 2>/dev/null | grep -o "\"$CONSUMER\":{\"applied_end_offset\":[0-9]*,\"offset_lag\":[0-9]*" | sed 's/.*://' | awk '{ s += $1 } END { print s + 0 }')
	[ "$lag" = 0 ] && break
	sleep 0.5
done

echo "== 2. end to end at $HALF records/s: produce in us, a group member in $CONSUMER"
echo "\$ geolog --addr \$GEOLOG_ADDR_US bench e2e --stream $STREAM --consume-addr \$GEOLOG_ADDR_${CONSUMER^^} --rate $HALF --duration $DURATION"
geolog --addr "$GEOLOG_ADDR_US" bench e2e --stream "$STREAM" --consume-addr "$CONSUME_ADDR" --rate "$HALF" --duration "$DURATION"
# RATES (e.g. "500 1000"): the same at fixed rates too.
for rate in ${RATES:-}; do
	echo "== 2b. end to end at $rate records/s"
	geolog --addr "$GEOLOG_ADDR_US" bench e2e --stream "$STREAM" --consume-addr "$CONSUME_ADDR" --rate "$rate" --duration "$DURATION"
done
