#!/usr/bin/env bash
# make bench-capacity: the measurements behind docs/capacity.md.
#
# On the local 3x3 cluster (started here if it is not running, and then
# stopped again), for a stream homed in us with 0, 1 and 2 mirror regions
# (MIRRORS, default "0 1 2") and at each of RATES records/s of 1 KiB
# (default "2000 5000"; PRODUCERS producers, DURATION each; 4,096 distinct
# random values, so batches do not compress): the CPU
# (cores), disk writes (MB/s), network sent between a region's nodes
# (MB/s) and memory (RSS) of every region's nodes, the WAN bytes between
# regions, and the same with no load at all (IDLE_SECONDS). The idle cost
# is subtracted, so the table prints what 1,000 records/s cost each
# region. Rows go to run/capacity/rows.jsonl.
#
# Nine nodes, the WAN emulator and the producers share this machine's
# cores and disk, so CPU figures include the contention of that sharing;
# docs/capacity.md says how to read them.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
OUT=$PWD/run/capacity
RATES=${RATES:-2000 5000}
MIRRORS=${MIRRORS:-0 1 2}
DURATION=${DURATION:-20}
PRODUCERS=${PRODUCERS:-4}
RANGES=${RANGES:-8}
IDLE_SECONDS=${IDLE_SECONDS:-15}
SAMPLE="python3 $PWD/scripts/capacity_sample.py"

STARTED=
if [ ! -f run/cluster/env ]; then
	./scripts/cluster.sh up --fresh
	STARTED=1
fi
cleanup() { [ -z "$STARTED" ] || ./scripts/cluster.sh down; }
trap cleanup EXIT
. run/cluster/env
PIDS=$PWD/run/cluster/pids
rm -rf "$OUT"; mkdir -p "$OUT"
geolog() { "$BIN/geolog" "$@"; }

# Every region answers before anything is measured.
for addr in "$GEOLOG_ADDR_US" "$GEOLOG_ADDR_EU" "$GEOLOG_ADDR_AP"; do
	for i in $(seq 1 150); do geolog --addr "$addr" streams list >/dev/null 2>&1 && break; sleep 0.2; done
done

echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== idle: ${IDLE_SECONDS}s with no load"
sleep 5
$SAMPLE snap "$PIDS" "$GEOLOG_WAN_CONTROL" >"$OUT/idle0.json"
sleep "$IDLE_SECONDS"
$SAMPLE snap "$PIDS" "$GEOLOG_WAN_CONTROL" >"$OUT/idle1.json"
$SAMPLE diff "$OUT/idle0.json" "$OUT/idle1.json" "$IDLE_SECONDS" 0 >"$OUT/idle.json"
python3 -c '
import json,sys
r=json.load(open(sys.argv[1]))
for reg,v in sorted(r["regions"].items()):
    print("idle %-4s %d processes: %.3f cores, %.2f MB/s disk, %.2f MB/s net, RSS max %.0f MiB" % (reg, v["procs"], v["cpu_cores"], v["disk_mb_s"], v["net_mb_s"], v["rss_mib_max"]))
print("idle WAN %.3f MB/s" % r["wan_mb_s"])' "$OUT/idle.json"

for m in $MIRRORS; do
	case $m in
	0) regions=us ;;
	1) regions=us,eu ;;
	2) regions=us,eu,ap ;;
	*) echo "bench-capacity: MIRRORS holds $m: want 0, 1 or 2" >&2; exit 2 ;;
	esac
	for rate in $RATES; do
		stream=cap${m}r${rate}t$(date +%s)
		echo "== $m mirror(s) ($regions), $rate records/s for ${DURATION}s: stream $stream"
		geolog --addr "$GEOLOG_ADDR_US" streams create "$stream" --ranges "$RANGES" --regions "$regions" --home us \
			--retention-bytes $((128 << 20)) >/dev/null
		for i in $(seq 1 40); do
			geolog --addr "$GEOLOG_ADDR_US" bench --stream "$stream" --producers 1 --count 2000 >/dev/null 2>&1 && break
			sleep 0.5
		done
		sync; sleep 3
		$SAMPLE snap "$PIDS" "$GEOLOG_WAN_CONTROL" >"$OUT/before.json"
		start=$(date +%s.%N)
		geolog --addr "$GEOLOG_ADDR_US" bench --stream "$stream" --ranges "$RANGES" --producers "$PRODUCERS" \
			--record-bytes 1024 --values 4096 --rate "$rate" --duration "${DURATION}s" --json >"$OUT/bench.json"
		$SAMPLE snap "$PIDS" "$GEOLOG_WAN_CONTROL" >"$OUT/after.json"
		end=$(date +%s.%N)
		secs=$(python3 -c "print($end - $start)")
		rps=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["records_per_sec"])' "$OUT/bench.json")
		$SAMPLE diff "$OUT/before.json" "$OUT/after.json" "$secs" "$rps" "$OUT/idle.json" |
			python3 -c '
import json,sys
row=json.load(sys.stdin); b=json.load(open(sys.argv[1]))
row["mirrors"]=int(sys.argv[2]); row["target"]=float(sys.argv[3]); row["p99_ms"]=b["latency_ms"]["p99"]
row["load"]=open("/proc/loadavg").read().split()[0]
print(json.dumps(row))' "$OUT/bench.json" "$m" "$rate" >>"$OUT/rows.jsonl"
		tail -1 "$OUT/rows.jsonl" | python3 -c '
import json,sys
r=json.load(sys.stdin)
for reg,v in sorted(r["regions"].items()):
    print("  %-4s %.3f cores, %.2f MB/s disk, %.2f MB/s net, RSS max %.0f MiB" % (reg, v["cpu_cores"], v["disk_mb_s"], v["net_mb_s"], v["rss_mib_max"]))
print("  WAN %.2f MB/s; achieved %.0f records/s, p99 %.1f ms, load %s" % (r["wan_mb_s"], r["records_per_sec"], r["p99_ms"], r["load"]))'
	done
done

echo "== per 1,000 records/s of 1 KiB, idle subtracted (region: cores / disk MB/s / net MB/s)"
$SAMPLE table "$OUT/rows.jsonl"
