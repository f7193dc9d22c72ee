#!/usr/bin/env bash
# A private PostgreSQL 15 for geolog's lease store: tests, demo and clusters.
#
#   scripts/pg.sh start    start it (initdb on first use); idempotent; prints the URL
#   scripts/pg.sh stop     stop it (fast shutdown); fine when already stopped
#   scripts/pg.sh status   "running <url>" (exit 0) or "stopped" (exit 3)
#   scripts/pg.sh url      print the connection URL
#   scripts/pg.sh db NAME [--fresh]
#                          create database NAME if missing (drop it first
#                          with --fresh) and print its URL; the server must run
#
# Environment:
#   GEOLOG_PG_DIR   data folder, default run/pg in the project (holds data/, sock/, postgres.log)
#   GEOLOG_PG_PORT  TCP port on 127.0.0.1, default 55432
#   GEOLOG_PG_BIN   PostgreSQL binaries, default /usr/lib/postgresql/15/bin
#   GEOLOG_PG_GEOLOG a geolog binary to make the TLS certificate with
#                   (default bin/geolog, else one built from this checkout)
#
# As root the server runs as the postgres user (runuser); the binaries are
# installed with apt-get only when they are missing. TCP connections must
# use TLS (hostssl only): the server's certificate comes from a development
# CA of its own under $GEOLOG_PG_DIR/tls (made on first start with `geolog
# certs`, built from this checkout), and the URL printed asks for
# sslmode=verify-full against that CA. Trust authentication over TLS on
# 127.0.0.1 and a private socket folder: this instance is for local use only.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${GEOLOG_PG_PORT:-55432}
PGBIN=${GEOLOG_PG_BIN:-/usr/lib/postgresql/15/bin}
die() { echo "pg.sh: $*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

# The data folder. As root the server runs as postgres, which must be able to
# reach it: when the project sits where postgres cannot go (a clone under
# /root, say), the default moves to /var/tmp, one folder per project path.
PGDIR=${GEOLOG_PG_DIR:-$ROOT/run/pg}
if [ -z "${GEOLOG_PG_DIR:-}" ] && is_root && id postgres >/dev/null 2>&1 &&
	! runuser -u postgres -- test -x "$ROOT" 2>/dev/null; then
	PGDIR=/var/tmp/geolog-pg-$(printf %s "$ROOT" | cksum | cut -d' ' -f1)
fi
DATA=$PGDIR/data
SOCK=$PGDIR/sock
LOG=$PGDIR/postgres.log
TLS=$PGDIR/tls
URL="postgres://postgres@127.0.0.1:$PORT/postgres?sslmode=verify-full&sslrootcert=$TLS/ca.crt"

# as_pg runs a PostgreSQL binary as the user that owns the cluster.
as_pg() {
	if is_root; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

ensure_binaries() {
	if [ -x "$PGBIN/initdb" ] && [ -x "$PGBIN/pg_ctl" ]; then
		return
	fi
	is_root || die "PostgreSQL binaries not found in $PGBIN; install PostgreSQL 15 (apt-get install postgresql) or set GEOLOG_PG_BIN"
	echo "pg.sh: installing postgresql with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq postgresql >&2
	[ -x "$PGBIN/initdb" ] || die "apt-get installed postgresql but $PGBIN/initdb is missing (another major version?); set GEOLOG_PG_BIN"
}

ensure_user() {
	is_root || return 0
	if ! id postgres >/dev/null 2>&1; then
		useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
	fi
}

# ensure_tls makes the server's certificate once: a CA of its own, and a
# server certificate for 127.0.0.1 and localhost (no geolog identity).
ensure_tls() {
	if [ -f "$TLS/ca.crt" ] && [ -f "$TLS/server.crt" ] && [ -f "$TLS/server.key" ]; then
		return
	fi
	# A geolog that has the certs command: GEOLOG_PG_GEOLOG, bin/geolog,
	# else one built from this checkout.
	local geolog
	for geolog in "${GEOLOG_PG_GEOLOG:-}" "$ROOT/bin/geolog" ""; do
		[ -n "$geolog" ] && "$geolog" certs create-server --help >/dev/null 2>&1 && break
	done
	if [ -z "$geolog" ]; then
		geolog=$PGDIR/.bin/geolog
		echo "pg.sh: building geolog for its certs command" >&2
		(cd "$ROOT" && go build -o "$geolog" ./cmd/geolog) >&2 || die "cannot build geolog for its certs command"
	fi
	rm -rf "$TLS"
	"$geolog" certs create-ca --certs-dir "$TLS/ca" --name "geolog pg.sh CA" >/dev/null
	"$geolog" certs create-server --certs-dir "$TLS" --ca-cert "$TLS/ca/ca.crt" --ca-key "$TLS/ca/ca.key" 127.0.0.1 localhost >/dev/null
	if is_root; then
		chown -R postgres: "$TLS" # the server reads its key (0600); root reads anything
	fi
}

# write_hba allows local sockets, and TCP from loopback with TLS only.
write_hba() {
	as_pg tee "$DATA/pg_hba.conf" >/dev/null <<-EOF
		# Written by scripts/pg.sh at every start: TCP needs TLS (hostssl).
		local   all all              trust
		hostssl all all 127.0.0.1/32 trust
		hostssl all all ::1/128      trust
	EOF
}

running() {
	[ -f "$DATA/PG_VERSION" ] || return 1
	as_pg "$PGBIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1
}

start() {
	ensure_binaries
	ensure_user
	mkdir -p "$PGDIR"
	# One starter at a time: concurrent test processes may all call start.
	exec 9>"$PGDIR/.lock"
	flock 9
	if running; then
		if [ -f "$TLS/server.crt" ]; then
			echo "$URL"
			return
		fi
		# Started by a pg.sh from before TLS: the URL printed would fail.
		echo "pg.sh: restarting the running server to serve TLS" >&2
		stop
	fi
	if is_root; then
		chown postgres: "$PGDIR"
		runuser -u postgres -- test -w "$PGDIR" ||
			die "$PGDIR is not reachable by the postgres user; set GEOLOG_PG_DIR to a folder it can reach"
	fi
	if [ ! -f "$DATA/PG_VERSION" ]; then
		rm -rf "$DATA"
		as_pg mkdir -p "$DATA"
		as_pg "$PGBIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$PGDIR/initdb.log" 2>&1 ||
			{ cat "$PGDIR/initdb.log" >&2; die "initdb failed"; }
	fi
	as_pg mkdir -p "$SOCK"
	ensure_tls
	write_hba
	# 9>&-: the server must not inherit the lock, or it would hold it forever.
	if ! as_pg "$PGBIN/pg_ctl" start -D "$DATA" -l "$LOG" -w -t 60 -o \
		"-p $PORT -k $SOCK -c listen_addresses=127.0.0.1 -c max_connections=300 -c max_pred_locks_per_transaction=256 -c ssl=on -c ssl_cert_file=$TLS/server.crt -c ssl_key_file=$TLS/server.key" >/dev/null 9>&-; then
		tail -n 30 "$LOG" >&2 || true
		die "pg_ctl start failed (is port $PORT in use? set GEOLOG_PG_PORT)"
	fi
	echo "$URL"
}

stop() {
	[ -x "$PGBIN/pg_ctl" ] || return 0
	if running; then
		as_pg "$PGBIN/pg_ctl" stop -D "$DATA" -m fast -w -t 60 >/dev/null
	fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status)
	if [ -x "$PGBIN/pg_ctl" ] && running; then
		echo "running $URL"
	else
		echo "stopped"
		exit 3
	fi
	;;
url) echo "$URL" ;;
db)
	name=${2:-}
	[[ $name =~ ^[a-z_][a-z0-9_]*$ ]] || die "db: want a lower-case database name, got '$name'"
	running || die "db: the server is not running (scripts/pg.sh start)"
	if [ "${3:-}" = --fresh ]; then
		PGOPTIONS='-c client_min_messages=warning' as_pg "$PGBIN/psql" -h "$SOCK" -p "$PORT" -U postgres -d postgres -qAt -v ON_ERROR_STOP=1 \
			-c "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null
	fi
	if [ -z "$(as_pg "$PGBIN/psql" -h "$SOCK" -p "$PORT" -U postgres -d postgres -qAt -c "SELECT 1 FROM pg_database WHERE datname = '$name'")" ]; then
		as_pg "$PGBIN/psql" -h "$SOCK" -p "$PORT" -U postgres -d postgres -qAt -v ON_ERROR_STOP=1 -c "CREATE DATABASE $name" >/dev/null
	fi
	echo "${URL/\/postgres\?//$name?}"
	;;
*)
	echo "usage: $0 start|stop|status|url|db NAME [--fresh]" >&2
	exit 2
	;;
esac
