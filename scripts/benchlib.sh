# Shared by bench.sh, bench_region.sh and bench_idle.sh.
#
# Transport security: TLS=on (the default) makes a development PKI under
# $RUNDIR/certs with bin/geolog certs and runs the nodes with TLS and
# geolog bench with a client certificate; TLS=off runs the nodes with
# --insecure. Compare the two: TLS=off make bench-region.
TLS=${TLS:-on}
case $TLS in on | off) ;; *) echo "TLS=$TLS: want on or off" >&2; exit 2 ;; esac

# Encryption at rest: ATREST=on runs the nodes with --kek-file (a KEK file
# made under $RUNDIR), so every segment is sealed; ATREST=off (the default)
# leaves them in the clear. Compare: ATREST=on make bench-region.
ATREST=${ATREST:-off}
case $ATREST in on | off) ;; *) echo "ATREST=$ATREST: want on or off" >&2; exit 2 ;; esac

# node_atrest prints the nodes' encryption-at-rest flags, making the KEK
# file the first time.
node_atrest() {
	[ "$ATREST" = on ] || return 0
	[ -f "$RUNDIR/kek.json" ] || "$BIN/geolog" keys add-kek --kek-file "$RUNDIR/kek.json" >/dev/null
	echo "--kek-file $RUNDIR/kek.json"
}

# pki_setup REGION N: the CA, the folders of nodes 1..N of REGION, and the
# client's (scripts/pki.sh); exports GEOLOG_CERTS_DIR for every geolog
# command that follows.
pki_setup() {
	[ "$TLS" = on ] || return 0
	GEOLOG=$BIN/geolog "$(dirname "${BASH_SOURCE[0]}")/pki.sh" "$RUNDIR/certs" bench "$1=$2"
	export GEOLOG_CERTS_DIR=$RUNDIR/certs/client
	NODE_REGION=$1
}

# node_security I prints node I's transport security flags.
node_security() {
	if [ "$TLS" = on ]; then echo "--certs-dir $RUNDIR/certs/$NODE_REGION-n$1 --superusers bench"; else echo "--insecure"; fi
}

# run NAME FLAGS... runs geolog bench
# with 1 KiB records over $RANGES ranges, appends its JSON result to
# $RUNDIR/results.jsonl and prints one summary line (with the load
# average when the run started: figures from a busy machine say so); settle lets the page
# cache drain between runs (full-speed runs leave gigabytes for writeback).
run() {
	local name=$1; shift
	local load; load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
	echo "== $name (TLS $TLS, at rest $ATREST): geolog bench $*" >&2
	# shellcheck disable=SC2086
	"$BIN/geolog" bench --json --record-bytes 1024 --ranges "$RANGES" ${BENCH_FLAGS:-} "$@" | tee -a "$RUNDIR/results.jsonl" >/dev/null
	tail -1 "$RUNDIR/results.jsonl" | python3 -c '
import json,sys
r=json.load(sys.stdin); l=r["latency_ms"]
print("%-28s TLS %-3s at-rest %-3s %9.0f rec/s %8.1f MB/s  p50 %7.3f ms  p99 %7.3f ms  p99.9 %7.3f ms  max %7.3f ms  errors %d  load %s" % (sys.argv[1], sys.argv[2], sys.argv[3], r["records_per_sec"], r["mb_per_sec"], l["p50"], l["p99"], l["p999"], l["max"], r["errors"], sys.argv[4]))' "$name" "$TLS" "$ATREST" "$load"
}

settle() { sync; sleep 3; }

# last_rate prints the records/s of the last run, as an integer.
last_rate() {
	tail -1 "$RUNDIR/results.jsonl" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["records_per_sec"]))'
}
