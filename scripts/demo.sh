#!/usr/bin/env bash
# scripts/demo.sh [multi|single]
#
# multi (make demo, the default): on the local multi-region cluster
# (scripts/cluster.sh; started if it is not running, and left running),
# create a stream `chat` in us, eu and ap with its ranges homed round robin
# (--home spread), produce from us and eu at once (a few chat lines, then
# geolog bench in both regions for 10 s), read everything in ap from ap's
# own copy with `geolog consume --follow`, print `geolog ranges` (each
# region's applied offset and lag) during and after the run, and check that
# what ap read, and ap's copy, equal every range's log in its home region.
# About 30 s. `make down` stops the cluster.
#
# single (make demo-single): the single-node demo: a geologd under
# run/demo, create, produce, consume, a short bench, a restart; stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

single() {
	local RUNDIR=$PWD/run/demo
	local ADDR=127.0.0.1:${GEOLOG_DEMO_PORT:-7471}
	export GEOLOG_ADDR=$ADDR
	rm -rf "$RUNDIR"; mkdir -p "$RUNDIR"

	say "a development PKI under run/demo/certs (scripts/pki.sh: geolog certs create-ca, create-node, create-client)"
	GEOLOG=$BIN/geolog scripts/pki.sh "$RUNDIR/certs" demo local=1
	ls "$RUNDIR/certs"/*
	export GEOLOG_CERTS_DIR=$RUNDIR/certs/client # every geolog command below dials with TLS as "demo"

	say "starting geologd on $ADDR with TLS (data in run/demo)"
	"$BIN/geologd" --data-dir "$RUNDIR/data" --listen "$ADDR" --log-level info --certs-dir "$RUNDIR/certs/local-n1" --superusers demo >"$RUNDIR/geologd.log" 2>&1 &
	NODE_PID=$!
	cleanup() { if kill -0 "$NODE_PID" 2>/dev/null; then kill -TERM "$NODE_PID"; wait "$NODE_PID" || true; fi; }
	trap cleanup EXIT
	for i in $(seq 1 100); do
		if "$BIN/geolog" streams list >/dev/null 2>&1; then break; fi
		if ! kill -0 "$NODE_PID" 2>/dev/null; then cat "$RUNDIR/geologd.log"; echo "geologd died"; exit 1; fi
		sleep 0.1
	done

	say "geolog streams create chat --ranges 4"
	"$BIN/geolog" streams create chat --ranges 4 --retention-age 168h
	"$BIN/geolog" streams list

	say "producing 20 chat messages keyed by room (per-key order = range order)"
	for i in $(seq 1 20); do
		room=room-$(( i % 5 ))
		printf '%s\t%s says hello #%d\n' "$room" "user-$(( i % 5 ))" "$i"
	done | "$BIN/geolog" produce chat --tab -v

	say "geolog streams describe chat"
	"$BIN/geolog" streams describe chat

	say "consuming everything from offset 0"
	"$BIN/geolog" consume chat --from-offset 0 --max 20

	say "bench: 2 producers, 1 KiB records, 3 s, fsync on"
	"$BIN/geolog" bench --stream bench --ranges 4 --producers 2 --record-bytes 1024 --duration 3s

	say "stopping geologd (SIGTERM: it syncs and acks what it has, then exits)"
	kill -TERM "$NODE_PID"; wait "$NODE_PID" || true
	say "restarting to show recovery: the log is still there"
	"$BIN/geologd" --data-dir "$RUNDIR/data" --listen "$ADDR" --certs-dir "$RUNDIR/certs/local-n1" --superusers demo >>"$RUNDIR/geologd.log" 2>&1 &
	NODE_PID=$!
	for i in $(seq 1 100); do "$BIN/geolog" streams list >/dev/null 2>&1 && break; sleep 0.1; done
	"$BIN/geolog" consume chat --from-offset 0 --max 3
	"$BIN/geolog" streams describe chat
	say "demo done; node log in run/demo/geologd.log"
}

# ranges_check MODE reads `geolog ranges --json` on stdin. MODE known: every
# range's home leader and every region's copy were reported; caught-up:
# also every copy holds the home's whole log. Exit 0 if so.
ranges_check() {
	python3 -c '
import json, sys
mode, rs = sys.argv[1], json.load(sys.stdin)
for r in rs:
    if r["tail_offset"] is None: sys.exit(1)
    for reg in r["regions"].values():
        if reg["applied_end_offset"] is None: sys.exit(1)
        if mode == "caught-up" and reg["applied_end_offset"] != r["tail_offset"]: sys.exit(1)
' "$1"
}

# wait_ranges MODE SECONDS polls `geolog ranges` until ranges_check MODE.
wait_ranges() {
	local deadline=$(( SECONDS + $2 ))
	until g --addr "$ALL" ranges "$STREAM" --json 2>/dev/null | ranges_check "$1"; do
		if (( SECONDS >= deadline )); then
			echo "demo: ranges not $1 after $2 s:" >&2
			g --addr "$ALL" ranges "$STREAM" >&2 || true
			exit 1
		fi
		sleep 0.3
	done
}

g() { "$BIN/geolog" --timeout 10s "$@"; }

# region_addr REGION prints the region's node addresses (from run/cluster/env).
region_addr() { local v=GEOLOG_ADDR_${1^^}; echo "${!v}"; }

multi() {
	local CL=scripts/cluster.sh DIR=$PWD/run/cluster rc=0
	say "local multi-region cluster: regions us, eu, ap of 3 nodes each, WAN between regions (scripts/cluster.sh)"
	"$CL" status -q || rc=$?
	case $rc in
		0) echo "using the cluster that is already running" ;;
		3) "$CL" up ;;
		*) echo "the cluster is only partly running: restarting it"; "$CL" down; "$CL" up ;;
	esac
	# shellcheck disable=SC1091
	. "$DIR/env"
	US=$GEOLOG_ADDR_US EU=$GEOLOG_ADDR_EU AP=$GEOLOG_ADDR_AP ALL=$GEOLOG_ADDR_ALL
	curl -fsS "http://$GEOLOG_WAN_CONTROL/links" | python3 -c '
import json, sys
seen = {}
for l in json.load(sys.stdin)["links"]:
    seen.setdefault(tuple(sorted((l["from"], l["to"]))), (l["latency_ms"], l["jitter_ms"]))
print("WAN one-way latency: " + ", ".join("%s-%s %gms (+%gms jitter)" % (a, b, lat, jit) for (a, b), (lat, jit) in sorted(seen.items())))'

	# A rerun on a running cluster: the stream of an earlier run is still
	# there (streams are not deleted), so take a fresh name.
	STREAM=chat
	local existing n=2
	existing=$(g --addr "$US" streams list | awk 'NR > 1 { print $1 }')
	while grep -qx "$STREAM" <<<"$existing"; do STREAM=chat-$n; n=$(( n + 1 )); done

	say "geolog streams create $STREAM --ranges 4 --regions us,eu,ap --home spread   (sent to us; propagated to eu and ap)"
	# Right after a start the regions' catalogue groups may still be
	# electing: CreateStream is not retried by the client (it could not tell
	# its own success from a clash), so retry here while the answer says it
	# was not applied. STREAM_EXISTS after such a retry means an earlier
	# attempt got through (and a repeat completes its propagation).
	local attempt created=false msg
	for attempt in $(seq 1 40); do
		if msg=$(g --addr "$US" streams create "$STREAM" --ranges 4 --regions us,eu,ap --home spread 2>&1); then
			echo "$msg"; created=true; break
		fi
		if (( attempt > 1 )) && grep -q STREAM_EXISTS <<<"$msg"; then
			echo "created stream $STREAM (an earlier attempt got through: $msg)"; created=true; break
		fi
		grep -q -e NOT_LEADER -e UNAVAILABLE -e TIMEOUT <<<"$msg" || { echo "$msg" >&2; exit 1; }
		echo "  not yet: $msg"
		sleep 0.5
	done
	$created || { echo "demo: could not create $STREAM: $msg" >&2; exit 1; }
	wait_ranges known 30
	g --addr "$ALL" ranges "$STREAM"

	# The reader: ap's nodes only, following every range from offset 0.
	mkdir -p "$DIR/demo"
	local out=$DIR/demo/$STREAM
	# Started as a plain command (not through g) so that $! is geolog's own
	# pid: it stops cleanly on SIGINT.
	"$BIN/geolog" --addr "$AP" consume "$STREAM" --follow --json >"$out-ap.jsonl" 2>"$out-ap.err" &
	READER=$!
	trap 'kill -INT $READER 2>/dev/null || true' EXIT
	echo "reader: geolog consume $STREAM --follow --json on ap's nodes (pid $READER, output run/cluster/demo/$STREAM-ap.jsonl)"

	say "chat lines from us and from eu, keyed by room (one key, one range: per-key order = range order); RANGE OFFSET as acked"
	printf 'room-1\t[us] alice: morning from Virginia\nroom-2\t[us] bob: anyone up?\nroom-1\t[us] alice: standup in 5\n' >"$out-us.txt"
	printf 'room-1\t[eu] chloé: bonjour depuis Paris\nroom-3\t[eu] dieter: guten Abend\nroom-2\t[eu] eva: here!\n' >"$out-eu.txt"
	for reg in us eu; do
		g --addr "$(region_addr $reg)" produce "$STREAM" --tab -v <"$out-$reg.txt" 2>"$out-$reg.err" |
			paste - "$out-$reg.txt" | sed "s/^/  $reg producer: /" || { cat "$out-$reg.err" >&2; exit 1; }
	done

	say "producers in us and in eu at once: geolog bench, 10 s, 2 producers x 150 records/s each, 64 keys, 256-byte records"
	echo "(a producer writes every range; an append to a range homed in another region is redirected there"
	echo " (NOT_HOME) and pays the WAN round trip: us-eu 80 ms, us-ap 150 ms, eu-ap 120 ms)"
	"$BIN/geolog" --addr "$US" bench --stream "$STREAM" --producers 2 --rate 300 --duration 10s --keys 64 --record-bytes 256 >"$out-bench-us.txt" 2>/dev/null &
	local bench_us=$!
	"$BIN/geolog" --addr "$EU" bench --stream "$STREAM" --producers 2 --rate 300 --duration 10s --keys 64 --record-bytes 256 >"$out-bench-eu.txt" 2>/dev/null &
	local bench_eu=$!
	local t
	for t in 3 6 9; do
		sleep 3
		say "during the run (t = ${t} s): geolog ranges $STREAM, merged from all 9 nodes"
		g --addr "$ALL" ranges "$STREAM"
		printf 'ap reader so far: %d records\n' "$(wc -l <"$out-ap.jsonl")"
	done
	local failed=0
	wait "$bench_us" || failed=1
	wait "$bench_eu" || failed=1
	for reg in us eu; do
		say "bench in $reg"
		cat "$out-bench-$reg.txt"
	done
	(( failed == 0 )) || { echo "demo: a bench failed" >&2; exit 1; }

	say "after the run: every mirror catches up with its home"
	wait_ranges caught-up 30
	g --addr "$ALL" ranges "$STREAM"

	# The reader stops once it has every record (the sum of the tails).
	local total deadline=$(( SECONDS + 30 ))
	total=$(g --addr "$ALL" ranges "$STREAM" --json | python3 -c 'import json,sys; print(sum(r["tail_offset"] for r in json.load(sys.stdin)))')
	until (( $(wc -l <"$out-ap.jsonl") >= total )); do
		(( SECONDS < deadline )) || { echo "demo: ap's reader has $(wc -l <"$out-ap.jsonl") of $total records after 30 s" >&2; cat "$out-ap.err" >&2; exit 1; }
		sleep 0.2
	done
	kill -INT "$READER"
	deadline=$(( SECONDS + 10 ))
	while kill -0 "$READER" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.1; done
	kill -KILL "$READER" 2>/dev/null || true
	wait "$READER" 2>/dev/null || true
	trap - EXIT
	say "ap's reader (consume --follow on ap's nodes) received $(wc -l <"$out-ap.jsonl") records of $total"

	say "ap's copy equals the homes: each range read from its home region, from ap's copy, and as ap's reader got it"
	# Per range: the home region's log, ap's copy and what the reader got,
	# as JSON lines (offset, key, value, headers, append time, epoch) in
	# offset order, hashed. A follower of the region read from may trail
	# its leader by a moment: retry before calling it a difference.
	local homes r home ok=1 try hsum asum rsum hn an rn
	homes=$(g --addr "$ALL" ranges "$STREAM" --json | python3 -c 'import json,sys; print(" ".join(r["home_region"] for r in json.load(sys.stdin)))')
	printf '%-6s %-5s %8s %8s %8s  %-16s %-16s %-16s %s\n' RANGE HOME HOME-N AP-N READER-N HOME-SHA256 AP-SHA256 READER-SHA256 SAME
	r=0
	for home in $homes; do
		rsum=$(python3 -c '
import json, sys
r = int(sys.argv[2])
lines = [l for l in open(sys.argv[1]) if json.loads(l)["range"] == r]
lines.sort(key=lambda l: json.loads(l)["offset"])
sys.stdout.write("".join(lines))' "$out-ap.jsonl" "$r" | tee "$out-reader-r$r.jsonl" | sha256sum | cut -c1-16)
		rn=$(wc -l <"$out-reader-r$r.jsonl")
		for try in $(seq 1 20); do
			g --addr "$(region_addr "$home")" consume "$STREAM" --range "$r" --json >"$out-home-r$r.jsonl"
			g --addr "$AP" consume "$STREAM" --range "$r" --json >"$out-apcopy-r$r.jsonl"
			hsum=$(sha256sum <"$out-home-r$r.jsonl" | cut -c1-16); hn=$(wc -l <"$out-home-r$r.jsonl")
			asum=$(sha256sum <"$out-apcopy-r$r.jsonl" | cut -c1-16); an=$(wc -l <"$out-apcopy-r$r.jsonl")
			[[ $hsum == "$asum" && $hsum == "$rsum" ]] && break
			sleep 0.3
		done
		local same=yes
		[[ $hsum == "$asum" && $hsum == "$rsum" ]] || { same=NO; ok=0; }
		printf '%-6s %-5s %8d %8d %8d  %-16s %-16s %-16s %s\n' "$r" "$home" "$hn" "$an" "$rn" "$hsum" "$asum" "$rsum" "$same"
		r=$(( r + 1 ))
	done
	if (( ok == 0 )); then
		echo "demo: ap's copy differs from a home (files run/cluster/demo/$STREAM-*-r*.jsonl)" >&2
		exit 1
	fi
	say "demo: ap holds every range exactly as its home does, at the same offsets"
	if grep -q '^export GEOLOG_LEASE_STORE=' run/cluster/env; then
		say "planned rehome (homing on the lease store): every range of $STREAM moves to eu, then range 0 back to us"
		"$BIN/geolog" --addr "$GEOLOG_ADDR_EU" rehome "$STREAM" all eu
		"$BIN/geolog" --addr "$GEOLOG_ADDR_US" rehome "$STREAM" 0 us
		printf 'after-rehome\tstill in order\n' | "$BIN/geolog" --addr "$GEOLOG_ADDR_AP" produce "$STREAM" --tab -v
		"$BIN/geolog" --addr "$GEOLOG_ADDR_ALL" ranges "$STREAM"
	fi
	say "demo done"
	cat <<-EOF
	The cluster is still running. Try:
	  . run/cluster/env
	  bin/geolog --addr \$GEOLOG_ADDR_ALL ranges $STREAM
	  bin/geolog --addr \$GEOLOG_ADDR_AP consume $STREAM --range 0 --max 5
	  curl -X POST http://\$GEOLOG_WAN_CONTROL/regions/ap/cut     # then watch ap's lag grow; POST /heal
	  scripts/cluster.sh kill us    # a region failure: its ranges fail over (make drill measures it)
	Stop it with: make down   (scripts/cluster.sh down)
	EOF
}

case "${1:-multi}" in
	multi) multi ;;
	single) single ;;
	*) echo "usage: scripts/demo.sh [multi|single]" >&2; exit 2 ;;
esac
