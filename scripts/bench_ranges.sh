#!/usr/bin/env bash
# The cost of many idle ranges (issue 12 item 5): a 3-node region with a
# lease store (a private PostgreSQL, scripts/pg.sh) and RANGES ranges
# (default 1000; streams of at most 4,000 ranges each), no traffic. Prints, each with `uptime`
# beside it:
#
#   - creation: from the create request to every node's /readyz answering
#     200 (every range served, led and homed);
#   - per node, after SETTLE_SECONDS (default 15): RSS, goroutines, and
#     CPU over IDLE_SECONDS (default 30) as a share of one core (from
#     /proc/PID/stat), and the lease store's transactions per second over
#     the same window (pg_stat_database xact_commit + xact_rollback of the
#     nodes' database);
#   - start-up: the three nodes stopped (SIGTERM) and started again, from
#     their start to every /readyz answering 200; then RSS and idle CPU
#     once more.
#
# TLS is off (--insecure: /readyz and pprof are plain HTTP on the debug
# address); GEOLOGD_FLAGS adds flags to every node; GEOLOG_BENCH_BIN=dir
# runs other binaries (before/after runs). Ports: BASE+1..3 (nodes),
# BASE+11..13 (debug), BASE+50 (PostgreSQL); BASE is
# GEOLOG_BENCH_PORT, default 9600. Idle ranges hold no file descriptors
# (regionsvc LimitsConfig.FileDescriptorsMax bounds them node-wide);
# READY_SECONDS (default 600) bounds each wait for /readyz.
# PROFILE_DIR=dir keeps, at each idle point, every node's heap profile
# (heap-<label>-n<i>.pb.gz, for go tool pprof -sample_index=inuse_space
# or alloc_space) and its MemStats (memstats-<label>-n<i>.txt: HeapInuse,
# HeapIdle, HeapReleased beside the RSS; -gc- after a forced collection).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GEOLOG_BENCH_BIN:-$PWD/bin}
RUNDIR=$PWD/run/bench-ranges
RANGES=${RANGES:-1000}
SETTLE=${SETTLE_SECONDS:-15}
IDLE=${IDLE_SECONDS:-30}
READY=${READY_SECONDS:-600}
BASE=${GEOLOG_BENCH_PORT:-9600}
GEOLOGD_FLAGS=${GEOLOGD_FLAGS:-}
PEERS="1=127.0.0.1:$((BASE+1)),2=127.0.0.1:$((BASE+2)),3=127.0.0.1:$((BASE+3))"
export GEOLOG_ADDR="127.0.0.1:$((BASE+1)),127.0.0.1:$((BASE+2)),127.0.0.1:$((BASE+3))"
export GEOLOG_PG_DIR=$PWD/run/pg-bench-ranges GEOLOG_PG_PORT=$((BASE+50))
PGBIN=${GEOLOG_PG_BIN:-/usr/lib/postgresql/15/bin}
DB=geolog_ranges
STREAM_RANGES_MAX=4000
rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
scripts/pg.sh start >/dev/null
LEASE_URL=$(scripts/pg.sh db $DB --fresh)
PIDS=()
cleanup() {
	kill -TERM "${PIDS[@]}" 2>/dev/null || true
	wait "${PIDS[@]}" 2>/dev/null || true
	scripts/pg.sh stop >/dev/null 2>&1 || true
	rm -rf "$RUNDIR"
}
trap cleanup EXIT

start_nodes() {
	PIDS=()
	for i in 1 2 3; do
		# shellcheck disable=SC2086
		"$BIN/geologd" --data-dir "$RUNDIR/n$i" --listen "127.0.0.1:$((BASE+i))" --node-id $i --peers "$PEERS" \
			--insecure --log-level warn --lease-store "$LEASE_URL" --debug-addr "127.0.0.1:$((BASE+10+i))" \
			$GEOLOGD_FLAGS >>"$RUNDIR/n$i.log" 2>&1 &
		PIDS+=($!)
	done
}

# all_ready: every node's /readyz answers 200.
all_ready() {
	for i in 1 2 3; do
		curl -sf -o /dev/null "http://127.0.0.1:$((BASE+10+i))/readyz" || return 1
	done
}

# wait_ready LABEL T0: polls until all_ready, prints the seconds since T0.
wait_ready() {
	for _ in $(seq 1 $((READY * 5))); do
		if all_ready; then
			printf '%-34s %6.1f s    [%s]\n' "$1" "$(echo "$(date +%s.%N) - $2" | bc)" "$(uptime)"
			return 0
		fi
		sleep 0.2
	done
	echo "$1: not ready after $READY s" >&2
	exit 1
}

pg_xacts() {
	PGOPTIONS='-c client_min_messages=warning' "$PGBIN/psql" -h "$GEOLOG_PG_DIR/sock" -p "$GEOLOG_PG_PORT" -U postgres -d postgres -qAt \
		-c "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$DB'"
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# measure LABEL: RSS and goroutines per node, then CPU per node and
# lease-store transactions per second over IDLE seconds.
measure() {
	local hz t0 t1 x0 x1 i g
	hz=$(getconf CLK_TCK)
	declare -a c0
	for i in 0 1 2; do c0[i]=$(cpu_ticks "${PIDS[i]}"); done
	x0=$(pg_xacts)
	sleep "$IDLE"
	x1=$(pg_xacts)
	for i in 0 1 2; do
		t1=$(cpu_ticks "${PIDS[i]}")
		g=$(curl -s "http://127.0.0.1:$((BASE+11+i))/debug/pprof/goroutine?debug=1" | awk 'NR == 1 {print $NF}')
		printf '%s node %d: cpu %5.1f%% of a core over %ds, rss %4d MiB, goroutines %6s, open fds %5d    [%s]\n' "$1" $((i+1)) \
			"$(echo "100 * ($t1 - ${c0[i]}) / $hz / $IDLE" | bc -l)" "$IDLE" \
			"$(( $(awk '/VmRSS/ {print $2}' "/proc/${PIDS[i]}/status") / 1024 ))" "$g" \
			"$(find "/proc/${PIDS[i]}/fd" -mindepth 1 -maxdepth 1 | wc -l)" "$(uptime)"
	done
	[ -n "${PROFILE_DIR:-}" ] && profile "$1"
	printf '%s lease store: %.1f transactions/s over %ds    [%s]\n' "$1" "$(echo "($x1 - $x0) / $IDLE" | bc -l)" "$IDLE" "$(uptime)"
}

# profile LABEL: heap profiles and MemStats of every node into PROFILE_DIR.
profile() {
	local i tag
	tag=$(echo "$1" | tr ' ' '-')
	mkdir -p "$PROFILE_DIR"
	for i in 0 1 2; do
		{
			grep VmRSS "/proc/${PIDS[i]}/status"
			curl -s "http://127.0.0.1:$((BASE+11+i))/debug/pprof/heap?debug=1" | sed -n '/^# runtime.MemStats/,$p'
		} >"$PROFILE_DIR/memstats-$tag-n$((i+1)).txt"
		# gc=1: a collection first, so inuse is the live heap now.
		curl -s -o "$PROFILE_DIR/heap-$tag-n$((i+1)).pb.gz" "http://127.0.0.1:$((BASE+11+i))/debug/pprof/heap?gc=1"
		{
			grep VmRSS "/proc/${PIDS[i]}/status"
			curl -s "http://127.0.0.1:$((BASE+11+i))/debug/pprof/heap?debug=1" | sed -n '/^# runtime.MemStats/,$p'
		} >"$PROFILE_DIR/memstats-$tag-gc-n$((i+1)).txt"
	done
}

echo "$RANGES ranges, 3 nodes, GEOLOGD_FLAGS='$GEOLOGD_FLAGS', bin $BIN"
start_nodes
for _ in $(seq 1 300); do "$BIN/geolog" streams list >/dev/null 2>&1 && break; sleep 0.2; done
t0=$(date +%s.%N)
# A stream has at most 4,096 ranges: RANGES is spread over streams
# idle0, idle1, ... of at most STREAM_RANGES_MAX ranges each.
left=$RANGES s=0
while [ "$left" -gt 0 ]; do
	n=$(( left < STREAM_RANGES_MAX ? left : STREAM_RANGES_MAX ))
	for try in $(seq 1 60); do
		"$BIN/geolog" streams create "idle$s" --ranges "$n" --timeout 120s >/dev/null 2>"$RUNDIR/create.err" && break
		# A create whose answer was lost (a timeout) may have committed.
		"$BIN/geolog" streams list 2>/dev/null | grep -qw "idle$s" && break
		[ "$try" = 60 ] && { cat "$RUNDIR/create.err" >&2; exit 1; }
		sleep 0.5
	done
	left=$((left - n)) s=$((s + 1))
done
wait_ready "create to all ready:" "$t0"
sleep "$SETTLE"
measure "idle"
kill -TERM "${PIDS[@]}"
wait "${PIDS[@]}" 2>/dev/null || true
t0=$(date +%s.%N)
start_nodes
wait_ready "restart: start to all ready:" "$t0"
sleep "$SETTLE"
measure "after restart"
