# Shared by bench.sh and bench_region.sh: run NAME FLAGS... runs geolog bench
# with 1 KiB records over $RANGES ranges, appends its JSON result to
# $RUNDIR/results.jsonl and prints one summary line; settle lets the page
# cache drain between runs (full-speed runs leave gigabytes for writeback).
run() {
	local name=$1; shift
	echo "== $name: geolog bench $*" >&2
	"$BIN/geolog" bench --json --record-bytes 1024 --ranges "$RANGES" "$@" | tee -a "$RUNDIR/results.jsonl" >/dev/null
	tail -1 "$RUNDIR/results.jsonl" | python3 -c '
import json,sys
r=json.load(sys.stdin); l=r["latency_ms"]
print("%-28s %9.0f rec/s %8.1f MB/s  p50 %7.3f ms  p99 %7.3f ms  p99.9 %7.3f ms  max %7.3f ms  errors %d" % (sys.argv[1], r["records_per_sec"], r["mb_per_sec"], l["p50"], l["p99"], l["p999"], l["max"], r["errors"]))' "$name"
}

settle() { sync; sleep 3; }

# last_rate prints the records/s of the last run, as an integer.
last_rate() {
	tail -1 "$RUNDIR/results.jsonl" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["records_per_sec"]))'
}
