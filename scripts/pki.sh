#!/usr/bin/env bash
# scripts/pki.sh DIR PRINCIPAL REGION=NODES...
#
# A development PKI under DIR, made with `geolog certs` (the binary in
# $GEOLOG, default bin/geolog of this checkout):
#
#   DIR/ca/                 the CA: ca.crt and ca.key (keep the key elsewhere in production)
#   DIR/<region>-n<i>/      node i of each REGION (1..NODES): ca.crt, node.crt, node.key,
#                           for 127.0.0.1 and localhost (geologd --certs-dir)
#   DIR/client/             the client PRINCIPAL: ca.crt, client.crt, client.key
#                           (geolog --certs-dir, GEOLOG_CERTS_DIR)
#
# What exists is kept, so a cluster restarted on its data keeps its
# certificates; remove DIR for new ones. Every file is 0600.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GEOLOG=${GEOLOG:-$ROOT/bin/geolog}
(($# >= 3)) || { echo "usage: $0 DIR PRINCIPAL REGION=NODES..." >&2; exit 2; }
dir=$1 principal=$2
shift 2
[[ -x $GEOLOG ]] || { echo "pki.sh: $GEOLOG is not an executable (make build)" >&2; exit 1; }
ca=(--ca-cert "$dir/ca/ca.crt" --ca-key "$dir/ca/ca.key")
[[ -f $dir/ca/ca.key ]] || "$GEOLOG" certs create-ca --certs-dir "$dir/ca" --name "geolog development CA" >/dev/null
for spec in "$@"; do
	region=${spec%%=*} nodes=${spec#*=}
	[[ $nodes =~ ^[0-9]+$ && $region != "$spec" ]] || { echo "pki.sh: want REGION=NODES, got $spec" >&2; exit 2; }
	for ((i = 1; i <= nodes; i++)); do
		d=$dir/$region-n$i
		[[ -f $d/node.crt ]] || "$GEOLOG" certs create-node --certs-dir "$d" "${ca[@]}" --region "$region" --node-id "$i" 127.0.0.1 localhost >/dev/null
	done
done
[[ -f $dir/client/client.crt ]] || "$GEOLOG" certs create-client --certs-dir "$dir/client" "${ca[@]}" "$principal" >/dev/null
