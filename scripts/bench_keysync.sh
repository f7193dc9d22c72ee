#!/usr/bin/env bash
# make bench-keysync: the per-key sync figures of issue 16. One
# conversation of 100 records is synced from offset 0 on a range of
# RECORDS records (default 10 million, 100-byte messages in batches of 100,
# conversations spread over the whole range; internal/keysync), with the
# key index and by a full scan: through the segment store alone
# (BenchmarkKeySync*, package segment) and through a node's Read RPC over
# loopback gRPC (BenchmarkKeySyncRPC*, package regionsvc). Page cache warm.
# Each range (about 1.3 GB) is built under run/keysync and removed at the
# end. SYNCS syncs per figure, SCANS full scans.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
RECORDS=${RECORDS:-10000000}
SYNCS=${SYNCS:-2000}
SCANS=${SCANS:-1}
DIR=$PWD/run/keysync
rm -rf "$DIR"; mkdir -p "$DIR"
trap 'rm -rf "$DIR"' EXIT
OUT=$DIR/out.txt

bench() { # package benchmark count dir
	$GO test -run '^$' -bench "^$2\$" -benchtime "$3x" -timeout 90m "$1" \
		-args -keysync.records="$RECORDS" -keysync.dir="$4" | tee -a "$OUT"
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
bench ./segment BenchmarkKeySync "$SYNCS" "$DIR/store"
bench ./segment BenchmarkKeySyncScan "$SCANS" "$DIR/store"
rm -rf "$DIR/store"
bench ./regionsvc BenchmarkKeySyncRPC "$SYNCS" "$DIR/node"
bench ./regionsvc BenchmarkKeySyncRPCScan "$SCANS" "$DIR/node"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
echo
echo "per-key sync, one conversation of 100 records, range of $RECORDS records:"
grep -hE '^ +keysync_bench_test.go:[0-9]+: [0-9]+ (syncs|full scans|Read RPCs)' "$OUT" | sed 's/^ *keysync_bench_test.go:[0-9]*: /  /'
