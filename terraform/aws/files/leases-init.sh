#!/bin/bash
# geolog-leases-init.service (first CockroachDB node of the first region
# only; installed by templates/cockroach.yaml.tftpl). Idempotent: it runs
# at every boot of that node and each step tolerates having run before.
#
#  1. cockroach init, once every node has had time to start;
#  2. wait until a node of every region has joined (a database region must
#     be a live locality);
#  3. /etc/cockroach/leases-db.sql: the lease database with its primary
#     region, regions and survival goal; the geolog user and its grants;
#  4. wait until geologd's migrations (homing.OpenSQL) have created the
#     lease tables, then /etc/cockroach/leases-locality.sql: liveness
#     REGIONAL BY ROW, the rest GLOBAL (README.md says why).
#
# /etc/cockroach/leases.env sets COCKROACH_HOST, REGION_COUNT and
# LEASE_DATABASE.
set -euo pipefail
. /etc/cockroach/leases.env
CERTS=/var/lib/cockroach/certs
sql() { /usr/local/bin/cockroach sql --certs-dir="$CERTS" --host="$COCKROACH_HOST" "$@"; }
scalar() { sql --format=csv "$@" | tail -n 1; }

until out=$(/usr/local/bin/cockroach init --certs-dir="$CERTS" --host="$COCKROACH_HOST" 2>&1) ||
	grep -q "already been initialized" <<<"$out"; do
	echo "leases-init: cockroach init: $out (retrying)" >&2
	sleep 5
done
echo "leases-init: cluster initialized"

until [[ $(scalar -e 'SELECT count(*) FROM [SHOW REGIONS FROM CLUSTER]' 2>/dev/null) == "$REGION_COUNT" ]]; do
	echo "leases-init: waiting for nodes in all $REGION_COUNT regions" >&2
	sleep 5
done

sql -f /etc/cockroach/leases-db.sql
echo "leases-init: database $LEASE_DATABASE ready"

tables="'liveness', 'regions', 'range_homes', 'range_epochs'"
until [[ $(scalar -d "$LEASE_DATABASE" -e "SELECT count(*) FROM [SHOW TABLES] WHERE table_name IN ($tables)" 2>/dev/null) == 4 ]]; do
	echo "leases-init: waiting for geologd to create the lease tables" >&2
	sleep 10
done
sql -d "$LEASE_DATABASE" -f /etc/cockroach/leases-locality.sql
echo "leases-init: table localities set"
