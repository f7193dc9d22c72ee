# Shared by the benchmark scripts (bench*.sh).
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
# average when the run started: figures from a busy machine say so; and
# the machine's CPU during the run: busy, and steal, the share a VM's host
# took, which stalls every vCPU for the rest of its period); settle lets the page
# cache drain between runs (full-speed runs leave gigabytes for writeback).
run() {
	local name=$1; shift
	local load; load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
	echo "== $name (TLS $TLS, at rest $ATREST): geolog bench $*" >&2
	# shellcheck disable=SC2086
	"$BIN/geolog" bench --json --record-bytes 1024 --ranges "$RANGES" ${BENCH_FLAGS:-} "$@" | tee -a "$RUNDIR/results.jsonl" >/dev/null
	tail -1 "$RUNDIR/results.jsonl" | python3 -c '
import json,sys
r=json.load(sys.stdin); l=r["latency_ms"]; m=r.get("machine_cpu") or {}
print("%-28s TLS %-3s at-rest %-3s %9.0f rec/s %8.1f MB/s  p50 %7.3f ms  p99 %7.3f ms  p99.9 %7.3f ms  max %7.3f ms  errors %d  load %s  cpu busy %.0f%% steal %.1f%%" % (sys.argv[1], sys.argv[2], sys.argv[3], r["records_per_sec"], r["mb_per_sec"], l["p50"], l["p99"], l["p999"], l["max"], r["errors"], sys.argv[4], m.get("busy_pct", float("nan")), m.get("steal_pct", float("nan"))))' "$name" "$TLS" "$ATREST" "$load"
}

settle() { sync; sleep 3; }

# last_rate prints the records/s of the last run, as an integer.
last_rate() {
	tail -1 "$RUNDIR/results.jsonl" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["records_per_sec"]))'
}

# start_region3 FLAGS...: starts a 3-node region from $BIN on 127.0.0.1
# ports BASE+1..3, data in $RUNDIR/nI and logs in $RUNDIR/nI.log (or
# $LOGDIR/nI.log), each node with FLAGS, its transport security and
# at-rest flags and $GEOLOGD_FLAGS; DEBUG=on also gives node I
# --debug-addr 127.0.0.1:BASE+10+I. Exports GEOLOG_ADDR (and the client's
# certificates), fills PIDS, stops the nodes on exit (stop_region, plus
# $ON_EXIT if set) and returns once a node answers.
start_region3() {
	local peers="1=127.0.0.1:$((BASE+1)),2=127.0.0.1:$((BASE+2)),3=127.0.0.1:$((BASE+3))" i debug
	export GEOLOG_ADDR="127.0.0.1:$((BASE+1)),127.0.0.1:$((BASE+2)),127.0.0.1:$((BASE+3))"
	pki_setup local 3
	PIDS=()
	for i in 1 2 3; do
		debug=""
		[ "${DEBUG:-off}" = on ] && debug="--debug-addr 127.0.0.1:$((BASE+10+i))"
		# shellcheck disable=SC2046,SC2086
		"$BIN/geologd" --data-dir "$RUNDIR/n$i" --listen "127.0.0.1:$((BASE+i))" --node-id $i --peers "$peers" \
			"$@" $debug $(node_security $i) $(node_atrest) ${GEOLOGD_FLAGS:-} >"${LOGDIR:-$RUNDIR}/n$i.log" 2>&1 &
		PIDS+=($!)
	done
	trap 'stop_region; eval "${ON_EXIT:-}"' EXIT
	for i in $(seq 1 100); do "$BIN/geolog" streams list >/dev/null 2>&1 && break; sleep 0.1; done
}

# stop_region stops the nodes start_region3 started.
stop_region() {
	[ ${#PIDS[@]} -eq 0 ] && return 0
	kill -TERM "${PIDS[@]}" 2>/dev/null || true
	wait "${PIDS[@]}" 2>/dev/null || true
}

# warm_stream STREAM RANGES COUNT writes COUNT records to STREAM (made
# with RANGES ranges), retrying while a node that just started answers
# "catalogue catching up": a new stream's elections and the catalogue
# record (about a second) are not what a benchmark measures.
warm_stream() {
	local i
	for i in $(seq 1 20); do
		"$BIN/geolog" bench --stream "$1" --ranges "$2" --producers 1 --count "$3" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	echo "warm_stream $1: no node took $3 records in 20 tries" >&2
	return 1
}

# cpu_ticks prints the summed utime+stime (clock ticks) of the processes in PIDS.
cpu_ticks() {
	local t=0 p
	for p in "${PIDS[@]}"; do
		t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat")))
	done
	echo $t
}
