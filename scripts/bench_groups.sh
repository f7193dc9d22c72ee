#!/usr/bin/env bash
# make bench-groups: issue-16 consumer figures. Starts a 3-node replicated
# region (fsync on, quorum acks) under run/bench-groups and measures, from
# this machine: cursor commits per second (geolog bench cursors: one
# commit request carries every range's position of one cursor; with the
# nodes' CPU time per position, as the machine may be shared), and the
# time for a group of 8 members on 64 ranges to consume every range again
# after a graceful leave, a kill (session timeout 3 s), and a join
# (geolog bench rebalance). TLS=off runs the nodes with --insecure.
# RANGES=n (64) is the positions per commit request, CURSORS=n (1024) the
# cursor names; REBALANCE=off skips the rebalance rounds; PROFILE=on takes
# a CPU profile of every node during the commits (run/bench-groups/n*.cpu,
# nodes on --debug-addr BASE+11..13) and prints the nodes' heap
# allocations per position; GEOLOGD_FLAGS adds flags to every
# node's command line. The fdatasync floor printed first is
# this disk's one-page write+fdatasync time (a node's Raft log pays one per
# append, and a commit is acked after the quorum's).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${GEOLOG_BENCH_BIN:-$PWD/bin}   # GEOLOG_BENCH_BIN=dir: other binaries (before/after runs)
RUNDIR=$PWD/run/bench-groups
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-5}
BASE=${GEOLOG_BENCH_PORT:-7480}

rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"
. "$(dirname "$0")/benchlib.sh"   # TLS=on (default) or off, as make bench-region
RANGES=${RANGES:-64}
CURSORS=${CURSORS:-1024}
PROFILE=${PROFILE:-off}
REBALANCE=${REBALANCE:-on}
DEBUG=$PROFILE start_region3 --fsync always --log-level warn

# cpu_seconds: user+system CPU seconds of the three nodes so far.
cpu_seconds() {
	local total=0 f
	for p in "${PIDS[@]}"; do
		read -r -a f < "/proc/$p/stat"
		total=$(( total + f[13] + f[14] ))
	done
	echo "$total $(getconf CLK_TCK)" | awk '{ printf "%.2f", $1 / $2 }'
}

# The floor: one 4 KiB write and fdatasync at a time, on the nodes' disk.
python3 - "$RUNDIR" <<'PY'
import os, sys, time
path = os.path.join(sys.argv[1], "fsync-floor"); fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
buf, n, t = b"x" * 4096, 200, []
for i in range(n):
    s = time.perf_counter(); os.pwrite(fd, buf, i * 4096); os.fdatasync(fd); t.append(time.perf_counter() - s)
os.close(fd); os.unlink(path); t.sort()
print(f"fdatasync floor: p50 {t[n//2]*1e3:.2f} ms, p99 {t[n*99//100]*1e3:.2f} ms per 4 KiB write+fdatasync ({1/t[n//2]:.0f} syncs/s one at a time)")
PY

CONCURRENCY=${CONCURRENCY:-64}
echo "== cursor commits ($RANGES positions per commit, $CURSORS cursors, $CONCURRENCY in flight, $DURATION)"
for i in $(seq 1 20); do
	"$BIN/geolog" bench cursors --ranges "$RANGES" --duration 2s >/dev/null 2>&1 && break   # warm up: streams, cursor stream, leaders
	sleep 0.5
done
go build -o "$RUNDIR/cursorframes" ./scripts/cursorframes
# Where the coordinators are: the leaders of the cursor ranges (a node
# leading most of them takes most of the commits). Leaders that elections
# gathered on one node go back to their preferred nodes within
# --leader-balance-interval (10 s): wait up to 30 s for them to be spread
# (no node leads more than one range more than another).
cursor_leaders() {
	"$BIN/geolog" streams describe _cursors --json 2>/dev/null | python3 -c '
import collections, json, sys
def leaders(x):
    if isinstance(x, dict):
        if x.get("leader"): yield x["leader"]
        for v in x.values(): yield from leaders(v)
    elif isinstance(x, list):
        for v in x: yield from leaders(v)
c = collections.Counter(leaders(json.load(sys.stdin)))
spread = max(c.values()) - min(c.values()) if len(c) == 3 else 99
print(spread, "cursor range leaders:", ", ".join(f"{a} {n}" for a, n in sorted(c.items())))' || echo "99 cursor range leaders: unknown"
}
for i in $(seq 1 60); do
	leaders=$(cursor_leaders)
	[ "${leaders%% *}" -le 1 ] && break
	sleep 0.5
done
echo "${leaders#* }"
# memstats: the three nodes' heap allocations so far, "objects bytes"
# (runtime.MemStats Mallocs and TotalAlloc, from the debug address).
memstats() {
	[ "$PROFILE" = on ] || { echo "0 0"; return; }
	for i in 1 2 3; do curl -s "http://127.0.0.1:$((BASE+10+i))/debug/pprof/heap?debug=1"; done |
		awk '/^# Mallocs = /{m+=$4} /^# TotalAlloc = /{b+=$4} END{printf "%d %d", m, b}'
}
frames_before=$("$RUNDIR/cursorframes" "$RUNDIR/n1")   # records and appends of node 1's _cursors copy
mem_before=$(memstats)
before=$(cpu_seconds)
PROFS=()
if [ "$PROFILE" = on ]; then
	secs=$(( ${DURATION%s} - 2 ))
	for i in 1 2 3; do
		(sleep 1; curl -s -o "$RUNDIR/n$i.cpu" "http://127.0.0.1:$((BASE+10+i))/debug/pprof/profile?seconds=$secs") &
		PROFS+=($!)
	done
fi
TIMEFORMAT='%U %S'   # the bench client's user and system CPU seconds (it shares the cores)
{ time "$BIN/geolog" bench cursors --ranges "$RANGES" --cursors "$CURSORS" --concurrency "$CONCURRENCY" --duration "$DURATION" --json >"$RUNDIR/cursors.json" ; } 2>"$RUNDIR/client.cpu"
after=$(cpu_seconds)
mem_after=$(memstats)
sleep 0.5; frames_after=$("$RUNDIR/cursorframes" "$RUNDIR/n1")
[ ${#PROFS[@]} -eq 0 ] || wait "${PROFS[@]}"
python3 - "$RUNDIR/cursors.json" "$before" "$after" "$(tail -1 "$RUNDIR/client.cpu")" "$frames_before" "$frames_after" "$mem_before" "$mem_after" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); cpu = float(sys.argv[3]) - float(sys.argv[2])
client = sum(float(x) for x in sys.argv[4].split())
print(f"positions   {r['positions']} committed ({r['errors']} failed requests) in {r['elapsed_seconds']:.1f}s")
print(f"throughput  {r['positions_per_sec']:.0f} positions/s")
l = r['request_latency_ms']
print(f"latency ms  p50 {l['p50']:.1f}  p99 {l['p99']:.1f}  max {l['max']:.1f} (one commit request of {r['ranges']} positions)")
per = cpu / max(1, r['positions'])
print(f"node CPU    {cpu:.1f} s for the 3 nodes: {per*1e6:.1f} us per position, {per*1e6:.0f} ms per 1,000 positions (2 cores to themselves: about {2/per:.0f} positions/s)")
cper = client / max(1, r['positions'])
fb, fa = [int(x) for x in sys.argv[5].split()], [int(x) for x in sys.argv[6].split()]
recs, apps = fa[0] - fb[0], fa[1] - fb[1]
print(f"appends     {apps} of the cursor ranges (node 1's copy): {recs / max(1, apps):.1f} positions per append, {recs / max(1, apps) / max(1, r['ranges']):.1f} requests")
mb, ma = [int(x) for x in sys.argv[7].split()], [int(x) for x in sys.argv[8].split()]
if ma[0]:
    n = max(1, r['positions'])
    print(f"node allocs {(ma[0] - mb[0]) / n:.1f} objects, {(ma[1] - mb[1]) / n:.0f} bytes per position (the 3 nodes' heap allocations; PROFILE=on)")
print(f"client CPU  {client:.1f} s for the bench client: {cper*1e6:.1f} ms per 1,000 positions (nodes and client on 2 cores: about {2/(per+cper):.0f} positions/s)")
PY
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$REBALANCE" = on ] || exit 0
echo
echo "== rebalance (64 ranges, 8 members, session 3s, $ROUNDS rounds)"
"$BIN/geolog" bench rebalance --ranges 64 --members 8 --rounds "$ROUNDS" --session 3s
