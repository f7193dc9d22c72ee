#!/usr/bin/env bash
# terraform/local/scripts/proc.sh: the processes of terraform/local's cluster.
# The module's local-exec provisioners call it; every command is idempotent,
# so an apply that follows a failed or repeated one finds things as they are.
#
#   proc.sh init DIR
#       create DIR, DIR/data and DIR/pids
#   proc.sh start [--if-flag FLAG VALUE]... DIR NAME PORT TIMEOUT -- ARGV...
#       run ARGV in its own session (log DIR/NAME.log, pid file
#       DIR/pids/NAME.pid) and wait up to TIMEOUT seconds until 127.0.0.1:PORT
#       accepts connections. --if-flag appends "FLAG VALUE" to ARGV only when
#       the program's --help lists FLAG (so a node gets --lease-store only
#       from a geologd that has it). A NAME already running is left alone.
#       On failure the process is stopped again and the log's tail printed.
#   proc.sh stop DIR NAME TIMEOUT [PATH...]
#       SIGTERM, SIGKILL after TIMEOUT seconds; remove the pid file, the
#       log and every PATH (the node's data)
#   proc.sh ready TIMEOUT GEOLOG ENVFILE ADDR...
#       wait until `geolog streams list` answers on every ADDR, then write
#       ENVFILE from $GEOLOG_TF_ENV (atomically)
#   proc.sh sweep DIR TIMEOUT PG_SCRIPT
#       destroy's last step: stop whatever pid file is left (a process whose
#       own resource failed to create: Terraform runs no destroy provisioner
#       of a tainted resource), stop PostgreSQL in DIR/pg, remove what the
#       module put in DIR (certs/ included) and DIR itself when it is then empty
#
# A pid file holds "PID STARTTIME" (field 22 of /proc/PID/stat), so a pid
# reused by an unrelated program is never signalled.
set -euo pipefail

die() { echo "proc.sh: $*" >&2; exit 1; }

starttime() { # PID: its start time in clock ticks since boot
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) } # comm may hold spaces and parentheses
	# shellcheck disable=SC2086
	set -- $stat
	echo "${20}"
}

# alive PIDFILE: the process recorded in PIDFILE still runs.
alive() {
	local pid st now
	read -r pid st 2>/dev/null <"$1" || return 1
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	now=$(starttime "$pid") || return 1
	[[ $now == "$st" ]]
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# stop_pidfile PIDFILE TIMEOUT: SIGTERM, wait, SIGKILL; remove PIDFILE.
stop_pidfile() {
	local f=$1 timeout=$2 pid deadline
	if alive "$f"; then
		read -r pid _ <"$f"
		kill -TERM "$pid" 2>/dev/null || true
		deadline=$((SECONDS + timeout))
		while alive "$f" && ((SECONDS < deadline)); do sleep 0.1; done
		if alive "$f"; then
			echo "proc.sh: $(basename "$f" .pid) (pid $pid) still running after ${timeout}s: SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
			while alive "$f"; do sleep 0.05; done
		fi
		echo "proc.sh: stopped $(basename "$f" .pid) (pid $pid)"
	fi
	rm -f "$f"
}

cmd_init() {
	mkdir -p "$1/data" "$1/pids"
}

cmd_start() {
	local flags=()
	while [[ ${1:-} == --if-flag ]]; do
		flags+=("$2" "$3")
		shift 3
	done
	(($# >= 5)) && [[ $5 == -- ]] || die "usage: start [--if-flag FLAG VALUE]... DIR NAME PORT TIMEOUT -- ARGV..."
	local dir=$1 name=$2 port=$3 timeout=$4
	shift 5
	local argv=("$@") pidfile=$dir/pids/$name.pid log=$dir/$name.log
	mkdir -p "$dir/pids"
	if alive "$pidfile"; then
		echo "proc.sh: $name already running (pid $(cut -d' ' -f1 "$pidfile"))"
		return 0
	fi
	rm -f "$pidfile"

	# The program is ARGV's first word after "env" and its NAME=VALUE words.
	local i=0
	[[ ${argv[0]} == env ]] && i=1
	while [[ ${argv[i]} == *=* ]]; do i=$((i + 1)); done
	local prog=${argv[i]}
	[[ -x $prog ]] || die "$name: $prog is not an executable (run make build)"
	if ((${#flags[@]})); then
		local help
		help=$("$prog" --help 2>&1 || true) # Go's flag package exits 2 after --help
		for ((i = 0; i < ${#flags[@]}; i += 2)); do
			# Go's flag package lists "-flag"; accept "--flag" too.
			if grep -qE -- "(^|[[:space:]])--?${flags[i]#--}([[:space:]=]|$)" <<<"$help"; then
				argv+=("${flags[i]}" "${flags[i + 1]}")
			else
				echo "proc.sh: $name: $prog has no ${flags[i]}: not passed"
			fi
		done
	fi

	# A process that cannot listen would only show up as a timeout.
	port_busy "$port" && die "$name: port $port is in use (another cluster? set base_port)"
	# setsid: a Ctrl-C in the terminal that ran terraform must not reach the
	# cluster. Standard streams go to the log, never to terraform's pipes,
	# or local-exec would wait for this process to exit.
	setsid "${argv[@]}" >>"$log" 2>&1 </dev/null &
	local pid=$!
	local st
	st=$(starttime "$pid") || { tail -n 20 "$log" >&2; die "$name exited at once ($log)"; }
	echo "$pid $st" >"$pidfile"
	local deadline=$((SECONDS + timeout))
	until port_busy "$port"; do
		if ! alive "$pidfile"; then
			rm -f "$pidfile"
			tail -n 20 "$log" >&2
			die "$name exited while starting ($log)"
		fi
		if ((SECONDS >= deadline)); then
			stop_pidfile "$pidfile" 5
			die "$name did not listen on 127.0.0.1:$port in ${timeout}s ($log)"
		fi
		sleep 0.1
	done
	echo "proc.sh: started $name (pid $pid, 127.0.0.1:$port)"
}

cmd_stop() {
	local dir=$1 name=$2 timeout=$3
	shift 3
	stop_pidfile "$dir/pids/$name.pid" "$timeout"
	rm -rf "$dir/$name.log" "$@"
}

cmd_ready() {
	local timeout=$1 geolog=$2 envfile=$3
	shift 3
	[[ -x $geolog ]] || die "$geolog is not an executable (run make build)"
	local deadline=$((SECONDS + timeout)) addr
	for addr in "$@"; do
		until "$geolog" --addr "$addr" --retries 0 --timeout 2s streams list >/dev/null 2>&1; do
			((SECONDS < deadline)) || die "the node at $addr did not answer in ${timeout}s"
			sleep 0.2
		done
	done
	echo "proc.sh: $# nodes answer"
	printf '%s\n' "${GEOLOG_TF_ENV:?}" >"$envfile.tmp"
	mv "$envfile.tmp" "$envfile"
}

cmd_sweep() {
	local dir=$1 timeout=$2 pg=$3 f
	[[ -d $dir ]] || return 0
	# Nodes first (their shutdown may still talk across regions), the WAN last.
	for f in "$dir"/pids/*.pid; do
		[[ -e $f && $(basename "$f") != wan.pid ]] && stop_pidfile "$f" "$timeout"
	done
	[[ -e $dir/pids/wan.pid ]] && stop_pidfile "$dir/pids/wan.pid" "$timeout"
	if [[ -d $dir/pg ]]; then
		GEOLOG_PG_DIR=$dir/pg "$pg" stop
	fi
	rm -rf "$dir/pids" "$dir/data" "$dir/pg" "$dir/certs" "$dir/env" "$dir/env.tmp" "$dir"/*.log
	rmdir "$dir" 2>/dev/null || echo "proc.sh: $dir not removed: it holds files the module did not put there"
}

cmd=${1:-}
shift || true
case $cmd in
init) cmd_init "$@" ;;
start) cmd_start "$@" ;;
stop) cmd_stop "$@" ;;
ready) cmd_ready "$@" ;;
sweep) cmd_sweep "$@" ;;
*) die "usage: proc.sh init|start|stop|ready|sweep ... (see the comment at the top)" ;;
esac
