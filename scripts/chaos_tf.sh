#!/usr/bin/env bash
# scripts/chaos_tf.sh: make chaos through terraform/local. Applies one
# cluster for every scenario (R regions x M nodes, homing with a short
# lease, failpoints, and chaos_links: the Raft links inside each region,
# a client link to every node and each region's lease-store link through
# the WAN emulator), runs geolog-chaos attached to the env file terraform
# writes, and destroys the cluster whatever happened. The exit status is
# geolog-chaos's (a failed apply or destroy makes it 1).
#
#   scripts/chaos_tf.sh [geolog-chaos flags...]
#
# Environment (defaults in brackets):
#   TERRAFORM            the terraform binary [terraform on PATH, else .bin/terraform]
#   CHAOS_TF_DIR         state, TF_DATA_DIR and the cluster's run folder [run/chaos/tf]
#   CHAOS_TF_BASE_PORT   the module's base_port [7700: the plan takes 7700-7767 for 3x3]
#   CHAOS_TF_REGIONS     [us,eu,ap]     CHAOS_TF_NODES  [3]
#   CHAOS_TF_LATENCY     WAN latency of every pair [20ms]; CHAOS_TF_JITTER [2ms]
#   CHAOS_TF_LEASE_TTL   [3s]  CHAOS_TF_LEASE_HEARTBEAT [1s]  CHAOS_TF_MAX_CLOCK_OFFSET [250ms]
#   CHAOS_TF_KEEP=1      leave the cluster up after the run (make tf-down does not know
#                        it: destroy it with this script's state, see the end of the log)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

TERRAFORM=${TERRAFORM:-$(command -v terraform || echo "$ROOT/.bin/terraform")}
DIR=${CHAOS_TF_DIR:-$ROOT/run/chaos/tf}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
STATE=$DIR/terraform.tfstate
VARS=$DIR/chaos.tfvars.json
export TF_DATA_DIR=$DIR/.terraform TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1

[[ -x $TERRAFORM ]] || { echo "chaos_tf.sh: no terraform ($TERRAFORM): make terraform" >&2; exit 1; }

regions_json=$(echo "${CHAOS_TF_REGIONS:-us,eu,ap}" | sed 's/[^,][^,]*/"&"/g')
cat >"$VARS" <<EOF
{
  "regions": [$regions_json],
  "nodes_per_region": ${CHAOS_TF_NODES:-3},
  "base_port": ${CHAOS_TF_BASE_PORT:-7700},
  "data_dir": "$DIR/run",
  "latency_default": "${CHAOS_TF_LATENCY:-20ms}",
  "latencies": {},
  "jitter": "${CHAOS_TF_JITTER:-2ms}",
  "lease_store": true,
  "lease_ttl": "${CHAOS_TF_LEASE_TTL:-3s}",
  "lease_heartbeat": "${CHAOS_TF_LEASE_HEARTBEAT:-1s}",
  "max_clock_offset": "${CHAOS_TF_MAX_CLOCK_OFFSET:-250ms}",
  "debug_failpoints": true,
  "cursor_compaction_lag": "1h",
  "chaos_links": true,
  "client_latency": "10ms",
  "start_timeout_seconds": 90,
  "stop_timeout_seconds": 10
}
EOF

tf() { "$TERRAFORM" -chdir="$ROOT/terraform/local" "$@"; }

destroy() {
	echo "chaos_tf.sh: terraform destroy" >&2
	tf destroy -auto-approve -input=false -no-color -state="$STATE" -var-file="$VARS" >"$DIR/destroy.log" 2>&1 ||
		{ echo "chaos_tf.sh: destroy failed ($DIR/destroy.log)" >&2; tail -20 "$DIR/destroy.log" >&2; return 1; }
}

echo "chaos_tf.sh: terraform apply ($VARS)" >&2
if ! tf init -input=false -no-color >"$DIR/init.log" 2>&1; then
	tail -20 "$DIR/init.log" >&2
	exit 1
fi
if ! tf apply -auto-approve -input=false -no-color -state="$STATE" -var-file="$VARS" >"$DIR/apply.log" 2>&1; then
	echo "chaos_tf.sh: apply failed ($DIR/apply.log)" >&2
	tail -30 "$DIR/apply.log" >&2
	destroy
	exit 1
fi
env_file=$(tf output -state="$STATE" -raw env_file 2>/dev/null)
echo "chaos_tf.sh: cluster up, env file $env_file" >&2

rc=0
bin/geolog-chaos --env "$env_file" "$@" || rc=$?

if [[ ${CHAOS_TF_KEEP:-} == 1 ]]; then
	echo "chaos_tf.sh: cluster left up; destroy: TF_DATA_DIR=$TF_DATA_DIR $TERRAFORM -chdir=terraform/local destroy -auto-approve -state=$STATE -var-file=$VARS" >&2
else
	destroy || { ((rc == 0)) && rc=1; }
fi
exit "$rc"
