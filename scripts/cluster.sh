#!/usr/bin/env bash
# scripts/cluster.sh up [--fresh] | down | status
# scripts/cluster.sh pg-stop|pg-start   stop or start the lease store
# scripts/cluster.sh kill|pause|resume|start us|us-n2 ...
#                      SIGKILL, SIGSTOP, SIGCONT, or start again (same
#                      command line) a region's nodes or one node
#
# A local multi-region geolog cluster on loopback: regions us, eu and ap of
# three replicated nodes each (--fsync always), and one geolog-wan process
# carrying every cross-region link, so that traffic between regions pays an
# emulated WAN latency. Everything lives under run/cluster:
#
#   <region>-n<i>.log       each node's log        data/<region>-n<i>/  its data
#   wan.log                 the WAN emulator's log wan.addr             its control address
#   env                     GEOLOG_ADDR_US/EU/AP/ALL and GEOLOG_WAN_CONTROL, to source
#   pids/*.pid              one per process, removed by down
#
# Port plan (B = $GEOLOG_CLUSTER_PORT, default 7500; region index r: us 0,
# eu 1, ap 2; node i in 1..3):
#
#   node gRPC      B + 10r + i         us 7501-7503, eu 7511-7513, ap 7521-7523
#   node debug     B + 100 + 10r + i   /metrics and pprof (7601-7623)
#   WAN control    B + 99              (7599)
#   WAN link       B + 200 + 30f + 10t + i: from region f to node i of region t
#   lease link     B + 290 + r: from region r to the lease store
#
# Homing (default on; GEOLOG_CLUSTER_HOMING=off for static homes): the
# lease store is the project's private PostgreSQL (scripts/pg.sh), database
# geolog_cluster (wiped by up --fresh), reached by each region through its
# own WAN link "<region>->pg" (GEOLOG_WAN_LATENCY_PG, default 2ms), so
# cutting a region (POST /regions/us/cut) cuts it off from the lease store
# too. GEOLOG_LEASE_TTL (default 4s) and GEOLOG_LEASE_HEARTBEAT (default
# 1s) set the liveness lease. down stops PostgreSQL if up started it.
#
# TLS (default on; GEOLOG_CLUSTER_TLS=off runs every node with --insecure):
# up makes a development PKI under run/cluster/certs with scripts/pki.sh
# (kept across restarts, wiped by --fresh): ca/ (the CA and its key),
# <region>-n<i>/ (each node's ca.crt, node.crt, node.key, for 127.0.0.1
# and localhost) and client/ (principal "operator"); every node serves and
# dials with its own, and the env file exports GEOLOG_CERTS_DIR=.../client
# so that bin/geolog, and whatever sources it, dials with a client
# certificate. The lease store is reached with sslmode=verify-full.
#
# Encryption at rest (default on; ATREST=off, or GEOLOG_CLUSTER_ATREST=off,
# runs the nodes without it): each node runs with --kek-file, a KEK file of
# its own under run/cluster/keks/<region>-n<i>.json (mode 0600, outside its
# data directory; made by geolog keys add-kek, kept across restarts, wiped
# by --fresh), so every segment and the catalogue are sealed on disk. A
# data directory written with encryption on refuses to start without its
# KEK: switch ATREST with up --fresh.
#
# GEOLOGD_FLAGS adds flags to every node's command line (an A/B:
# GEOLOGD_FLAGS="--log-zero-ahead-bytes -1" make up).
#
# A node reaches another region only through the WAN: its --region-addrs
# list that region's nodes at the listen addresses of the links from its own
# region. Clients do not: every leader and home hint names a node's
# advertised address (geologd --advertise-addr, here its listen address),
# so a producer redirected to another region's node dials it directly,
# without the emulated latency. One-way latency per pair of regions (both
# directions):
#
#   us-eu 40ms, us-ap 75ms, eu-ap 60ms, jitter 3ms
#
# Override with GEOLOG_WAN_LATENCY (every pair, e.g. 50ms),
# GEOLOG_WAN_LATENCY_US_EU / _US_AP / _EU_AP (one pair; these win) and
# GEOLOG_WAN_JITTER. GEOLOG_CLUSTER_LOG_LEVEL sets the nodes' log level
# (default info); GEOLOG_CLUSTER_STOP_TIMEOUT the seconds down waits after
# SIGTERM before SIGKILL (default 15). GEOLOG_CLUSTER_NODES sets the nodes
# per region (default 3; 1 gives three one-node regions, for measuring
# replication without three Raft groups per range competing for the CPU);
# GEOLOG_CLUSTER_GOMAXPROCS each node's GOMAXPROCS (default 1).
#
# up keeps the data of an earlier run (a restart); up --fresh wipes it first.
# up refuses while any process of the cluster runs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${GEOLOG_CLUSTER_BIN:-$ROOT/bin} # GEOLOG_CLUSTER_BIN=dir: another build (an A/B; down needs it too)
DIR=$ROOT/run/cluster
PIDS=$DIR/pids
BASE=${GEOLOG_CLUSTER_PORT:-7500}
REGIONS=(us eu ap)
NODES=($(seq 1 "${GEOLOG_CLUSTER_NODES:-3}")) # nodes per region
# Nine nodes share this machine's cores: each runs its Go scheduler on one
# (GOMAXPROCS=1), as it would on its own small machine, instead of nine
# runtimes each spreading GC and goroutines over every core (measured: lag
# p99 at 5k records/s 500 → 180 ms to eu). GEOLOG_CLUSTER_GOMAXPROCS
# overrides.
NODE_PROCS=${GEOLOG_CLUSTER_GOMAXPROCS:-1}
LOG_LEVEL=${GEOLOG_CLUSTER_LOG_LEVEL:-info}
STOP_TIMEOUT=${GEOLOG_CLUSTER_STOP_TIMEOUT:-15}
JITTER=${GEOLOG_WAN_JITTER:-3ms}
HOMING=${GEOLOG_CLUSTER_HOMING:-on}
LEASE_TTL=${GEOLOG_LEASE_TTL:-4s}
LEASE_HEARTBEAT=${GEOLOG_LEASE_HEARTBEAT:-1s}
PG_LATENCY=${GEOLOG_WAN_LATENCY_PG:-2ms}
TLS=${GEOLOG_CLUSTER_TLS:-on}
ATREST=${GEOLOG_CLUSTER_ATREST:-${ATREST:-on}}
[[ $ATREST == on || $ATREST == off ]] || { echo "cluster: ATREST=$ATREST: want on or off" >&2; exit 2; }
CERTS=$DIR/certs
KEKS=$DIR/keks
[[ $TLS == on ]] && export GEOLOG_CERTS_DIR=$CERTS/client # for answers and the env file

die() { echo "cluster: $*" >&2; exit 1; }

[[ $BASE =~ ^[0-9]+$ ]] && (( BASE >= 1024 && BASE + 300 <= 65535 )) ||
	die "GEOLOG_CLUSTER_PORT=$BASE: want a port in [1024, 65235]"

node_port()  { echo $(( BASE + 10 * $1 + $2 )); }          # region index, node
debug_port() { echo $(( BASE + 100 + 10 * $1 + $2 )); }
link_port()  { echo $(( BASE + 200 + 30 * $1 + 10 * $2 + $3 )); } # from, to, node
WAN_CONTROL=127.0.0.1:$(( BASE + 99 ))

# latency A B prints the one-way latency between regions A and B.
latency() {
	local pair def
	case "$1-$2" in
		us-eu|eu-us) pair=US_EU; def=40ms ;;
		us-ap|ap-us) pair=US_AP; def=75ms ;;
		eu-ap|ap-eu) pair=EU_AP; def=60ms ;;
		*) die "no latency for $1-$2" ;;
	esac
	local var=GEOLOG_WAN_LATENCY_$pair
	echo "${!var:-${GEOLOG_WAN_LATENCY:-$def}}"
}

region_addrs() { # region index: its nodes' direct addresses, comma-separated
	local r=$1 out=() i
	for i in "${NODES[@]}"; do out+=("127.0.0.1:$(node_port "$r" "$i")"); done
	local IFS=,; echo "${out[*]}"
}

wan_addrs() { # from index, to index: the to-region's nodes as the from-region reaches them
	local f=$1 t=$2 out=() i
	for i in "${NODES[@]}"; do out+=("127.0.0.1:$(link_port "$f" "$t" "$i")"); done
	local IFS=,; echo "${out[*]}"
}

# alive PIDFILE: the process in PIDFILE runs and is one of ours (a pid
# reused by another program does not count).
alive() {
	local pid
	pid=$(cat "$1" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -e "$BIN/geologd" -e "$BIN/geolog-wan"
}

running_pidfiles() {
	local f
	for f in "$PIDS"/*.pid; do
		[[ -e $f ]] || continue
		if alive "$f"; then echo "$f"; fi
	done
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# answers ADDR: the node at ADDR serves the API.
answers() { "$BIN/geolog" --addr "$1" --retries 0 --timeout 2s streams list >/dev/null 2>&1; }

# start NAME CMD...: run CMD in its own session (so that a Ctrl-C in the
# terminal that ran up, or ran the demo, does not reach it), log to
# NAME.log, record its pid.
start() {
	local name=$1; shift
	# The command line is kept, so that kill/start can bring a node back.
	mkdir -p "$DIR/cmd"
	printf '%q ' "$@" >"$DIR/cmd/$name.cmd"
	setsid "$@" >>"$DIR/$name.log" 2>&1 </dev/null &
	echo $! >"$PIDS/$name.pid"
}

# kill_nodes SIGNAL NAME...: signal nodes of the running cluster (KILL
# removes their pid files; STOP/CONT pause and resume them).
kill_nodes() {
	local sig=$1 name; shift
	local pids=()
	for name in "$@"; do
		[[ -f $PIDS/$name.pid ]] || { echo "cluster: $name is not running" >&2; continue; }
		pids+=("$(cat "$PIDS/$name.pid")")
	done
	(( ${#pids[@]} )) || return 0
	kill -"$sig" "${pids[@]}" 2>/dev/null || true # all at once: a region fails together
	if [[ $sig == KILL ]]; then
		for name in "$@"; do
			[[ -f $PIDS/$name.pid ]] || continue
			while kill -0 "$(cat "$PIDS/$name.pid")" 2>/dev/null; do sleep 0.02; done
			rm -f "$PIDS/$name.pid"
		done
	fi
}

# start_nodes NAME...: start stopped nodes again with their command lines.
start_nodes() {
	local name
	for name in "$@"; do
		[[ -f $DIR/cmd/$name.cmd ]] || die "no command line kept for $name (was the cluster up?)"
		if [[ -f $PIDS/$name.pid ]] && alive "$PIDS/$name.pid"; then continue; fi
		local -a argv
		eval "argv=($(cat "$DIR/cmd/$name.cmd"))"
		GOMAXPROCS=$NODE_PROCS start "$name" "${argv[@]}"
	done
}

# nodes_of TARGET: the node names of a region ("us") or one node ("us-n2").
nodes_of() {
	local t=$1 i
	if [[ $t == *-n* ]]; then echo "$t"; return; fi
	for i in "${NODES[@]}"; do echo "$t-n$i"; done
}

stop_all() {
	local files=() f pid deadline
	mapfile -t files < <(running_pidfiles)
	# Nodes first (their graceful shutdown hands leadership over and may
	# still talk across regions), the WAN last.
	local nodes=() wan=()
	for f in "${files[@]}"; do
		if [[ $(basename "$f") == wan.pid ]]; then wan+=("$f"); else nodes+=("$f"); fi
	done
	for group in nodes wan; do
		local -n list=$group
		(( ${#list[@]} )) || continue
		for f in "${list[@]}"; do kill -TERM "$(cat "$f")" 2>/dev/null || true; done
		deadline=$(( SECONDS + STOP_TIMEOUT ))
		for f in "${list[@]}"; do
			while alive "$f" && (( SECONDS < deadline )); do sleep 0.1; done
			if alive "$f"; then
				pid=$(cat "$f")
				echo "cluster: $(basename "$f" .pid) (pid $pid) still running after ${STOP_TIMEOUT}s: SIGKILL" >&2
				kill -KILL "$pid" 2>/dev/null || true
				while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
			fi
		done
		unset -n list
	done
	rm -f "$PIDS"/*.pid "$DIR/env" "$DIR/wan.addr"
	rmdir "$PIDS" 2>/dev/null || true
	if [[ -f $DIR/pg.started ]]; then
		scripts/pg.sh stop || true
		rm -f "$DIR/pg.started"
	fi
	echo "cluster: stopped ${#files[@]} processes (data and logs kept in run/cluster)"
}

up() {
	local fresh=false
	[[ ${1:-} == --fresh ]] && fresh=true
	[[ -x $BIN/geologd && -x $BIN/geolog && -x $BIN/geolog-wan ]] || die "no binaries in bin/: run make build (make up does)"
	local running
	running=$(running_pidfiles)
	if [[ -n $running ]]; then
		echo "cluster: already running ($(echo "$running" | xargs -n1 basename | sed 's/\.pid$//' | xargs)); 'make down' (scripts/cluster.sh down) stops it" >&2
		exit 1
	fi
	rm -f "$PIDS"/*.pid "$DIR/env" "$DIR/wan.addr" # stale, from a process that died
	if $fresh; then rm -rf "$DIR"; fi
	mkdir -p "$DIR/data" "$PIDS"

	# Every port must be free: a node that cannot listen would only show up
	# as a timeout below.
	local r t i p busy=()
	for r in 0 1 2; do for i in "${NODES[@]}"; do
		for p in $(node_port $r $i) $(debug_port $r $i); do port_busy "$p" && busy+=("$p"); done
		for t in 0 1 2; do (( t == r )) || { p=$(link_port $r $t $i); port_busy "$p" && busy+=("$p"); }; done
	done; done
	port_busy $(( BASE + 99 )) && busy+=($(( BASE + 99 )))
	if [[ $HOMING == on ]]; then for r in 0 1 2; do port_busy $(( BASE + 290 + r )) && busy+=($(( BASE + 290 + r ))); done; fi
	(( ${#busy[@]} == 0 )) || die "ports in use: ${busy[*]} (another cluster? set GEOLOG_CLUSTER_PORT to move the port plan)"

	if [[ $TLS == on ]]; then
		GEOLOG=$BIN/geolog scripts/pki.sh "$CERTS" operator "${REGIONS[@]/%/=${#NODES[@]}}"
	fi
	local links=()
	for r in 0 1 2; do for t in 0 1 2; do
		(( r == t )) && continue
		local lat; lat=$(latency "${REGIONS[r]}" "${REGIONS[t]}")
		for i in "${NODES[@]}"; do
			links+=(--link "${REGIONS[r]}->${REGIONS[t]}.n$i,127.0.0.1:$(link_port $r $t $i),127.0.0.1:$(node_port $t $i),$lat,$JITTER")
		done
	done; done
	local lease_url=""
	if [[ $HOMING == on ]]; then
		if ! scripts/pg.sh status >/dev/null 2>&1; then
			scripts/pg.sh start >/dev/null || die "could not start PostgreSQL for the lease store (scripts/pg.sh start)"
			touch "$DIR/pg.started"
		fi
		local db_url pg_port
		if $fresh; then db_url=$(scripts/pg.sh db geolog_cluster --fresh); else db_url=$(scripts/pg.sh db geolog_cluster); fi
		pg_port=$(echo "$db_url" | sed -E 's#.*@[^:]+:([0-9]+)/.*#\1#')
		for r in 0 1 2; do
			links+=(--link "${REGIONS[r]}->pg,127.0.0.1:$(( BASE + 290 + r )),127.0.0.1:$pg_port,$PG_LATENCY,0ms")
		done
		lease_url=${db_url/:$pg_port\//:PORT/}
	fi
	echo "cluster: starting geolog-wan (${#links[@]} flags: $(( ${#links[@]} / 2 )) links, control $WAN_CONTROL; us-eu $(latency us eu), us-ap $(latency us ap), eu-ap $(latency eu ap), jitter $JITTER)"
	start wan "$BIN/geolog-wan" --control "$WAN_CONTROL" --seed 1 "${links[@]}"
	local deadline=$(( SECONDS + 10 ))
	until curl -fsS "http://$WAN_CONTROL/healthz" >/dev/null 2>&1; do
		alive "$PIDS/wan.pid" || { tail -20 "$DIR/wan.log" >&2; stop_all >/dev/null; die "geolog-wan exited (run/cluster/wan.log)"; }
		(( SECONDS < deadline )) || { stop_all >/dev/null; die "geolog-wan control did not answer in 10s"; }
		sleep 0.1
	done
	echo "$WAN_CONTROL" >"$DIR/wan.addr"

	for r in 0 1 2; do
		local reg=${REGIONS[r]} peers=() remote=()
		for i in "${NODES[@]}"; do peers+=("$i=127.0.0.1:$(node_port $r $i)"); done
		for t in 0 1 2; do (( t == r )) || remote+=(--region-addrs "${REGIONS[t]}=$(wan_addrs $r $t)"); done
		local homing=()
		if [[ -n $lease_url ]]; then
			homing=(--lease-store "${lease_url/:PORT\//:$(( BASE + 290 + r ))/}" --lease-ttl "$LEASE_TTL" --lease-heartbeat "$LEASE_HEARTBEAT")
		fi
		for i in "${NODES[@]}"; do
			local name=$reg-n$i security=(--insecure)
			[[ $TLS == on ]] && security=(--certs-dir "$CERTS/$name" --superusers operator)
			if [[ $ATREST == on ]]; then
				# The node's own KEK, outside its data directory; kept across
				# restarts (its keyring is wrapped under it).
				if [[ ! -f $KEKS/$name.json ]]; then
					mkdir -p "$KEKS" && chmod 700 "$KEKS"
					"$BIN/geolog" keys add-kek --kek-file "$KEKS/$name.json" >/dev/null || die "could not make the KEK file of $name"
				fi
				security+=(--kek-file "$KEKS/$name.json")
			fi
			GOMAXPROCS=$NODE_PROCS start "$name" "$BIN/geologd" --data-dir "$DIR/data/$name" --listen "127.0.0.1:$(node_port $r $i)" \
				--region "$reg" --node-id "$i" --peers "$(IFS=,; echo "${peers[*]}")" "${remote[@]}" "${homing[@]}" "${security[@]}" \
				--fsync always --debug-addr "127.0.0.1:$(debug_port $r $i)" --log-level "$LOG_LEVEL" ${GEOLOGD_FLAGS:-}
		done
	done
	echo "cluster: started $(( 3 * ${#NODES[@]} )) nodes ($([[ $TLS == on ]] && echo "TLS, certificates in run/cluster/certs" || echo "INSECURE: no TLS"); $([[ $ATREST == on ]] && echo "encryption at rest, KEKs in run/cluster/keks" || echo "no encryption at rest")); waiting until each answers"
	deadline=$(( SECONDS + ${GEOLOG_CLUSTER_START_TIMEOUT:-60} ))
	for r in 0 1 2; do for i in "${NODES[@]}"; do
		local name=${REGIONS[r]}-n$i addr=127.0.0.1:$(node_port $r $i)
		until answers "$addr"; do
			if ! alive "$PIDS/$name.pid"; then
				tail -20 "$DIR/$name.log" >&2; stop_all >/dev/null; die "$name exited while starting (run/cluster/$name.log)"
			fi
			if (( SECONDS >= deadline )); then
				stop_all >/dev/null; die "$name at $addr did not answer in time (run/cluster/$name.log)"
			fi
			sleep 0.2
		done
	done; done

	{
		echo "# written by scripts/cluster.sh up; source it: . run/cluster/env"
		for r in 0 1 2; do
			echo "export GEOLOG_ADDR_${REGIONS[r]^^}=$(region_addrs $r)"
		done
		echo "export GEOLOG_ADDR_ALL=$(region_addrs 0),$(region_addrs 1),$(region_addrs 2)"
		echo "export GEOLOG_WAN_CONTROL=$WAN_CONTROL"
		echo "export GEOLOG_CLUSTER_REGIONS=\"${REGIONS[*]}\""
		if [[ $TLS == on ]]; then echo "export GEOLOG_CERTS_DIR=$CERTS/client"; else echo "unset GEOLOG_CERTS_DIR"; fi
		[[ -z $lease_url ]] || echo "export GEOLOG_LEASE_STORE=${lease_url/:PORT\//:$(scripts/pg.sh url | sed -E 's#.*@[^:]+:([0-9]+)/.*#\1#')/}"
	} >"$DIR/env.tmp"
	mv "$DIR/env.tmp" "$DIR/env"
	echo "cluster: up. Regions (nodes answer on these addresses; logs in run/cluster/<region>-n<i>.log):"
	for r in 0 1 2; do echo "  ${REGIONS[r]}  $(region_addrs $r)"; done
	echo "  WAN control http://$WAN_CONTROL (curl it: /links, POST /regions/eu/cut, POST /heal)"
	echo "Use it:  . run/cluster/env; GEOLOG_ADDR=\$GEOLOG_ADDR_EU bin/geolog streams list"
	echo "Stop it: make down (scripts/cluster.sh down)"
}

status() {
	local quiet=false
	[[ ${1:-} == -q ]] && quiet=true
	say() { $quiet || echo "$@"; }
	if [[ -z $(running_pidfiles) ]]; then
		say "cluster: not running"
		return 3
	fi
	local bad=0 r i
	if alive "$PIDS/wan.pid" && curl -fsS "http://$WAN_CONTROL/healthz" >/dev/null 2>&1; then
		local n
		n=$(curl -fsS "http://$WAN_CONTROL/links" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["links"]))')
		say "wan    pid $(cat "$PIDS/wan.pid")  control http://$WAN_CONTROL  $n links"
	else
		say "wan    DOWN"; bad=1
	fi
	for r in 0 1 2; do for i in "${NODES[@]}"; do
		local name=${REGIONS[r]}-n$i addr=127.0.0.1:$(node_port $r $i)
		if ! alive "$PIDS/$name.pid"; then
			say "$name  DOWN (no process)"; bad=1
		elif answers "$addr"; then
			say "$name  pid $(cat "$PIDS/$name.pid")  $addr  ok"
		else
			say "$name  pid $(cat "$PIDS/$name.pid")  $addr  NOT ANSWERING"; bad=1
		fi
	done; done
	return $bad
}

case "${1:-}" in
	up) shift; up "$@" ;;
	down) stop_all ;;
	kill) shift; for t in "$@"; do kill_nodes KILL $(nodes_of "$t"); done ;;
	pause) shift; for t in "$@"; do kill_nodes STOP $(nodes_of "$t"); done ;;
	resume) shift; for t in "$@"; do kill_nodes CONT $(nodes_of "$t"); done ;;
	start) shift; for t in "$@"; do start_nodes $(nodes_of "$t"); done ;;
	pg-stop) scripts/pg.sh stop ;;           # a lease-store outage
	pg-start) scripts/pg.sh start >/dev/null ;;
	status) shift; status "$@" ;;
	*) echo "usage: scripts/cluster.sh up [--fresh] | down | status [-q] | kill|pause|resume|start REGION|NODE..." >&2; exit 2 ;;
esac
